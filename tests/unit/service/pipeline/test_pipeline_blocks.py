"""The blocks of the packing stream, without Ray: a window's rows with its stats (``window_table``
-> ``table_outputs``), and what an actor that wrote its part file sends (``written_table``)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from packfeed.client.rows import PackedRows
from packfeed.service.pipeline.ray_pipeline import ActorTimings, table_outputs, window_table, written_table
from packfeed.service.pipeline.startup import ACTOR_PHASES
from packfeed.service.pipeline.stats import WindowStats

SEQ = 4


def rows(n: int, first_sample: int) -> PackedRows:
    ids = np.arange(first_sample * SEQ, (first_sample + n) * SEQ, dtype=np.int32).reshape(n, SEQ)
    return PackedRows(input_ids=ids, labels=ids.copy(), position_ids=np.tile(np.arange(SEQ, dtype=np.int32), (n, 1)),
                      seq_lens=np.full(n, SEQ, np.int32), sample_ids=np.arange(first_sample, first_sample + n),
                      segment_splits=np.arange(n + 1, dtype=np.int64), row_index=np.arange(n))


@pytest.mark.parametrize("counts", [
    pytest.param([3, 2], id="two-windows-in-one-block"),
    pytest.param([1, 0, 4], id="a-window-with-no-row-keeps-its-stats"),
    pytest.param([5], id="one-window"),
])
def test_each_window_comes_back_with_its_stats_and_global_rows(counts):
    parts, first_sample = [], 0
    for k, n in enumerate(counts):
        parts.append(window_table(k, rows(n, first_sample), WindowStats(window=k, epoch=0, rows=n)))
        first_sample += n
    outputs = table_outputs(pa.concat_tables(parts), first_row=10)
    assert [o.window for o in outputs] == list(range(len(counts)))
    assert [o.stats.window for o in outputs] == list(range(len(counts)))
    assert [o.rows.num_rows for o in outputs] == counts
    assert np.array_equal(np.concatenate([o.rows.row_index for o in outputs]), 10 + np.arange(sum(counts)))
    assert np.array_equal(np.concatenate([o.rows.sample_ids for o in outputs]), np.arange(sum(counts)))


@pytest.mark.parametrize("num_rows, file, timings", [
    pytest.param(3, "part-00002.parquet", ActorTimings(1.0, 1.5), id="first-window-of-an-actor"),
    pytest.param(0, None, None, id="no-row-no-file"),
])
def test_a_written_window_is_one_small_row(num_rows, file, timings):
    table = written_table(2, rows(num_rows, 0), file, WindowStats(window=2, epoch=0, rows=num_rows), timings)
    (row,) = table.to_pylist()
    assert row["window"] == 2 and row["rows"] == num_rows and row["tokens"] == num_rows * SEQ and row["file"] == file
    assert WindowStats.from_json(row["stats"]).rows == num_rows
    assert row["timings"] == (timings.to_json() if timings else None)


def test_an_actors_timings_cross_ray_as_the_json_the_driver_reads():
    """The ``timings`` cell is JSON of the instants set, in ``ACTOR_PHASES`` order: the start-up
    alone on a first window the driver packed, every phase on one the actor packed."""
    timings = ActorTimings(1.0, 1.5, imports_done=2.0, tokenizer_done=2.5)
    assert timings.to_json() == '{"process_created": 1.0, "init_start": 1.5, "imports_done": 2.0, "tokenizer_done": 2.5}'
    timings.call_start, timings.packed, timings.written = 3.0, 3.5, 4.0
    assert list(json.loads(timings.to_json())) == [key for key, _ in ACTOR_PHASES]
