"""Parquet and Arrow IPC inputs: tables for ranges of rows, reading only what the ranges need.

A window reads only what its pieces need, with only the columns the sample format reads:

- Parquet: the footer, then the row groups its row ranges touch (``ParquetFile`` over a
  random-access file: on a store, ranged GETs of those column chunks), each decoded once.
- Arrow IPC (file or stream format: the file format is a stream with a footer): the schema,
  then the record batches' messages from the first batch a range needs to the last, decoding
  only the batches the ranges touch. Where each batch starts (byte offset, first row) is learnt
  as batches are read and kept per file version in this process (``INDEX_CACHE_FILES`` files):
  the first read of a file reads from its start, a later one goes straight to its batches and
  seeks past the batches it does not need. On a store the messages are read through a buffer
  (a message's metadata and body would be a GET each): one read of exactly the batches wanted
  where they are known, else reads of ``fileio.FIRST_CHUNK``; a local file is memory mapped
  (zero copy). A schema with dictionary-encoded columns is read from the start
  every time (a batch needs the dictionaries sent before it).
"""

from __future__ import annotations

import array
import bisect
import threading
from collections import OrderedDict
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packfeed.client.offsets import offsets_of, starts_of
from packfeed.service import storage
from packfeed.service.inputs.fileio import FIRST_CHUNK, MAX_CHUNK, open_arrow_input

FORMAT_COLUMNS = {
    "text": ("text",),
    "prompt_completion": ("prompt", "completion", "tools"),
    "messages": ("messages", "tools"),
    "auto": ("messages", "prompt", "completion", "text", "tools"),
}
INDEX_CACHE_FILES = 1024


def read_columnar(path: str, kind: str, ranges: list[tuple[int, int]], fmt: str, *,
                  expect: storage.ObjectInfo | None = None) -> list[Any]:
    """One table per row range [lo, hi) of a Parquet/Arrow file, decoding every row group or
    batch the ranges touch once, with only the columns the format reads. ``expect``: the
    version planned (fileio.py); another one raises ``storage.StorageError`` naming the file."""
    if kind == "parquet":
        return _read_parquet(path, ranges, fmt, expect)
    batches = _arrow_batches_for(path, ranges, expect)  # (first row, batch), ascending
    names = batches[0][1].schema.names if batches else []
    columns = [c for c in FORMAT_COLUMNS[fmt] if c in names]
    out = []
    for lo, hi in ranges:
        parts = [b.select(columns).slice(max(lo - r, 0), min(hi, r + b.num_rows) - max(lo, r))
                 for r, b in batches if lo < r + b.num_rows and hi > r]
        out.append(pa.Table.from_batches(parts) if parts else None)
    return out


def _read_parquet(path: str, ranges: list[tuple[int, int]], fmt: str, expect: storage.ObjectInfo | None) -> list[Any]:
    with open_arrow_input(path, "parquet", expect=expect) as source:
        pf = pq.ParquetFile(source)
        sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
        names = pf.schema_arrow.names
        columns = [c for c in FORMAT_COLUMNS[fmt] if c in names]
        starts = offsets_of(sizes)
        needed = sorted({g for lo, hi in ranges for g in range(_group_of(starts, lo), _group_of(starts, hi - 1) + 1)})
        table = pf.read_row_groups(needed, columns=columns)
    # The needed groups sit back to back in ``table``: file row r of group g is table row
    # r - starts[g] + (rows of the needed groups before g).
    before = dict(zip(needed, starts_of([sizes[g] for g in needed]).tolist()))

    def table_row(r: int) -> int:
        g = _group_of(starts, r)
        return before[g] + r - int(starts[g])

    return [table.slice(table_row(lo), hi - lo) for lo, hi in ranges]


def _arrow_batches_for(path: str, ranges: list[tuple[int, int]],
                       expect: storage.ObjectInfo | None) -> list[tuple[int, Any]]:
    """(first row, batch) of the batches of an Arrow IPC file or stream that the ranges touch,
    decoded message by message from where the file's index (``_ArrowIndex``) says to start."""
    last = max(hi for _, hi in ranges)

    def touched(row: int, n: int) -> bool:
        return any(lo < row + n and hi > row for lo, hi in ranges)

    key = (path, expect) if expect is not None else None  # an index is kept for a known version only
    remote = storage.is_remote(path)
    out = []
    with open_arrow_input(path, "arrow", expect=expect) as source:
        index = _INDEXES.get(key) or _ArrowIndex.read_head(path, source, remote)
        if index.dictionaries:  # a batch needs the dictionaries sent before it: read from the start
            source.seek(index.base)
            stream = _sequential(source, remote, MAX_CHUNK)
            try:
                row = 0
                for batch in pa.ipc.open_stream(stream):
                    if touched(row, batch.num_rows):
                        out.append((row, batch))
                    row += batch.num_rows
                    if row >= last:
                        break
            finally:
                _release(stream)
            return out
        i = max(0, bisect.bisect_right(index.starts, min(lo for lo, _ in ranges)) - 1)
        stream = messages = None
        try:
            while index.starts[i] < last:
                if i + 1 < len(index.starts) and not touched(index.starts[i], index.starts[i + 1] - index.starts[i]):
                    i, stream, messages = i + 1, _release(stream), None  # a batch known not to be wanted: seek past it
                    continue
                if messages is None:
                    source.seek(index.offsets[i])
                    stream = _sequential(source, remote, index.known_span(i, last, touched) or FIRST_CHUNK)
                    messages = pa.ipc.MessageReader.open_stream(stream)
                try:
                    message = messages.read_next_message()
                except StopIteration:
                    break
                batch = pa.ipc.read_record_batch(message, index.schema)
                if i + 1 == len(index.starts):
                    index.learn(index.prefix + message.metadata.size + message.body.size, batch.num_rows)
                if touched(index.starts[i], batch.num_rows):
                    out.append((index.starts[i], batch))
                i += 1
        finally:
            _release(stream)
    if key is not None:
        _INDEXES.put(key, index)
    return out


