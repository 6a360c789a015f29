"""Retries of remote requests, and the process-wide counts of what was asked of the stores.

Which layer retries what. Measured with pyarrow 26 against moto's S3 server through the fault
proxy of tests/support/s3.py:

- pyarrow's S3FileSystem retries inside one call, as its ``retry_strategy`` says
  (``AwsStandardS3RetryStrategy``, default ``max_attempts=3``): a 503 SlowDown on a LIST or a
  HEAD, a dropped connection (reset, empty reply) on GET, HEAD and LIST, with the SDK's own
  backoff (throttling waits ~1-5 s a retry: 5 SlowDowns in a row cost a LIST 21 s at
  ``max_attempts=6``). It does NOT retry a 503, 500 or 403 answering a ranged GET shorter than
  the error's XML body: the body overflows the read buffer, the status is lost and the call
  fails at once with ``INTERNAL_FAILURE ... Failed to flush response stream``. Its retries are
  invisible to the caller: nothing counts them.
- So the filesystem ``resolve()`` hands out (for direct use: Parquet writers, Ray Train's
  storage) keeps pyarrow's strategy at ``max_attempts=6``, the only protection those calls
  have. The functions of this package (listing, stat, reads, writes, deletes) run on a twin
  filesystem with pyarrow's retries off (``max_attempts=1``), and ``call`` below retries every
  transient failure: counted, classified the same way for every backend, with a backoff the
  tests can shorten. One layer retries each call; the two never multiply.
- Below both, curl resends a request once, by itself, when a kept-alive connection turns out
  dead before any answer: a single dropped connection on a reused connection never reaches
  either layer (and is not counted); a second in a row, or one on a fresh connection, does.
- GCS, Azure, HDFS and fsspec backends keep their clients' own retries (GCS's bounded by
  ``retry_time_limit``); ``call`` retries on top of them.
- Timeouts (uri.py): a connect gives up after ``CONNECT_TIMEOUT_S``; a transfer that moves no
  byte for ``REQUEST_TIMEOUT_S`` fails (curl's low-speed limit: it does apply on Linux, whatever
  pyarrow's docstring says; measured: a server that never answers fails a HEAD in 3.0 s at
  ``request_timeout=3``).

Transient failures (``errors.TRANSIENT``: throttling, 5xx, a lost connection, a timeout) are
retried up to ``num_attempts`` times in all, so any request survives ``num_attempts - 1``
failures in a row (default 6: five). A failure to connect at all (refused, unknown host) is
retried up to ``num_connect_attempts`` times: a wrong endpoint fails in about a second, not
after the full backoff. Anything else (no such key, denied, a missing bucket) is raised at
once. Backoff: exponential with equal jitter, ``d = min(max_delay_s, base_delay_s * 2**k)``,
sleep uniform in ``[d/2, d]``: with the defaults ~0.2, 0.4, 0.8, 1.5, 3 s, ~6 s before the
sixth attempt.
"""

from __future__ import annotations

import random
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Callable, Iterator, TypeVar

from packfeed.service.storage.store_errors import NO_BUCKET, NOT_FOUND, UNREACHABLE, StorageError, classify, problem

# A request answered "no such object" (or bucket) got its answer: not a failure. Most are asked
# on purpose: whether an output holds a kept scan, a files.json, a config.json (a clean pack to
# S3 made 4 such HEADs, and its report said "1 failed", alarming a user whose run was clean).
# The caller decides whether it is an error (then the command fails, saying which object).
ANSWERS = frozenset({NOT_FOUND, NO_BUCKET})

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    num_attempts: int = 6
    num_connect_attempts: int = 3
    base_delay_s: float = 0.25
    max_delay_s: float = 8.0

    def __post_init__(self) -> None:
        if self.num_attempts < 1 or self.num_connect_attempts < 1:
            raise ValueError(f"retry policy: num_attempts ({self.num_attempts}) and num_connect_attempts "
                             f"({self.num_connect_attempts}) must be at least 1")
        if not 0 <= self.base_delay_s <= self.max_delay_s:
            raise ValueError(f"retry policy: need 0 <= base_delay_s ({self.base_delay_s}) <= max_delay_s "
                             f"({self.max_delay_s})")

    def delay_s(self, retry: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first)."""
        d = min(self.max_delay_s, self.base_delay_s * 2 ** (retry - 1))
        return d / 2 + rng.uniform(0, d / 2)


_policy = RetryPolicy()
_rng = random.Random()


def current_policy() -> RetryPolicy:
    return _policy


def set_policy(policy: RetryPolicy) -> RetryPolicy:
    """Make ``policy`` this process's policy; returns the one it replaces."""
    global _policy
    previous, _policy = _policy, policy
    return previous


@dataclass(frozen=True)
class StorageCounts:
    """Requests to remote stores (attempts, each retry one more), retries among them, requests
    that failed (given up on: retries spent, denied, an error that is no answer; an object or
    bucket that does not exist is an answer, ``ANSWERS``), and body bytes moved. Local files
    are not counted."""

    requests: int = 0
    retries: int = 0
    failures: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    def __add__(self, other: "StorageCounts") -> "StorageCounts":
        return StorageCounts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __sub__(self, other: "StorageCounts") -> "StorageCounts":
        return StorageCounts(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Tally:
    """The counts of one thread's requests inside a ``StorageCounters.tally()`` block."""

    def __init__(self) -> None:
        self.counts = StorageCounts()


class StorageCounters:
    """Thread-safe running ``StorageCounts`` of one process (``COUNTERS``); stats and metrics
    read ``snapshot()``, and a difference of two snapshots is what happened in between. A
    ``tally()`` counts one thread's requests alone (a window read while other threads of the
    process read others)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = StorageCounts()
        self._local = threading.local()

    def add(self, **deltas: int) -> None:
        counts = StorageCounts(**deltas)
        with self._lock:
            self._counts = self._counts + counts
        for tally in getattr(self._local, "tallies", ()):
            tally.counts = tally.counts + counts

    def snapshot(self) -> StorageCounts:
        with self._lock:
            return self._counts

    @contextmanager
    def tally(self) -> Iterator[Tally]:
        """``with COUNTERS.tally() as t: ...``: ``t.counts`` are this thread's requests inside."""
        tally = Tally()
        tallies = self._local.__dict__.setdefault("tallies", [])
        tallies.append(tally)
        try:
            yield tally
        finally:
            tallies.remove(tally)


COUNTERS = StorageCounters()


def call(shown_uri: str, what: str, fn: Callable[[], T], *, scheme: str, remote: bool = True) -> T:
    """``fn()`` (one request on ``shown_uri``, a ``display``-ed URI) under the process's policy.

    A transient failure is retried; any failure that ends the call raises ``StorageError``,
    one line naming the URI, and counts as failed unless the store answered that the object
    or bucket does not exist (``ANSWERS``). ``what`` names the request in that line ("read", "list").
    A local call (``remote=False``) is tried once and not counted."""
    policy = _policy
    attempt = 0
    while True:
        attempt += 1
        if remote:
            COUNTERS.add(requests=1)
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - every backend raises its own types; classify sorts them
            failure = classify(exc)
            limit = policy.num_connect_attempts if failure.kind == UNREACHABLE else policy.num_attempts
            if not (remote and failure.transient and attempt < limit):
                if remote and failure.kind not in ANSWERS:
                    COUNTERS.add(failures=1)
                raise StorageError(shown_uri, problem(failure, what=what, scheme=scheme, num_attempts=attempt),
                                   kind=failure.kind) from None
            COUNTERS.add(retries=1)
            time.sleep(policy.delay_s(attempt, _rng))
