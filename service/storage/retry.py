"""Retries of remote requests, and the process-wide counts of what was asked of the stores.

Which layer retries what. Measured with pyarrow 26 against moto's S3 server through the fault
proxy of tests/support/s3.py:

- pyarrow's S3FileSystem retries inside one call, as its ``retry_strategy`` says
  (``AwsStandardS3RetryStrategy``, default ``max_attempts=3``): a 503 SlowDown on a LIST or a
  HEAD, a dropped connection (reset, empty reply) on GET, HEAD and LIST, with the SDK's own
  backoff (throttling waits ~1-5 s a retry: 5 SlowDowns in a row cost a LIST 21 s at
  ``max_attempts=6``). It does NOT retry a 503, 500 or 403 answering a ranged GET shorter than
  the error's XML body: the body overflows the read buffer, the status is lost and the call
  fails at once with ``INTERNAL_FAILURE ... Failed to flush response stream`` (so reads.py asks
  4 KiB at least: the status is read). Its retries are invisible to the caller: nothing counts
  them.
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

Transient failures (``store_errors.TRANSIENT``: throttling, 5xx, a lost connection, a
timeout) are retried for a budget of time (backoff.py: ``RetryPolicy.budget_s``, 2 minutes by
default, ``$PACKFEED_STORAGE_RETRY_S``), with capped exponential backoff and full jitter. A
failure to connect at all (refused, unknown host) is retried up to ``num_connect_attempts``
times: a wrong endpoint fails in about a second, not after the budget. Anything else (no such
key, denied, a missing bucket) is raised at once, on the first answer. While a store throttles,
the process sends it fewer requests at once (limiter.py: halved on a SlowDown, one more per
success). Every attempt is a request in the counts, every retry a retry, every SlowDown answer
``throttled``, the time waited to retry ``backoff_ms``.
"""

from __future__ import annotations

import os
import random
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Callable, Iterator, TypeVar

from packfeed.service.storage.backoff import RETRY_ENV, RetryPolicy, policy_from_env
from packfeed.service.storage.limiter import FAILED, SLOW_DOWN, SUCCEEDED, limiter_for
from packfeed.service.storage.store_errors import (
    NO_BUCKET, NOT_FOUND, THROTTLED, UNREACHABLE, StorageError, classify, problem,
)

# A request answered "no such object" (or bucket) got its answer: not a failure. Most are asked
# on purpose: whether an output holds a kept scan, a files.json, a config.json (a clean pack to
# S3 made 4 such HEADs, and its report said "1 failed", alarming a user whose run was clean).
# The caller decides whether it is an error (then the command fails, saying which object).
ANSWERS = frozenset({NOT_FOUND, NO_BUCKET})

T = TypeVar("T")

_policy: RetryPolicy | None = None  # set_policy's; None: the default, with $PACKFEED_STORAGE_RETRY_S
_env_policy: tuple[str | None, RetryPolicy] = (None, RetryPolicy())
_rng = random.Random()
_clock: Callable[[], float] = time.monotonic  # the unit tests replace both: no real waiting
_sleep: Callable[[float], None] = time.sleep


def current_policy() -> RetryPolicy:
    """``set_policy``'s policy, else the default with ``$PACKFEED_STORAGE_RETRY_S``'s budget."""
    global _env_policy
    if _policy is not None:
        return _policy
    text = os.environ.get(RETRY_ENV)
    if text != _env_policy[0]:
        _env_policy = (text, policy_from_env({RETRY_ENV: text} if text is not None else {}))
    return _env_policy[1]


def set_policy(policy: RetryPolicy | None) -> RetryPolicy | None:
    """Make ``policy`` this process's policy (None: the default again); returns the one it
    replaces, for a later ``set_policy`` to put back."""
    global _policy
    previous, _policy = _policy, policy
    return previous


