"""The backoff schedule and its budget, over sweeps of policies: pure arithmetic, no waiting."""

from __future__ import annotations

import itertools
import random

import pytest

from packfeed.service.storage.backoff import RETRY_ENV, RetryPolicy, policy_from_env

POLICIES = [RetryPolicy(budget_s=budget, base_delay_s=base, max_delay_s=cap)
            for budget, base, cap in itertools.product([0.0, 0.3, 5.0, 120.0, 3600.0], [0.0, 0.001, 0.25, 1.0],
                                                       [1.0, 8.0, 20.0])
            if base <= cap]


@pytest.mark.parametrize(("retry", "ceiling"), [(1, 0.25), (2, 0.5), (3, 1.0), (6, 8.0), (7, 16.0), (8, 20.0),
                                                (9, 20.0), (10_000, 20.0)])
def test_the_default_ceilings_double_up_to_the_cap(retry, ceiling):
    assert RetryPolicy().ceiling_s(retry) == ceiling


def test_ceilings_never_pass_the_cap_and_never_shrink():
    for policy in POLICIES:
        ceilings = [policy.ceiling_s(k) for k in range(1, 200)]
        assert all(0 <= c <= policy.max_delay_s for c in ceilings)
        assert ceilings == sorted(ceilings)
        assert ceilings[0] == policy.base_delay_s
        if policy.base_delay_s > 0:
            assert ceilings[-1] == policy.max_delay_s  # the cap is reached, not overflowed


def test_full_jitter_stays_within_and_covers_zero_to_the_ceiling():
    rng = random.Random(1)
    for policy in POLICIES:
        for retry in (1, 2, 5, 30):
            ceiling = policy.ceiling_s(retry)
            delays = [policy.delay_s(retry, rng) for _ in range(400)]
            assert all(0 <= d <= ceiling for d in delays)
            if ceiling > 0:  # full jitter: near 0 and near the ceiling both occur (equal jitter never waits < c/2)
                assert min(delays) < 0.05 * ceiling and max(delays) > 0.95 * ceiling


def test_a_wait_never_ends_past_the_budget_and_a_spent_budget_gives_up():
    rng = random.Random(2)
    for policy in POLICIES:
        for _ in range(200):
            retry = rng.randrange(1, 40)
            elapsed = rng.choice([0.0, rng.uniform(0, policy.budget_s * 1.2), policy.budget_s])
            wait = policy.wait_s(retry, elapsed, rng)
            if elapsed >= policy.budget_s:
                assert wait is None
            else:
                assert wait is not None and 0 <= wait <= policy.ceiling_s(retry)
                assert elapsed + wait <= policy.budget_s + 1e-9  # to the float's last bit


def test_a_request_throttled_throughout_retries_for_its_budget_not_a_count():
    """A simulated request answered SlowDown every time, each answer taking 50 ms: it keeps
    trying until the budget is spent, and the last attempt starts within it."""
    rng = random.Random(3)
    for policy in (RetryPolicy(), RetryPolicy(budget_s=10.0), RetryPolicy(budget_s=600.0, max_delay_s=30.0)):
        for _ in range(20):
            now, starts = 0.0, []
            while True:
                starts.append(now)
                now += 0.05
                wait = policy.wait_s(len(starts), now, rng)
                if wait is None:
                    break
                now += wait
            assert max(starts) <= policy.budget_s + 1e-9 and policy.budget_s < now
            assert len(starts) > 6  # the old count would have given up after 6
    # the module docstring's figure: about 18 attempts in the default 2 minutes
    runs = []
    for _ in range(200):
        now, n = 0.0, 0
        while (wait := RetryPolicy().wait_s(n + 1, now, rng)) is not None:
            n, now = n + 1, now + wait
        runs.append(n + 1)
    assert 14 <= sum(runs) / len(runs) <= 22


@pytest.mark.parametrize(("kwargs", "says"), [
    pytest.param({"budget_s": -1.0}, "budget_s must be >= 0", id="negative-budget"),
    pytest.param({"budget_s": float("nan")}, "budget_s must be >= 0", id="nan-budget"),
    pytest.param({"num_connect_attempts": 0}, "must be at least 1", id="no-connect-attempt"),
    pytest.param({"max_in_flight": 0}, "must be at least 1", id="nothing-in-flight"),
    pytest.param({"base_delay_s": 2.0, "max_delay_s": 1.0}, "base_delay_s (2.0) <= max_delay_s (1.0)", id="base-over-cap"),
])
def test_a_policy_is_checked_when_made(kwargs, says):
    with pytest.raises(ValueError, match=r"^retry policy: .*" + says.replace("(", r"\(").replace(")", r"\)")):
        RetryPolicy(**kwargs)


def test_the_budget_from_the_environment():
    assert policy_from_env({}) == RetryPolicy()
    assert policy_from_env({RETRY_ENV: " 300 "}) == RetryPolicy(budget_s=300.0)
    assert policy_from_env({RETRY_ENV: "0"}).budget_s == 0.0
    for bad in ("two minutes", "-5", "inf", "nan"):
        with pytest.raises(ValueError, match=rf"^\${RETRY_ENV}='{bad}': give the seconds"):
            policy_from_env({RETRY_ENV: bad})
