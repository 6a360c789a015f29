"""How long to wait before retrying a request to a store, and when to stop: a budget of time.

Pure: a policy, a retry number, the seconds spent so far and a random source in; a wait or
"give up" out. retry.py applies it to every request; the unit tests sweep it without waiting.

Capped exponential backoff with full jitter: before retry ``k`` (1 for the first) wait
``uniform(0, min(max_delay_s, base_delay_s * 2**(k-1)))``. Full jitter spreads the retries of
many readers throttled at once over the whole interval instead of sending them back as one
burst (AWS's recommendation for clients sharing a throttled prefix). With the defaults (0.25 s,
20 s) the ceilings are 0.25, 0.5, 1, 2, 4, 8, 16, 20, 20, ... s, the mean waits half that: a
request answered SlowDown throughout makes about 18 attempts in its 2 minutes, 6 of them in
the first 8 s.

The budget (``budget_s``) counts from the start of a request's first attempt: no attempt
starts after it (the last wait is cut to what is left), and a request whose budget is spent
fails. A count of quick retries is the wrong budget for throttling: it is spent in seconds
when many readers share a prefix, while the store asks them to slow down for longer.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, replace
from typing import Mapping

RETRY_ENV = "PACKFEED_STORAGE_RETRY_S"  # the budget of every process that reads a store (seconds)
_MAX_EXPONENT = 62  # 2**62 * any base is past every cap: no overflow on a long run of retries


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How the storage layer retries a request to a remote store (retry.py).

    ``budget_s``: seconds a request keeps retrying throttling, 5xx answers, dropped or stalled
    connections, from its first attempt (``$PACKFEED_STORAGE_RETRY_S`` sets it for a process).
    ``num_connect_attempts``: attempts when no connection is made at all (refused, no such
    host): a wrong endpoint fails in about a second. ``base_delay_s``/``max_delay_s``: the
    backoff's first ceiling and its cap. ``max_in_flight``: requests one process sends to one
    store at once at most; while the store throttles, fewer (limiter.py)."""

    budget_s: float = 120.0
    num_connect_attempts: int = 3
    base_delay_s: float = 0.25
    max_delay_s: float = 20.0
    max_in_flight: int = 64

    def __post_init__(self) -> None:
        if not self.budget_s >= 0:
            raise ValueError(f"retry policy: budget_s must be >= 0 seconds, got {self.budget_s}")
        if self.num_connect_attempts < 1 or self.max_in_flight < 1:
            raise ValueError(f"retry policy: num_connect_attempts ({self.num_connect_attempts}) and "
                             f"max_in_flight ({self.max_in_flight}) must be at least 1")
        if not 0 <= self.base_delay_s <= self.max_delay_s:
            raise ValueError(f"retry policy: need 0 <= base_delay_s ({self.base_delay_s}) <= max_delay_s "
                             f"({self.max_delay_s})")

    def ceiling_s(self, retry: int) -> float:
        """The most retry ``retry`` (1 for the first) waits: 0.25, 0.5, 1, ... up to ``max_delay_s``."""
        return min(self.max_delay_s, self.base_delay_s * 2.0 ** min(retry - 1, _MAX_EXPONENT))

    def delay_s(self, retry: int, rng: random.Random) -> float:
        """A full-jitter wait before retry ``retry``: uniform in ``[0, ceiling_s(retry)]``."""
        return rng.random() * self.ceiling_s(retry)

    def wait_s(self, retry: int, elapsed_s: float, rng: random.Random) -> float | None:
        """The wait before retry ``retry`` of a request whose first attempt started
        ``elapsed_s`` ago, cut so that the retry starts within the budget; None when the
        budget is spent (give up)."""
        left = self.budget_s - elapsed_s
        if left <= 0:
            return None
        return min(self.delay_s(retry, rng), left)


def policy_from_env(environ: Mapping[str, str] = os.environ, base: RetryPolicy = RetryPolicy()) -> RetryPolicy:
    """``base`` with the budget ``$PACKFEED_STORAGE_RETRY_S`` gives, when set: "300" retries
    for 5 minutes a request, "0" never retries (but a refused connection, by count)."""
    text = environ.get(RETRY_ENV, "").strip()
    if not text:
        return base
    try:
        budget = float(text)
    except ValueError:
        budget = float("nan")
    if not 0 <= budget < float("inf"):
        raise ValueError(f"${RETRY_ENV}={text!r}: give the seconds a request to a store may keep retrying, "
                         "a number >= 0 (e.g. 120)")
    return replace(base, budget_s=budget)
