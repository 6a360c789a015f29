"""Helpers for the tests of inputs/: the windows of a few input files, planned the simple way;
Arrow IPC files and streams written in batches of a given size."""

from __future__ import annotations

import os
from typing import Any, Sequence

import pyarrow as pa

from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.inputs.read import WindowSpec


def plan_windows(inputs: Sequence[str] | str, *, window_samples: int, format: str = "auto") -> list[WindowSpec]:
    """The windows of ``inputs`` read in file order: one source, no shuffle, one epoch (runs
    plan mixtures with ``build_plan`` from their whole config)."""
    paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    config = DataConfig.from_inputs(paths, tokenizer="-", seq_len=2, window_samples=window_samples, block_samples=0,
                                    format=format)
    plan = build_plan(config)
    return [plan.window(k) for k in range(plan.num_windows)]


def write_arrow_ipc(sink: Any, table: pa.Table, *, stream: bool, batch_rows: int) -> None:
    """``table`` to ``sink`` (a path or a writable file) as an Arrow IPC stream or file, in record
    batches of ``batch_rows`` rows."""
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)


def arrow_ipc_bytes(table: pa.Table, *, stream: bool, batch_rows: int) -> bytes:
    """The bytes ``write_arrow_ipc`` writes."""
    sink = pa.BufferOutputStream()
    write_arrow_ipc(sink, table, stream=stream, batch_rows=batch_rows)
    return sink.getvalue().to_pybytes()
