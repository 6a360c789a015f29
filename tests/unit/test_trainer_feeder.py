"""RowFeeder's step plan: deterministic, complete, and resumable from a saved data position.

The feeder reads synthetic Arrow tables (windows of known rows) instead of a Ray dataset; a
resumed feeder is given the stream as PackedStream(start_window=K) would give it: windows
before K left out. For every interruption step, the resumed feeder must hand every rank the
same rows at every later step as the uninterrupted one (STYLE.md 8).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, padding_rows
from packfeed.service.config import DataConfig
from packfeed.trainer.batches import StepLayout, fill_micro_batch
from packfeed.trainer.feeder import RowFeeder

DATA = DataConfig(inputs=("unused.jsonl",), tokenizer="unused", seq_len=4)
# Rows per window, in stream order; window 2 is empty (every sample dropped).
WINDOW_ROWS = [5, 3, 0, 7, 1, 6]


def window_tables(start_window: int = 0) -> list[pa.Table]:
    """One table per window; each row's row_index is a global id, so rows can be compared."""
    tables, first = [], sum(WINDOW_ROWS[:start_window])
    for window, n in enumerate(WINDOW_ROWS[start_window:], start=start_window):
        ids = np.arange(first, first + n)
        first += n
        tables.append(pa.table({"row_index": pa.array(ids, pa.int64()), "window": pa.array([window] * n, pa.int64())}))
    return tables


def served(feeder: RowFeeder, layout: StepLayout, first: int, last: int) -> dict:
    out = {}
    for step in range(first, last):
        for rank in range(layout.world_size):
            tables = feeder.get_step(rank, step)
            out[(step, rank)] = None if tables is None else [
                [] if t is None else t.column("row_index").to_pylist() for t in tables
            ]
    return out


@pytest.mark.parametrize("world,accum,micro", [(2, 2, 1), (1, 1, 3), (3, 1, 2)])
def test_every_row_once_in_stream_order_then_none(world, accum, micro):
    layout = StepLayout(world_size=world, grad_accum=accum, micro_rows=micro)
    total = sum(WINDOW_ROWS)
    steps = -(-total // layout.rows_per_step)
    out = served(RowFeeder(DATA, layout, tables=window_tables()), layout, 0, steps + 1)
    flat = [i for step in range(steps) for rank in range(world) for mb in out[(step, rank)] for i in mb]
    assert flat == list(range(total)), "rows must come once each, in stream order, rank-major"
    assert all(out[(steps, rank)] is None for rank in range(world)), "after the end every rank gets None"


@pytest.mark.parametrize("interrupt", range(0, 8))
def test_resume_from_position_serves_the_same_rows(interrupt):
    layout = StepLayout(world_size=2, grad_accum=1, micro_rows=2)
    steps = 8
    straight = served(RowFeeder(DATA, layout, tables=window_tables()), layout, 0, steps)

    first_run = RowFeeder(DATA, layout, tables=window_tables())
    served(first_run, layout, 0, interrupt + 1)
    position = first_run.position(interrupt)
    resumed = RowFeeder(
        DATA, layout, tables=window_tables(position["start_window"]), first_step=interrupt + 1, position=position
    )
    assert served(resumed, layout, interrupt + 1, steps) == {
        k: v for k, v in straight.items() if k[0] > interrupt
    }


def test_position_folds_whole_windows():
    layout = StepLayout(world_size=1, grad_accum=1, micro_rows=4)
    feeder = RowFeeder(DATA, layout, tables=window_tables())
    served(feeder, layout, 0, 3)
    assert feeder.position(0) == {"start_window": 0, "rows": 4}
    assert feeder.position(1) == {"start_window": 2, "rows": 0}  # windows 0 and 1 hold 8 rows
    # Window 2 is empty and never seen: restarting at it or at window 3 is the same stream.
    assert feeder.position(2) == {"start_window": 2, "rows": 4}


def test_short_micro_batches_are_completed_with_padding():
    pad = padding_rows(2, 6, pad_id=0)
    assert pad.input_ids.tolist() == [[0] * 6, [0] * 6]
    assert (pad.labels == IGNORE_INDEX).all()
    assert pad.position_ids.tolist() == [list(range(6))] * 2
    assert pad.seq_lens.tolist() == [6, 6] and pad.sample_ids.tolist() == [PAD_SAMPLE_ID] * 2
    filled = fill_micro_batch(padding_rows(1, 6, 0), 3, 6, 0)
    assert filled.num_rows == 3 and filled.segment_splits.tolist() == [0, 1, 2, 3]
    assert filled.num_real_tokens == 0
    with pytest.raises(ValueError, match="micro-batch holds 1 rows"):
        fill_micro_batch(pad, 1, 6, 0)
