"""Parquet and Arrow IPC inputs: row counts from metadata, and tables for ranges of rows.

A window reads only what its pieces need: the Parquet row groups (or Arrow record batches) that
its row ranges touch, each decoded once, with only the columns the sample format reads.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from packfeed.client.offsets import offsets_of, starts_of
from packfeed.service.inputs.fileio import open_arrow_input

FORMAT_COLUMNS = {
    "text": ("text",),
    "prompt_completion": ("prompt", "completion", "tools"),
    "messages": ("messages", "tools"),
    "auto": ("messages", "prompt", "completion", "text", "tools"),
}


def count_columnar_rows(path: str, kind: str) -> int:
    """Rows of a Parquet file (from its footer) or an Arrow IPC file or stream (its batches)."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        with open_arrow_input(path, kind) as source:
            return pq.ParquetFile(source).metadata.num_rows
    return sum(b.num_rows for b in arrow_batches(path))


def arrow_batches(path: str) -> Iterator[Any]:
    """Record batches of an Arrow IPC file (random access) or stream, memory-mapped (zero copy)."""
    import pyarrow as pa

    with open_arrow_input(path, "arrow") as source:
        try:
            reader = pa.ipc.open_file(source)
        except pa.ArrowInvalid:
            source.seek(0)
            try:
                stream = pa.ipc.open_stream(source)
            except pa.ArrowInvalid as e:
                raise ValueError(f"input {path!r}: not an Arrow IPC file or stream ({e})") from None
            yield from stream
        else:
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def read_columnar(path: str, kind: str, ranges: list[tuple[int, int]], fmt: str) -> list[Any]:
    """One table per row range [lo, hi) of a Parquet/Arrow file, decoding every row group or
    batch the ranges touch once, with only the columns the format reads."""
    import pyarrow as pa

    if kind == "parquet":
        import pyarrow.parquet as pq

        with open_arrow_input(path, kind) as source:
            pf = pq.ParquetFile(source)
            sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
            names = pf.schema_arrow.names
            columns = [c for c in FORMAT_COLUMNS[fmt] if c in names]
            starts = offsets_of(sizes)
            needed = sorted({g for lo, hi in ranges
                             for g in range(_group_of(starts, lo), _group_of(starts, hi - 1) + 1)})
            table = pf.read_row_groups(needed, columns=columns)
        # The needed groups sit back to back in ``table``: file row r of group g is table row
        # r - starts[g] + (rows of the needed groups before g).
        before = dict(zip(needed, starts_of([sizes[g] for g in needed]).tolist()))

        def table_row(r: int) -> int:
            g = _group_of(starts, r)
            return before[g] + r - int(starts[g])

        return [table.slice(table_row(lo), hi - lo) for lo, hi in ranges]
    batches: list[Any] = []
    row = 0
    last = max(hi for _, hi in ranges)
    for batch in arrow_batches(path):
        n = batch.num_rows
        if any(lo < row + n and hi > row for lo, hi in ranges):
            batches.append((row, batch))
        row += n
        if row >= last:
            break
    names = batches[0][1].schema.names if batches else []
    columns = [c for c in FORMAT_COLUMNS[fmt] if c in names]
    out = []
    for lo, hi in ranges:
        parts = [b.select(columns).slice(max(lo - r, 0), min(hi, r + b.num_rows) - max(lo, r))
                 for r, b in batches if lo < r + b.num_rows and hi > r]
        out.append(pa.Table.from_batches(parts) if parts else None)
    return out


def _group_of(starts: np.ndarray, row: int) -> int:
    return int(np.searchsorted(starts, row, side="right")) - 1
