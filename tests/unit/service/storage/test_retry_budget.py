"""``retry.call`` on a fake clock: transient failures retried for the budget of time, every
attempt counted, permanent ones raised on the first answer. Backend exceptions come from
stand-ins (the texts pyarrow raises); no store, no socket, no real waiting."""

from __future__ import annotations

import random

import pytest

from packfeed.service.storage import COUNTERS, RetryPolicy, StorageError, set_policy
from packfeed.service.storage.retry import call, current_policy
from packfeed.service.storage.store_errors import DENIED, INVALID, NO_BUCKET, NOT_FOUND, UNREACHABLE

SLOW_DOWN = OSError("When reading information for key 'k' in bucket 'b': AWS Error SLOW_DOWN during GetObject "
                    "operation: Please reduce your request rate.")
RESET = OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 56, Failure when receiving "
                "data from the peer")
INTERNAL = OSError("AWS Error INTERNAL_FAILURE during GetObject operation: We encountered an internal error.")
REFUSED = OSError("AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect to "
                  "server; Details: Failed to connect to 127.0.0.1 port 9 after 0 ms: Couldn't connect to server")
PERMANENT = [
    pytest.param(PermissionError("AccessDenied"), DENIED, 1, id="denied"),
    pytest.param(OSError("AWS Error ACCESS_DENIED during GetObject operation: Access Denied"), DENIED, 1,
                 id="denied-by-code"),
    pytest.param(FileNotFoundError("no such key"), NOT_FOUND, 0, id="no-such-key"),
    pytest.param(OSError("AWS Error NO_SUCH_BUCKET during HeadBucket operation: The specified bucket does not "
                         "exist"), NO_BUCKET, 0, id="no-such-bucket"),
    pytest.param(OSError("AWS Error INVALID_BUCKET_NAME during HeadBucket operation"), INVALID, 1, id="bad-name"),
]


@pytest.fixture
def policy():
    chosen = RetryPolicy(budget_s=120.0, base_delay_s=0.25, max_delay_s=20.0)
    previous = set_policy(chosen)
    yield chosen
    set_policy(previous)


class Store:
    """A request that fails with ``failures[i]`` on attempt i (then answers ``b"ok"``), each
    attempt taking ``seconds``; it records when each attempt started."""

    def __init__(self, clock, failures, seconds: float = 0.05) -> None:
        self.clock, self.failures, self.seconds = clock, list(failures), seconds
        self.starts: list[float] = []

    def __call__(self) -> bytes:
        self.starts.append(self.clock.now)
        self.clock.spend(self.seconds)
        if len(self.starts) <= len(self.failures):
            raise self.failures[len(self.starts) - 1]
        return b"ok"


@pytest.mark.parametrize("budget_s", [0.5, 3.0, 120.0, 900.0])
@pytest.mark.parametrize("seconds", [0.0, 0.05, 2.0])
@pytest.mark.parametrize("failure", [SLOW_DOWN, RESET, INTERNAL], ids=["throttled", "reset", "5xx"])
def test_a_store_failing_throughout_is_retried_for_the_budget_then_fails(fake_time, budget_s, seconds, failure):
    previous = set_policy(RetryPolicy(budget_s=budget_s))
    store = Store(fake_time, [failure] * 100_000, seconds)
    before = COUNTERS.snapshot()
    try:
        with pytest.raises(StorageError) as error:
            call("s3://b/k", "read", store, scheme="s3")
    finally:
        set_policy(previous)
    attempts = len(store.starts)
    # no attempt starts after the budget; the call ends within it plus one attempt's time
    assert max(store.starts) <= budget_s + 1e-9 and fake_time.now <= budget_s + seconds + 1e-9
    assert all(0 <= s <= RetryPolicy().max_delay_s for s in fake_time.sleeps) and len(fake_time.sleeps) == attempts - 1
    assert attempts >= 2 or seconds >= budget_s  # an attempt longer than the budget leaves none for a retry
    assert attempts > 6 or budget_s < 10 or seconds >= 2.0
    delta = COUNTERS.snapshot() - before
    throttled = attempts if failure is SLOW_DOWN else 0
    assert (delta.requests, delta.retries, delta.failures, delta.throttled) == (attempts, attempts - 1, 1, throttled)
    assert abs(delta.backoff_ms - 1000 * sum(fake_time.sleeps)) <= attempts  # rounded to the ms per retry
    assert str(error.value).startswith(f"s3://b/k: read failed {attempts} times in a row over ")
    assert f"giving up: the retry budget is {budget_s:g} s (PACKFEED_STORAGE_RETRY_S)" in str(error.value)