@dataclass(frozen=True)
class StorageCounts:
    """Requests to remote stores (attempts, each retry one more), retries among them, requests
    that failed (given up on: the retry budget spent, denied, an error that is no answer; an
    object or bucket that does not exist is an answer, ``ANSWERS``), body bytes moved, answers
    that were throttling (503 SlowDown, 429: each also a retry, or the failure that ended its
    request) and the milliseconds spent waiting to retry (summed over threads). Local files are
    not counted."""

    requests: int = 0
    retries: int = 0
    failures: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    throttled: int = 0
    backoff_ms: int = 0

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

    def tallies(self) -> tuple[Tally, ...]:
        """This thread's open tallies: what a file opened here hands to ``counting_for``."""
        return tuple(getattr(self._local, "tallies", ()))

    @contextmanager
    def counting_for(self, tallies: tuple[Tally, ...]) -> Iterator[None]:
        """Inside, this thread's requests count in ``tallies`` too (those of the thread that
        opened the file read here): pyarrow reads the column chunks of a Parquet file a window
        opened on its own I/O threads, whose requests a window's ``tally`` would miss otherwise.
        A tally already open in this thread is not counted twice."""
        mine = self._local.__dict__.setdefault("tallies", [])
        extra = [t for t in tallies if all(t is not m for m in mine)]
        mine.extend(extra)
        try:
            yield
        finally:
            for t in extra:
                mine.remove(t)


COUNTERS = StorageCounters()


def call(shown_uri: str, what: str, fn: Callable[[], T], *, scheme: str, remote: bool = True) -> T:
    """``fn()`` (one request on ``shown_uri``, a ``display``-ed URI) under the process's policy.

    A transient failure is retried (module docstring) while the budget lasts, each attempt in a
    slot of the store's limiter; any failure that ends the call raises ``StorageError``, one
    line naming the URI, and counts as failed unless the store answered that the object or
    bucket does not exist (``ANSWERS``). ``what`` names the request in that line ("read",
    "list"). A local call (``remote=False``) is tried once and not counted."""
    if not remote:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - every backend raises its own types; classify sorts them
            failure = classify(exc)
            raise StorageError(shown_uri, problem(failure, what=what, scheme=scheme, num_attempts=1),
                               kind=failure.kind) from None
    policy = current_policy()
    limiter = limiter_for(shown_uri, policy.max_in_flight)
    # a request made inside another of this thread (none today) takes no slot: at a limit of 1
    # it would wait for the slot its own thread holds
    limiter = None if limiter in _inside.__dict__.setdefault("limiters", []) else limiter
    attempt, started, failure = 0, None, None
    while True:
        # the first attempt waits for a slot as long as it takes (the requests holding them end
        # within their timeouts); a retry waits within its budget
        token = _acquire(limiter, None if started is None else max(0.0, policy.budget_s - (_clock() - started)))
        if token is None:  # the budget ran out waiting for a slot: the last failure ends the call
            _give_up(shown_uri, what, scheme, failure, attempt, _clock() - started, policy)
        attempt += 1
        if started is None:
            started = _clock()
        COUNTERS.add(requests=1)
        outcome = FAILED  # also when fn() raises what is no Exception (an interrupt): the slot goes back
        try:
            result = fn()
            outcome = SUCCEEDED
        except Exception as exc:  # noqa: BLE001 - as above
            failure = classify(exc)
            outcome = SLOW_DOWN if failure.kind == THROTTLED else FAILED
        finally:
            _release(limiter, token, outcome)
        if outcome == SUCCEEDED:
            return result
        if failure.kind == THROTTLED:
            COUNTERS.add(throttled=1)
        elapsed = _clock() - started
        wait = None
        if failure.transient and (failure.kind != UNREACHABLE or attempt < policy.num_connect_attempts):
            wait = policy.wait_s(attempt, elapsed, _rng)
        if wait is None:
            _give_up(shown_uri, what, scheme, failure, attempt, elapsed, policy)
        COUNTERS.add(retries=1, backoff_ms=round(wait * 1000))
        _sleep(wait)


_inside = threading.local()  # .limiters: those whose slot this thread holds now


def _acquire(limiter, timeout_s: float | None) -> int | None:
    if limiter is None:
        return 0
    token = limiter.acquire(timeout_s)
    if token is not None:
        _inside.limiters.append(limiter)
    return token


def _release(limiter, token: int, outcome: str) -> None:
    if limiter is not None:
        _inside.limiters.remove(limiter)
        limiter.release(token, outcome)


def _give_up(shown_uri: str, what: str, scheme: str, failure, attempts: int, elapsed_s: float,
             policy: RetryPolicy):
    if failure.kind not in ANSWERS:
        COUNTERS.add(failures=1)
    spent = failure.transient and failure.kind != UNREACHABLE
    raise StorageError(shown_uri, problem(failure, what=what, scheme=scheme, num_attempts=attempts,
                                          seconds=elapsed_s if spent else None,
                                          budget_s=policy.budget_s if spent else None),
                       kind=failure.kind) from None
