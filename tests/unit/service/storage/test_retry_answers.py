"""A store that answers "no such object" (or bucket) answered: the request is counted, not as
failed. A clean ``pack`` to S3 asks for objects that do not exist yet on purpose (the kept scan,
files.json, config.json) and its report said "(0 retried, 1 failed)". Backend exceptions are
raised by stand-ins here: no store, no socket."""

from __future__ import annotations

import pytest

from packfeed.service.storage import COUNTERS, RetryPolicy, StorageError, set_policy
from packfeed.service.storage.store_errors import DENIED, NO_BUCKET, NOT_FOUND
from packfeed.service.storage.retry import call


@pytest.fixture(autouse=True)
def no_backoff(fake_time):
    previous = set_policy(RetryPolicy(budget_s=2.5, base_delay_s=0.0, max_delay_s=0.0))
    yield fake_time
    set_policy(previous)


def raising(exc: BaseException, clock=None):
    def fn():
        if clock is not None:
            clock.spend(1.0)  # a request takes a second
        raise exc
    return fn


@pytest.mark.parametrize("exc, kind, failures", [
    pytest.param(FileNotFoundError("no such key"), NOT_FOUND, 0, id="no-such-object-is-an-answer"),
    pytest.param(OSError("AWS Error NO_SUCH_BUCKET during HeadBucket operation: The specified bucket does not "
                         "exist"), NO_BUCKET, 0, id="no-such-bucket-is-an-answer"),
    pytest.param(PermissionError("AccessDenied"), DENIED, 1, id="denied-fails"),
])
def test_what_counts_as_a_failed_request(exc, kind, failures):
    before = COUNTERS.snapshot()
    with pytest.raises(StorageError) as error:
        call("s3://b/k", "open", raising(exc), scheme="s3")
    delta = COUNTERS.snapshot() - before
    assert error.value.kind == kind
    assert (delta.requests, delta.retries, delta.failures) == (1, 0, failures)


def test_retries_spent_are_a_failure(no_backoff):
    before = COUNTERS.snapshot()
    with pytest.raises(StorageError):  # attempts at 0, 1 and 2 s of a 2.5 s budget
        call("s3://b/k", "read", raising(ConnectionResetError("reset"), no_backoff), scheme="s3")
    delta = COUNTERS.snapshot() - before
    assert (delta.requests, delta.retries, delta.failures) == (3, 2, 1)
