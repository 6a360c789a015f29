"""Unit tests are pure: starting Ray or opening a socket here fails loudly.

Tests that need real components (Ray, a server on 127.0.0.1, an S3 server) belong in
tests/integration. The folders mirror the packages: client/, service/<stage>/, trainer/, deploy/.
"""

import socket

import pytest


def _refuse(*args, **kwargs):
    raise RuntimeError("unit tests must not start Ray or open sockets: move this test to tests/integration")


@pytest.fixture(autouse=True)
def _pure_unit_tests(monkeypatch):
    monkeypatch.setattr(socket.socket, "bind", _refuse)
    monkeypatch.setattr(socket.socket, "connect", _refuse)
    monkeypatch.setattr("ray.init", _refuse, raising=False)
