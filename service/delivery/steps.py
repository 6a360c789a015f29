"""One rank's batch of one step, read from a hub: the delivery loop of serve and train, written once.

The gRPC servicer (server.py, one ``StreamBatches`` call per rank, step after step) and the
train feeder (service/delivery/feeder.py, any rank's any step on request) both ask ``rank_batch``. It
applies the contract of assign.py to the hub's rows:

1. ask the hub for the rank's rows of the step as if the stream had no end, and for the
   knowledge that the stream reaches the step's cursor (``through``): near the end a rank's
   rows may exist before the stream's length is known, and a batch must never carry a cursor
   past the end (a resume from it would be refused);
2. once the length is known: no batch past the last step, the rows cut at the end and the
   batch filled with flagged padding rows; a cursor past the end is ``CursorOutOfRange``.

What the hub raises passes through (``ConsumerGone``, ``HubClosed``, the pipeline's error):
each caller maps them (gRPC status codes; the feeder raises them to its ranks).

``Deliveries`` tells a row's first delivery to its rank from a row sent again (serve's
``rows_served`` and ``rows_resent`` counters).
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

import numpy as np
from packfeed.client.rows import PackedRows, concat_rows, select_rows
from packfeed.service.delivery.assign import StepRows, fill_batch, num_steps, step_rows
from packfeed.service.delivery.balance import balanced_step
from packfeed.service.delivery.hub import Consumer


@dataclass(frozen=True)
class RankBatch:
    """What one rank receives at one step.

    ``rows``: B packed rows, with balance "off" the real ones (global index k mod N, increasing)
    then the padding; with "compute" in balance.py's order. ``padding``: bool [B], True for the
    padding rows. ``assignment``: which rows these are and
    the cursor after the step. ``num_real_tokens``: real tokens of the real rows.
    """

    rows: PackedRows
    padding: np.ndarray
    assignment: StepRows
    num_real_tokens: int


def rank_batch(
    consumer: Consumer, *, rank: int, world_size: int, batch_rows: int, cursor: int, step: int, seq_len: int,
    pad_id: int, balance: str = "off", grad_accum: int = 1,
) -> RankBatch | None:
    """Rank ``rank``'s batch of ``step`` (0-based, counted from ``cursor``), None when the stream
    ends before it. Blocks until the hub holds its rows. CursorOutOfRange when the stream turns
    out to end before ``cursor``. ``balance`` "compute": the step's rows by balance.py, over
    ``grad_accum`` micro-batches of the rank's B rows (weighed from the hub's segment lengths)."""
    if balance == "compute":
        return _balanced_batch(consumer, rank=rank, world_size=world_size, batch_rows=batch_rows, cursor=cursor,
                               step=step, seq_len=seq_len, pad_id=pad_id, grad_accum=grad_accum)
    wanted = step_rows(rank, world_size, batch_rows, cursor, step)
    real, total = consumer.rows(wanted.rows, through=wanted.cursor - 1)  # the cursor must exist
    if total is not None:
        if step >= num_steps(world_size, batch_rows, cursor, total):  # CursorOutOfRange past the end
            return None
        wanted = step_rows(rank, world_size, batch_rows, cursor, step, total)
    rows, padding = fill_batch(real, wanted, seq_len, pad_id)
    return RankBatch(rows, padding, wanted, 0 if real is None else real.num_real_tokens)


def _balanced_batch(
    consumer: Consumer, *, rank: int, world_size: int, batch_rows: int, cursor: int, step: int, seq_len: int,
    pad_id: int, grad_accum: int,
) -> RankBatch | None:
    """``rank_batch`` with balance "compute": the step's rows weighed (their attention work
    alone: no token copied), the rank's taken by ``balanced_step`` (every rank computes the same
    assignment, cached), then read: B rows, as with "off"."""
    per_step = world_size * batch_rows
    whole = step_rows(0, 1, per_step, cursor, step)
    work, total = consumer.work(whole.rows, through=whole.cursor - 1)
    if total is not None:
        if step >= num_steps(world_size, batch_rows, cursor, total):  # CursorOutOfRange past the end
            return None
        whole = step_rows(0, 1, per_step, cursor, step, total)
    wanted = balanced_step(whole, work, rank=rank, world_size=world_size, grad_accum=grad_accum, seq_len=seq_len)
    mine = _read(consumer, wanted.rows)
    rows, padding = fill_batch(mine, wanted, seq_len, pad_id)
    return RankBatch(rows, padding, wanted, 0 if mine is None else mine.num_real_tokens)


def _read(consumer: Consumer, rows: tuple[int, ...]) -> PackedRows | None:
    """Rows ``rows`` (any order) from the hub, in that order: one read per run of consecutive
    indices, lowest first (a consumer's reads move up, so nothing it still needs is dropped).
    Rows 9 4 5: reads 4..5 then 9, returned as 9 4 5."""
    if not rows:
        return None
    ordered = sorted(rows)
    cuts = [0, *[i for i in range(1, len(ordered)) if ordered[i] != ordered[i - 1] + 1], len(ordered)]
    parts = [consumer.rows(range(ordered[a], ordered[b - 1] + 1))[0] for a, b in zip(cuts, cuts[1:])]
    got = parts[0] if len(parts) == 1 else concat_rows(parts)
    place = {row: i for i, row in enumerate(ordered)}
    return select_rows(got, [place[row] for row in rows])


class Deliveries:
    """Which rows each rank of each world size was sent: ``record`` tells a row's first
    delivery from a row sent again.

    A consumer that resumes (a reconnect, a restart from a checkpoint) asks from its cursor:
    rows sent before it left that it had not read (gRPC sends ahead of the reads: HTTP/2
    windows and socket buffers held a whole 873-row stream of 512-token rows while its client
    read 5 batches), or read before an older checkpoint, come again. Counted as served each
    time, one stream's rows added up to 1,666 for 873; counted once, served rows never exceed
    the stream's for one group of consumers (a second group of the same world size counts as
    sent again: requests carry no consumer's identity).

    Rank k of N only ever gets rows of index k mod N (assign.py), so the rows sent to (N, k)
    are kept as sorted, disjoint intervals of global indices, each meaning "every row of index
    k mod N in it": a consumer reading in order keeps one. Thread-safe (one call per rank)."""

    def __init__(self) -> None:
        self._sent: dict[tuple[int, int], list[list[int]]] = {}  # (world_size, rank) -> [[lo, hi), ...]
        self._lock = threading.Lock()

    def record(self, world_size: int, rank: int, rows: range | tuple[int, ...]) -> np.ndarray:
        """Record ``rows`` (a rank's real rows of a step: stride ``world_size``) as sent to
        (``world_size``, ``rank``); bool [len(rows)]: True where a row had been sent to it before.

        For N=2, rank 0, rows 0 2 4 then, after a resume at cursor 2, rows 2 4 6: the second
        call says [True, True, False]. A tuple (balance "compute": any rank may get any row of
        a step) is recorded as sent to the world size's group, whichever rank got it."""
        if not isinstance(rows, range):
            return self._record_group(world_size, rows)
        again = np.zeros(len(rows), dtype=bool)
        if not len(rows):
            return again
        lo, hi = rows[0], rows[-1] + 1
        with self._lock:
            spans = self._sent.setdefault((world_size, rank), [])
            for a, b in spans:  # few: one per gap in what this rank was sent
                if a < hi and lo < b:
                    first = max(0, -(-(a - lo) // world_size))  # positions in ``rows`` of the rows in [a, b)
                    last = min(len(rows), -(-(b - lo) // world_size))
                    again[first:last] = True
            _add_span(spans, lo, hi, world_size)
        return again


    def _record_group(self, world_size: int, rows: tuple[int, ...]) -> np.ndarray:
        """``record`` for balance "compute": the rows sent to any rank of ``world_size``."""
        index = np.asarray(rows, dtype=np.int64)
        again = np.zeros(len(index), dtype=bool)
        with self._lock:
            spans = self._sent.setdefault((world_size, -1), [])  # rank -1: the group, stride 1
            for a, b in spans:
                again |= (index >= a) & (index < b)
            for row in sorted(set(rows)):
                _add_span(spans, row, row + 1, 1)
        return again


def _add_span(spans: list[list[int]], lo: int, hi: int, stride: int) -> None:
    """``spans`` with [lo, hi) added, merged with every span it overlaps or continues (a
    rank's next step starts up to ``stride`` - 1 rows after its last row: no gap between)."""
    at = bisect.bisect_left(spans, [lo])
    while at > 0 and spans[at - 1][1] + stride > lo:
        at -= 1
    end = at
    while end < len(spans) and spans[end][0] <= hi + stride - 1:
        lo, hi = min(lo, spans[end][0]), max(hi, spans[end][1])
        end += 1
    spans[at:end] = [[lo, hi]]
