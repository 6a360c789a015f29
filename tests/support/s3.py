"""A real S3 server on loopback, and a proxy in front of it that counts and injects faults.

``S3Server`` runs moto's S3 server (``python -m moto.server``) as a subprocess on
127.0.0.1, a free port; it answers ~0.3 s after the start. Everything packfeed does on a store
goes through the real code path: pyarrow's S3 filesystem, pointed at the server by
``AWS_ENDPOINT_URL``. Test data is put there with boto3, a client independent of the code
under test.

``FaultProxy`` (support/s3_proxy.py) is a counting, fault-injecting proxy in front of it.

Fixtures (import them into a conftest: ``from support.s3 import s3, s3_faulty, ...``):
``s3_server`` and ``s3_proxy`` are session-scoped (one server, one proxy per conftest
that imports them); ``s3`` points the environment at the server directly, ``s3_faulty`` at the
proxy with its record cleared and no fault pending. Both yield the server, whose ``bucket()``
gives a fresh bucket name per call, so tests never see each other's keys.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from support.ports import free_port
from support.s3_proxy import FaultProxy

STARTUP_TIMEOUT_S = 30.0


def _wait_until_answering(url: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the S3 server exited with status {proc.returncode} before answering") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"no answer from {url} within {STARTUP_TIMEOUT_S:.0f} s") from None
            time.sleep(0.02)


def _die_with_parent() -> None:
    """In the server's process: end it when the test process ends, even killed (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class S3Server:
    """moto's S3 server as a subprocess on 127.0.0.1 (``start()``/``stop()``, or ``with``)."""

    def __init__(self) -> None:
        self.port = 0
        self._proc: subprocess.Popen | None = None
        self._names = itertools.count()
        self._client = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "S3Server":
        self.port = free_port()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent,
        )
        _wait_until_answering(f"{self.endpoint}/moto-api/", self._proc)
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def client(self):
        """A boto3 S3 client talking to the server directly (never through the proxy)."""
        if self._client is None:
            import boto3

            self._client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                                        aws_access_key_id="testing", aws_secret_access_key="testing")
        return self._client

    def bucket(self, stem: str = "pf") -> str:
        """A new, empty bucket with a name no other test used."""
        name = f"{stem}-{os.getpid()}-{next(self._names)}"
        self.client.create_bucket(Bucket=name)
        return name

    def put(self, bucket: str, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)
        return f"s3://{bucket}/{key}"

    def upload_tree(self, local_dir: str | Path, bucket: str, prefix: str = "") -> list[str]:
        """Put every file under ``local_dir`` at ``prefix`` + its relative path; returns the keys."""
        root = Path(local_dir)
        keys = []
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            key = prefix + path.relative_to(root).as_posix()
            self.put(bucket, key, path.read_bytes())
            keys.append(key)
        return keys

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The environment that points AWS clients at ``endpoint`` (default: this server) with
        dummy credentials, and keeps them off a developer's profile and the EC2 metadata service."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }


# ---- pytest fixtures ----------------------------------------------------------------------------
@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture(scope="session")
def s3_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3_server.port).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The environment points at the S3 server directly."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return s3_server


@pytest.fixture
def s3_faulty(s3_server: S3Server, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The environment points at the proxy (``s3_proxy``: cleared, no fault pending)."""
    for name, value in s3_server.env(s3_proxy.endpoint).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    s3_proxy.reset()
    yield s3_server
    s3_proxy.reset()