@pytest.mark.parametrize("failures", [1, 5, 6, 12, 25])
def test_a_burst_of_throttling_and_resets_is_outlasted(fake_time, failures):
    """More failures in a row than the old count of 6 allowed: the read still answers."""
    previous = set_policy(RetryPolicy(budget_s=120.0, max_delay_s=4.0))  # 25 retries fit in 2 minutes
    rng = random.Random(failures)
    store = Store(fake_time, [rng.choice([SLOW_DOWN, RESET]) for _ in range(failures)])
    before = COUNTERS.snapshot()
    try:
        assert call("s3://b/k", "read", store, scheme="s3") == b"ok"
    finally:
        set_policy(previous)
    delta = COUNTERS.snapshot() - before
    assert (delta.requests, delta.retries, delta.failures) == (failures + 1, failures, 0)
    assert delta.throttled == sum(f is SLOW_DOWN for f in store.failures)


@pytest.mark.parametrize(("exc", "kind", "failed"), PERMANENT)
def test_a_permanent_error_fails_on_its_first_answer(fake_time, policy, exc, kind, failed):
    store = Store(fake_time, [exc])
    before = COUNTERS.snapshot()
    with pytest.raises(StorageError) as error:
        call("s3://b/k", "read", store, scheme="s3")
    delta = COUNTERS.snapshot() - before
    assert error.value.kind == kind and len(store.starts) == 1 and fake_time.sleeps == []
    assert (delta.requests, delta.retries, delta.failures, delta.throttled) == (1, 0, failed, 0)


def test_a_permanent_error_after_throttling_ends_the_retries_at_once(fake_time, policy):
    store = Store(fake_time, [SLOW_DOWN, SLOW_DOWN, PermissionError("AccessDenied")])
    with pytest.raises(StorageError) as error:
        call("s3://b/k", "read", store, scheme="s3")
    assert error.value.kind == DENIED and len(store.starts) == 3 and len(fake_time.sleeps) == 2


def test_no_connection_at_all_is_retried_by_count_not_for_the_budget(fake_time, policy):
    store = Store(fake_time, [REFUSED] * 100)
    with pytest.raises(StorageError) as error:
        call("s3://b/k", "open", store, scheme="s3")
    assert error.value.kind == UNREACHABLE and len(store.starts) == policy.num_connect_attempts
    assert "cannot reach the store after 3 attempt(s)" in str(error.value) and fake_time.now < 1.0


def test_a_budget_of_zero_never_retries(fake_time):
    previous = set_policy(RetryPolicy(budget_s=0.0))
    store = Store(fake_time, [SLOW_DOWN])
    try:
        with pytest.raises(StorageError, match="read failed 1 times in a row over 0.1 s"):
            call("s3://b/k", "read", store, scheme="s3")
    finally:
        set_policy(previous)
    assert len(store.starts) == 1


def test_a_local_call_is_tried_once_and_not_counted(fake_time, policy):
    store = Store(fake_time, [RESET])
    before = COUNTERS.snapshot()
    with pytest.raises(StorageError, match=r"^/tmp/x: read failed 1 times in a row, giving up"):
        call("/tmp/x", "read", store, scheme="", remote=False)
    assert COUNTERS.snapshot() == before and len(store.starts) == 1


def test_the_environment_sets_the_default_budget_and_set_policy_overrides_it(monkeypatch):
    previous = set_policy(None)
    try:
        monkeypatch.setenv("PACKFEED_STORAGE_RETRY_S", "300")
        assert current_policy().budget_s == 300.0
        monkeypatch.delenv("PACKFEED_STORAGE_RETRY_S")
        assert current_policy() == RetryPolicy()
        monkeypatch.setenv("PACKFEED_STORAGE_RETRY_S", "soon")
        with pytest.raises(ValueError, match=r"PACKFEED_STORAGE_RETRY_S='soon'"):
            current_policy()
        set_policy(RetryPolicy(budget_s=7.0))
        assert current_policy().budget_s == 7.0
    finally:
        set_policy(previous)
