"""How many requests one process sends to one store at once: fewer while the store throttles.

An AIMD limit, shared by every thread of the process that asks the same store (a bucket, or an
account/container: ``store_of``): a request takes a slot before each attempt and gives it back
after it, so a retry waiting out its backoff holds none. A throttled answer halves the limit,
of the requests in flight then (a limit above what is in flight would slow nothing); each
success adds one back, up to ``max_in_flight``; the limit never falls below 1. One halving per
round: a throttled answer to a request sent before the last halving does not halve again, so
eight readers throttled at once halve the limit once, not eight times (as TCP halves its window
once per round trip).

For 8 threads reading one bucket, limit 64: a SlowDown answer with 8 in flight halves it to 4
(4 in flight at most), a SlowDown to a request sent after that to 2; then each success adds one
back (3, 4, ... up to 64 while the store answers). Measured (tests/unit/service/storage/
test_limiter.py: 8 threads, 96 reads, a stand-in store that throttles beyond 2 in flight):
89-122 SlowDowns with the limiter, 404-480 with a limit that never falls.

The first attempt of a request waits for a slot as long as it takes (the requests holding the
slots end within their timeouts); a retry waits within its budget (retry.py).
"""

from __future__ import annotations

import threading

from packfeed.service.storage.uri import split

SUCCEEDED, SLOW_DOWN, FAILED = "succeeded", "slow down", "failed"  # outcomes of an attempt


class AimdLimiter:
    """At most ``limit`` requests in flight (``acquire``/``release``); ``1 <= limit <= max_in_flight``."""

    def __init__(self, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._cond = threading.Condition()
        self._limit = max_in_flight
        self._in_flight = 0
        self._round = 0  # +1 at each halving: a slot taken before it cannot halve again
        self.lowest = max_in_flight  # the lowest limit so far
        self.halvings = 0  # times the limit was lowered

    @property
    def limit(self) -> int:
        with self._cond:
            return self._limit

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._in_flight

    def acquire(self, timeout_s: float | None = None) -> int | None:
        """Wait for a slot (at most ``timeout_s``; None: as long as it takes): a token for
        ``release``, or None when none came in time."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._in_flight < self._limit, timeout_s):
                return None
            self._in_flight += 1
            return self._round

    def release(self, token: int, outcome: str) -> None:
        """Give back the slot ``acquire`` gave, with what the attempt got (``SUCCEEDED``,
        ``SLOW_DOWN``: a throttling answer, or ``FAILED``: any other failure, which leaves the
        limit as it is)."""
        with self._cond:
            in_flight_then = self._in_flight
            self._in_flight -= 1
            if outcome == SLOW_DOWN and token == self._round:
                halved = max(1, min(self._limit, in_flight_then) // 2)
                self.halvings += halved < self._limit
                self._limit = halved
                self._round += 1
                self.lowest = min(self.lowest, halved)
            elif outcome == SUCCEEDED and self._limit < self.max_in_flight:
                self._limit += 1
            self._cond.notify_all()


_limiters: dict[str, AimdLimiter] = {}
_lock = threading.Lock()


def store_of(uri: str) -> str:
    """The store a URI's requests share a limit on: ``s3://b/k/x`` -> ``s3://b``."""
    scheme, authority, _ = split(uri)
    return f"{scheme}://{authority.rpartition('@')[2]}"


def limiter_for(uri: str, max_in_flight: int) -> AimdLimiter:
    """This process's limiter for the store of ``uri`` (a new one when ``max_in_flight`` changed)."""
    store = store_of(uri)
    with _lock:
        limiter = _limiters.get(store)
        if limiter is None or limiter.max_in_flight != max_in_flight:
            limiter = _limiters[store] = AimdLimiter(max_in_flight)
        return limiter
