"""Input file I/O: the one place the readers of ``inputs/`` open an input file.

Scanning (scan.py), decoding Parquet and Arrow (columnar.py) and reading a window's rows
(read.py) open input files only through these functions, so that routing inputs through
``packfeed.service.storage`` (URIs on object stores, ranged and counted reads) changes this
module, not the readers. Today every input is a local path. Finding files (files.py) lists
directories and follows links with ``os`` and ``glob``, and reads a saved dataset's
``state.json`` with ``packed.writer.read_json_object``: the listing side, not the data.
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO


def open_input(path: str) -> BinaryIO:
    """A seekable binary file: JSONL read line by line from a seek offset, a whole text file,
    a JSONL file scanned in chunks. Raises OSError (with its errno) as ``open`` does."""
    return open(path, "rb")


def open_arrow_input(path: str, kind: str) -> Any:
    """A seekable pyarrow file for a ``parquet`` or ``arrow`` (IPC) file. Arrow IPC is memory
    mapped, so its record batches are zero-copy views of the file; Parquet is read with plain
    reads of the footer and of the row groups asked for, as ``pyarrow.parquet`` opens a path."""
    import pyarrow as pa

    return pa.memory_map(path, "r") if kind == "arrow" else pa.OSFile(path, "rb")


def input_size(path: str) -> int:
    """The file's size in bytes."""
    return os.path.getsize(path)
