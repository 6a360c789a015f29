"""The storage layer against a real S3 server (moto) and a fault proxy, both on 127.0.0.1.

The tests talk to the loopback S3 server of tests/support/s3.py through the real code path
(pyarrow's S3 client), offline, in seconds. Retries back off in milliseconds here
(``fast_retries``), so a test of five failures in a row costs no real backoff.
"""

import pytest
from support.s3 import s3, s3_faulty, s3_proxy, s3_server  # noqa: F401 - fixtures for these tests

from packfeed.service.storage import RetryPolicy, set_policy

FAST = RetryPolicy(budget_s=2.0, num_connect_attempts=3, base_delay_s=0.005, max_delay_s=0.05)


@pytest.fixture(autouse=True)
def fast_retries():
    previous = set_policy(FAST)
    yield FAST
    set_policy(previous)
