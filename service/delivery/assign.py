"""Which global rows each consumer gets: the one delivery contract of the packed stream.

Used by both consumers of the stream, through one function (steps.py ``rank_batch``): the gRPC
server (``packfeed serve``, one call per rank) and the Ray Train feeder (``packfeed train``,
whose rank's B rows are ``grad_accum`` micro-batches). Resume records are the same in both: the
cursor below.

Contract (docs/design.md, "Delivery, determinism, resume"): the stream is a sequence of rows
with global indices 0, 1, 2, ... A consumer asks for (rank k, world size N, B rows per batch,
cursor c). Step s covers the N*B global rows [c + s*N*B, c + (s+1)*N*B); rank k gets the B of
them with index % N == k, in increasing order. So within a world size the ranks are disjoint,
get B rows each per step, and together get every row of the step exactly once. The cursor after
step s is c + (s+1)*N*B, capped at the stream length T: pass it back to resume exactly after
that step, with the same or any other (N, B), since the next step starts at the cursor.

The last step may run past T: those slots are filled with flagged all-padding rows (labels all
IGNORE_INDEX, one segment with sample id PAD_SAMPLE_ID) so every rank gets the same number of
steps, ceil((T - c) / (N*B)), and nobody waits for a batch that never comes. A padding row
keeps the index it would have had (>= T), so indices stay unique.

That rule is ``balance = "off"`` (the default). With ``balance = "compute"`` (balance.py) the
step covers the same N*B rows, the cursor and the padding rows are the same, but which rank
(and which of its grad_accum micro-batches) gets which row is decided by the rows' attention
work, a deterministic function of the step's rows and (N, B, grad_accum): each rank's
``StepRows.rows`` is then a tuple in batch order and ``order`` lists the batch's indices, its
padding rows' among them. So the ranks are still disjoint and together get every row of the
step exactly once, and a resume from the cursor at any (N, B) is exact.

Worked example, N=2, B=3, c=0, T=9: step 0 covers rows 0..5 (rank 0: 0 2 4, rank 1: 1 3 5),
cursor 6; step 1 covers 6..11 (rank 0: 6 8 + one padding row, rank 1: 7 + two padding
rows), cursor 9 == T, the end. Resuming at cursor 6 with N=3, B=1: rank 0 gets 6, rank 1 7,
rank 2 8: exactly the rows not yet delivered.

Imports only the standard library, numpy and packfeed.client: no gRPC, no Ray. Cost: O(1) per
step for the index ranges, O(B*L) to build padding rows (balance "compute": balance.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
from packfeed.client.rows import PackedRows, concat_rows, padding_rows, select_rows


class CursorOutOfRange(ValueError):
    """The cursor is past the end of the stream (gRPC OUT_OF_RANGE)."""


@dataclass(frozen=True)
class StepRows:
    """The rows one rank receives at one step.

    ``rows``: the real global row indices, in batch order: a strided range (step world_size)
    with balance "off", a tuple with "compute" (balance.py).
    ``num_padding``: all-padding rows that make ``batch_rows``: after the real rows with "off".
    ``cursor``: rows of the global stream consumed after this step (the resume point).
    ``order``: with "compute", every index of the batch in batch order, padding rows' included
    (their indices >= T); None with "off".
    """

    step: int
    rows: range | tuple[int, ...]
    num_padding: int
    cursor: int
    order: tuple[int, ...] | None = None

    @property
    def indices(self) -> np.ndarray:
        """int64 [B]: all row indices of the batch, padding rows continuing the stride past T."""
        if self.order is not None:
            return np.array(self.order, dtype=np.int64)
        b = len(self.rows) + self.num_padding
        return self.rows.start + self.rows.step * np.arange(b, dtype=np.int64)

    @property
    def padding_mask(self) -> np.ndarray:
        """bool [B]: True for the all-padding rows (at the end of the batch with "off")."""
        if self.order is not None:
            return ~np.isin(self.indices, np.array(self.rows, dtype=np.int64))
        mask = np.zeros(len(self.rows) + self.num_padding, dtype=bool)
        mask[len(self.rows) :] = True
        return mask


def check_request(
    rank: int, world_size: int, batch_rows: int, cursor: int, total_rows: int | None = None
) -> None:
    """Raise ValueError (CursorOutOfRange for a cursor past the end) unless the request is valid."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    if cursor < 0:
        raise ValueError(f"cursor must be >= 0, got {cursor}")
    if total_rows is not None and cursor > total_rows:
        raise CursorOutOfRange(
            f"cursor {cursor} is past the end of the stream ({total_rows} rows): "
            "was it saved from a run over another data config?"
        )


