"""The input bytes a window draws: what "reading each byte about once" is measured against.

``window_extents(spec)`` gives, per input file, the byte ranges the readers of read.py need for
the window's pieces, at the granularity they read them:

- JSONL: the seek-point stretches a piece spans, from the seek point at or before its first
  row to the next seek point at or after its last row (``Piece.byte_offset`` to
  ``Piece.end_offset``; the file's end where no end is known). A reader passes over the lines
  between the seek point and the piece's first row, so they are drawn too.
- Parquet: the file's footer (its metadata and the 8 bytes after it) and, of every row group the
  piece touches, the column chunks of the columns the sample format reads
  (``columnar.FORMAT_COLUMNS``: a nested column's every leaf), each from its dictionary page.
- Arrow IPC and text files: the whole file (an Arrow window reads from its first wanted batch;
  a text piece reads its files whole).

``union(extents)`` merges the ranges of many windows per file, and ``num_bytes`` sums them:
"what remains after a cursor" is ``num_bytes(union(window_extents(plan.window(k)) for k from
the cursor's window on))`` (tests/integration/storage/test_serve_s3_restart.py,
bench/bench_storage.py ``--only restart``). Example: a JSONL file with seek points at bytes 0,
100, 250 (size 400) and pieces of rows in the stretches [0, 100) and [250, 400) draw 250 bytes.

Parquet metadata is read through ``open_footer`` (default: fileio's ``open_input``, so on a store
through the read caches): pass one that opens a local copy to measure without touching the store.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import pyarrow.parquet as pq

from packfeed.service.inputs.columnar import FORMAT_COLUMNS
from packfeed.service.inputs.fileio import open_input
from packfeed.service.inputs.read import Piece, WindowSpec

Extents = dict[str, list[tuple[int, int]]]  # path -> byte ranges [start, end), sorted, disjoint
OpenFooter = Callable[[str], Any]  # path -> a readable, seekable binary file


def window_extents(spec: WindowSpec, *, open_footer: OpenFooter = open_input,
                   metadata: dict[str, Any] | None = None) -> Extents:
    """Per file, the byte ranges the pieces of ``spec`` draw (the module docstring), merged.
    ``metadata``: Parquet metadata by path, filled and reused across calls (one footer read per
    file for a whole stream)."""
    metadata = {} if metadata is None else metadata
    ranges: Extents = {}
    for piece in spec.pieces:
        for path, start, end in _piece_ranges(piece, open_footer, metadata):
            ranges.setdefault(path, []).append((start, end))
    return {path: _merged(found) for path, found in ranges.items()}


def union(extents: Iterable[Extents]) -> Extents:
    """The ranges of every ``Extents`` given, merged per file."""
    out: Extents = {}
    for one in extents:
        for path, found in one.items():
            out.setdefault(path, []).extend(found)
    return {path: _merged(found) for path, found in out.items()}


def num_bytes(extents: Extents) -> int:
    """Bytes the ranges cover, over all files."""
    return sum(end - start for found in extents.values() for start, end in found)


def _piece_ranges(piece: Piece, open_footer: OpenFooter, metadata: dict[str, Any]) -> list[tuple[str, int, int]]:
    if piece.kind == "jsonl":
        end = piece.end_offset if piece.end_offset >= 0 else piece.size
        return [(piece.path, piece.byte_offset, end)]
    if piece.kind == "text":
        return [(path, 0, _size(path, piece, open_footer)) for path in piece.files]
    if piece.kind != "parquet":  # Arrow IPC: counted whole
        return [(piece.path, 0, _size(piece.path, piece, open_footer))]
    meta = metadata.get(piece.path)
    if meta is None:
        with open_footer(piece.path) as f:
            meta = metadata[piece.path] = (pq.ParquetFile(f).metadata, f.size())
    return [(piece.path, start, end) for start, end in parquet_ranges(*meta, piece)]


def parquet_ranges(meta: Any, size: int, piece: Piece) -> list[tuple[int, int]]:
    """The footer and the column chunks (of the format's columns) of the row groups that rows
    [start_row, start_row + num_rows) of the file touch."""
    columns = set(FORMAT_COLUMNS[piece.format])
    out = [(size - 8 - meta.serialized_size, size)]
    first, lo, hi = 0, piece.start_row, piece.start_row + piece.num_rows
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if first < hi and first + group.num_rows > lo:
            for c in range(group.num_columns):
                chunk = group.column(c)
                if chunk.path_in_schema.split(".")[0] in columns:
                    start = min(o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o is not None)
                    out.append((start, start + chunk.total_compressed_size))
        first += group.num_rows
    return out


def _size(path: str, piece: Piece, open_footer: OpenFooter) -> int:
    if piece.size >= 0 and piece.files in ((), (path,)):
        return piece.size
    with open_footer(path) as f:
        return f.size()


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        elif end > start:
            out.append((start, end))
    return out