def _sequential(source: Any, remote: bool, buffer_size: int) -> Any:
    """``source`` for reading forward from where it is: on a store, in reads of at least
    ``buffer_size`` bytes (a message's metadata and body would be a GET each, ~4 a batch);
    a local memory map as it is (zero copy). Hand it to ``_release`` when done."""
    return pa.BufferedInputStream(source, buffer_size) if remote else source


def _release(stream: Any) -> None:
    """Let go of a ``_sequential`` stream without closing its source (a buffered stream closes
    the file under it when it is dropped)."""
    if isinstance(stream, pa.BufferedInputStream):
        stream.detach()


class _ArrowIndex:
    """Where the record batches of an Arrow IPC file or stream start: batch i's message at byte
    ``offsets[i]``, its first row ``starts[i]``; the last entry is where the batch after the
    last one learnt would start. Learnt as batches are read (an IPC file's footer lists its
    batches' positions, not their rows; a stream has no footer). ``base``: where the stream of
    messages starts (8 in the file format), ``prefix``: a message's length prefix in bytes."""

    HEAD_BYTES = 64 << 10  # one read holds the magic and the schema message

    def __init__(self, schema: Any, base: int, prefix: int, first_offset: int) -> None:
        self.schema, self.base, self.prefix = schema, base, prefix
        self.dictionaries = any(pa.types.is_dictionary(f.type) for f in schema)
        self.offsets, self.starts = array.array("q", [first_offset]), array.array("q", [0])

    @classmethod
    def read_head(cls, path: str, source: Any, remote: bool) -> "_ArrowIndex":
        """The schema, and where the first batch starts: after "ARROW1\\0\\0" in the file format,
        and the schema message (its length prefix 8 bytes, 4 in the pre-1.0 format)."""
        source.seek(0)
        head = source.read(12)
        base = 8 if head[:6] == b"ARROW1" else 0
        prefix = 8 if head[base:base + 4] == b"\xff\xff\xff\xff" else 4
        source.seek(base)
        stream = _sequential(source, remote, cls.HEAD_BYTES)
        try:
            message = pa.ipc.MessageReader.open_stream(stream).read_next_message()
            schema = pa.ipc.read_schema(message)
        except (pa.ArrowInvalid, StopIteration) as e:
            raise ValueError(f"input {storage.display(path)!r}: not an Arrow IPC file or stream ({e})") from None
        finally:
            _release(stream)
        return cls(schema, base, prefix, base + prefix + message.metadata.size + message.body.size)

    def known_span(self, i: int, last: int, touched: Callable[[int, int], bool]) -> int:
        """Bytes of the known batches from batch ``i`` on that a read wants next: up to the
        first one not ``touched`` or starting at row ``last``; 0 when they reach past what is
        known (the read is then sized blind)."""
        j = i
        starts = self.starts
        while j + 1 < len(starts) and starts[j] < last and touched(starts[j], starts[j + 1] - starts[j]):
            j += 1
        if j + 1 == len(self.starts) and self.starts[j] < last:
            return 0
        return self.offsets[j] - self.offsets[i]

    def copy(self) -> "_ArrowIndex":
        other = _ArrowIndex.__new__(_ArrowIndex)
        other.__dict__.update(self.__dict__, offsets=array.array("q", self.offsets),
                              starts=array.array("q", self.starts))
        return other

    def learn(self, message_bytes: int, num_rows: int) -> None:
        """The batch after the last one known took ``message_bytes`` and holds ``num_rows``."""
        self.offsets.append(self.offsets[-1] + message_bytes)
        self.starts.append(self.starts[-1] + num_rows)


class _IndexCache:
    """``_ArrowIndex`` per Arrow IPC file version, for the ``INDEX_CACHE_FILES`` files used last
    (16 bytes a batch): a later window of a file goes straight to its batches. A reader gets a
    copy to learn into; the one that learnt most is kept (threads never share one)."""

    def __init__(self) -> None:
        self._indexes: OrderedDict[tuple, _ArrowIndex] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple | None) -> _ArrowIndex | None:
        with self._lock:
            index = self._indexes.get(key) if key is not None else None
            if index is None:
                return None
            self._indexes.move_to_end(key)
            return index.copy()

    def put(self, key: tuple, index: _ArrowIndex) -> None:
        with self._lock:
            kept = self._indexes.get(key)
            if kept is None or len(kept.starts) < len(index.starts):
                self._indexes[key] = index
            self._indexes.move_to_end(key)
            while len(self._indexes) > INDEX_CACHE_FILES:
                self._indexes.popitem(last=False)


_INDEXES = _IndexCache()


def _group_of(starts: np.ndarray, row: int) -> int:
    return int(np.searchsorted(starts, row, side="right")) - 1