def num_steps(world_size: int, batch_rows: int, cursor: int, total_rows: int) -> int:
    """Steps every rank gets from ``cursor`` to the end: ceil((total_rows - cursor) / (N*B))."""
    check_request(0, world_size, batch_rows, cursor, total_rows)
    per_step = world_size * batch_rows
    return -(-(total_rows - cursor) // per_step)


def step_rows(
    rank: int, world_size: int, batch_rows: int, cursor: int, step: int, total_rows: int | None = None
) -> StepRows:
    """The rows of ``rank`` at ``step`` (0-based, counted from ``cursor``).

    ``total_rows`` None: the stream length is not known yet, no padding. Does not check that
    ``step`` < num_steps: a step entirely past the end is all padding.
    """
    check_request(rank, world_size, batch_rows, cursor, total_rows)
    start = cursor + step * world_size * batch_rows
    end = start + world_size * batch_rows
    first = start + (rank - start) % world_size
    stop = end if total_rows is None else max(min(end, total_rows), first)
    rows = range(first, stop, world_size)
    after = end if total_rows is None else min(end, total_rows)
    return StepRows(step=step, rows=rows, num_padding=batch_rows - len(rows), cursor=after)


def rows_for(
    rank: int, world_size: int, batch_rows: int, cursor: int, total_rows: int | None = None
) -> Iterator[StepRows]:
    """Every step of ``rank`` from ``cursor`` to the end (forever when total_rows is None)."""
    check_request(rank, world_size, batch_rows, cursor, total_rows)
    step = 0
    while total_rows is None or step < num_steps(world_size, batch_rows, cursor, total_rows):
        yield step_rows(rank, world_size, batch_rows, cursor, step, total_rows)
        step += 1


def padding_row(seq_len: int, pad_id: int, *, row_index: int = -1) -> PackedRows:
    """One all-padding row (see ``padding_rows``)."""
    return padding_rows(1, seq_len, pad_id, [row_index])


def split_micro_batches(rows: PackedRows, num_micro: int) -> list[PackedRows]:
    """A rank's batch of one step as ``num_micro`` micro-batches of equal size, in order
    (gradient accumulation: micro-batch m is rows m*M .. (m+1)*M - 1, M = B / num_micro)."""
    if num_micro < 1 or rows.num_rows % num_micro:
        raise ValueError(f"{rows.num_rows} rows do not split into {num_micro} equal micro-batches")
    m = rows.num_rows // num_micro
    return [select_rows(rows, range(i * m, (i + 1) * m)) for i in range(num_micro)]


def fill_batch(
    real: PackedRows | None, assignment: StepRows, seq_len: int, pad_id: int
) -> tuple[PackedRows, np.ndarray]:
    """The batch for ``assignment``: its real rows (``real``, in assignment order; None when it
    has none) and its padding rows, in batch order (the padding last with balance "off").
    Returns (rows, padding mask bool [B]).
    """
    n_real = len(assignment.rows)
    got = 0 if real is None else real.num_rows
    if got != n_real:
        raise ValueError(f"step {assignment.step} has {n_real} real rows, got {got}")
    if assignment.num_padding == 0:
        return real, assignment.padding_mask
    mask = assignment.padding_mask
    pad = padding_rows(assignment.num_padding, seq_len, pad_id, assignment.indices[mask])
    rows = pad if real is None else concat_rows([real, pad])
    if assignment.order is not None:  # real rows then padding rows, put in batch order
        place = np.empty(len(mask), dtype=np.int64)
        place[np.flatnonzero(~mask)] = np.arange(n_real)
        place[np.flatnonzero(mask)] = n_real + np.arange(assignment.num_padding)
        rows = select_rows(rows, place)
    return rows, mask
