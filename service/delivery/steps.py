"""One rank's batch of one step, read from a hub: the delivery loop of serve and train, written once.

The gRPC servicer (server.py, one ``StreamBatches`` call per rank, step after step) and the
train feeder (trainer/feeder.py, any rank's any step on request) both ask ``rank_batch``. It
applies the contract of assign.py to the hub's rows:

1. ask the hub for the rank's rows of the step as if the stream had no end, and for the
   knowledge that the stream reaches the step's cursor (``through``): near the end a rank's
   rows may exist before the stream's length is known, and a batch must never carry a cursor
   past the end (a resume from it would be refused);
2. once the length is known: no batch past the last step, the rows cut at the end and the
   batch filled with flagged padding rows; a cursor past the end is ``CursorOutOfRange``.

What the hub raises passes through (``ConsumerGone``, ``HubClosed``, the pipeline's error):
each caller maps them (gRPC status codes; the feeder raises them to its ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from packfeed.client.rows import PackedRows
from packfeed.service.delivery.assign import StepRows, fill_batch, num_steps, step_rows
from packfeed.service.delivery.hub import Consumer


@dataclass(frozen=True)
class RankBatch:
    """What one rank receives at one step.

    ``rows``: B packed rows, the real ones (global index k mod N, increasing) then the padding.
    ``padding``: bool [B], True for the padding rows. ``assignment``: which rows these are and
    the cursor after the step. ``num_real_tokens``: real tokens of the real rows.
    """

    rows: PackedRows
    padding: np.ndarray
    assignment: StepRows
    num_real_tokens: int


def rank_batch(
    consumer: Consumer, *, rank: int, world_size: int, batch_rows: int, cursor: int, step: int, seq_len: int,
    pad_id: int,
) -> RankBatch | None:
    """Rank ``rank``'s batch of ``step`` (0-based, counted from ``cursor``), None when the stream
    ends before it. Blocks until the hub holds its rows. CursorOutOfRange when the stream turns
    out to end before ``cursor``."""
    wanted = step_rows(rank, world_size, batch_rows, cursor, step)
    real, total = consumer.rows(wanted.rows, through=wanted.cursor - 1)  # the cursor must exist
    if total is not None:
        if step >= num_steps(world_size, batch_rows, cursor, total):  # CursorOutOfRange past the end
            return None
        wanted = step_rows(rank, world_size, batch_rows, cursor, step, total)
    rows, padding = fill_batch(real, wanted, seq_len, pad_id)
    return RankBatch(rows, padding, wanted, 0 if real is None else real.num_real_tokens)
