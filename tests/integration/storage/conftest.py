"""The storage layer against a real S3 server (moto) and a fault proxy, both on 127.0.0.1.

The tests talk to the loopback S3 server of tests/support/s3.py through the real code path
(pyarrow's S3 client), offline, in seconds. Retries back off in milliseconds here
(``fast_retries``), so a test of five failures in a row costs no real backoff.
"""

import os

import pytest
from support.s3 import s3, s3_faulty, s3_proxy, s3_server  # noqa: F401 - fixtures for these tests

from packfeed.service.inputs.disk_cache import DIR_ENV
from packfeed.service.inputs.read_cache import reset_shared_caches
from packfeed.service.cluster import raycluster
from packfeed.service.packjob import head_start
from packfeed.service.storage import RetryPolicy, set_policy

FAST = RetryPolicy(budget_s=2.0, num_connect_attempts=3, base_delay_s=0.005, max_delay_s=0.05)


@pytest.fixture
def driver_alone(monkeypatch):
    """``packfeed pack`` in this process packed by its driver alone, as a small pack in a process of
    its own is: no Ray starts (one would fail the test), the policy and the proxy are this process's."""
    monkeypatch.setattr(raycluster, "ray_initialised", lambda: False)  # as in a process of its own
    monkeypatch.setattr(head_start, "RAY_START_S", 1e6)  # the driver packs alone: no Ray
    monkeypatch.setattr(raycluster, "init_ray", lambda *a, **k: pytest.fail("no Ray for this run"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.fixture(autouse=True)
def fast_retries():
    previous = set_policy(FAST)
    yield FAST
    set_policy(previous)


@pytest.fixture(scope="session", autouse=True)
def read_cache_directory(tmp_path_factory):
    """The node's disk cache of input bytes (inputs/disk_cache.py) in a directory of this session
    (of this xdist worker), set before any Ray starts: its packing actors share it."""
    saved = os.environ.get(DIR_ENV)
    os.environ[DIR_ENV] = str(tmp_path_factory.mktemp("read-cache"))
    yield
    if saved is None:
        os.environ.pop(DIR_ENV, None)
    else:
        os.environ[DIR_ENV] = saved


@pytest.fixture(autouse=True)
def fresh_read_caches(read_cache_directory):
    """Each test counts its own requests: none of its reads served from bytes an earlier test
    read (inputs/read_cache.py: this process's memory, the node's disk)."""
    reset_shared_caches(clear_disk=True)
    yield
    reset_shared_caches(clear_disk=True)
