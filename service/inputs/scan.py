"""Scanning input files: each file's row count and, for JSONL, the byte offsets to seek to.

Stage contract (docs/design.md)::

    (uri, kind, identity) ──scan_file──▶ FileScan     (one file, in this process)
    newlines of byte ranges, in file order ──SeekFinder──▶ rows, seek offsets
                                          (a large file counted in parallel: scan_tasks.py)

Files are read through fileio.py (a local path or any URI: ``packfeed.service.storage``):
JSONL in ``SCAN_CHUNK`` reads (on a store: one HEAD, then a ranged GET per chunk), Parquet
from its footer only (one HEAD and one or two GETs), Arrow IPC from its file footer and the
batches' headers (ipc_footer.py; a stream, which has no footer, is read whole).

A file's seek points are rows r with (first_row + r) % stride == 0 (``first_row``: the file's
first row within its source), so they fall on the source's block boundaries; row 0 always is
one. They are kept as one int64 offset per ``stride`` rows: the rows themselves follow from
``seek_phase = (-first_row) % stride`` and the stride. For first_row 5, stride 4: phase 3, seek
rows 0, 3, 7, 11, ...

Cost: counting reads a file once; numpy finds the newlines of each chunk
(``flatnonzero(chunk == 10)``, faster than ``bytes.count``, so a count first would only add to
it). ``SeekFinder`` combines newline positions found piece by piece,
in file order, into exactly the offsets one sequential pass finds.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packfeed.service.inputs.fileio import open_arrow_input, open_input
from packfeed.service.inputs.ipc_footer import ipc_file_rows
from packfeed.service.storage import ObjectInfo, StorageError, check_unchanged, display, is_remote, stat

SCAN_CHUNK = 8 << 20
MAX_SEEK_STRIDE = 4096  # rows between JSONL seek points when blocks are larger (or off)


@dataclass(frozen=True, slots=True)
class FileScan:
    """A file's row count, its identity as scanned (``size``, ``mtime_ns``, ``etag``: -1/None
    where unknown), and for JSONL the byte offsets of its seek points (module docstring):
    ``seek_offsets[0]`` is row 0's, ``seek_offsets[i]`` (i >= 1) row ``seek_phase + (i - 1) *
    seek_stride`` when the phase is not 0, else row ``i * seek_stride``. Other kinds keep
    ``seek_stride`` 0 and the one offset 0."""

    path: str
    kind: str
    num_rows: int
    size: int = -1
    mtime_ns: int = -1
    etag: str | None = None
    seek_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    seek_phase: int = 0
    seek_stride: int = 0

    def seek(self, row: int) -> tuple[int, int]:
        """(seek row, its byte offset): the last seek point at or before ``row``."""
        stride, phase = self.seek_stride, self.seek_phase
        if stride == 0:
            return 0, 0
        if phase == 0:
            i = row // stride
            return i * stride, int(self.seek_offsets[i])
        if row < phase:
            return 0, 0
        i = (row - phase) // stride
        return phase + i * stride, int(self.seek_offsets[i + 1])

    def end_offset(self, row: int) -> int:
        """A byte offset at or past the end of the rows before ``row``: the offset of the first
        seek point at or after ``row``, else the file's size (-1: not known). A reader of rows
        up to ``row`` need not read past it."""
        stride, phase = self.seek_stride, self.seek_phase
        if row <= 0:
            return 0
        if stride:
            ahead = -(-(row - phase) // stride)  # seek points (after row 0) from ``phase`` on, ceil
            i = ahead if phase == 0 else 1 + max(0, ahead)
            if i < len(self.seek_offsets):
                return int(self.seek_offsets[i])
        return self.size

    def info(self) -> ObjectInfo:
        """The identity the scan saw, as the storage layer compares it."""
        return ObjectInfo(self.path, None if self.size < 0 else self.size,
                          None if self.mtime_ns < 0 else self.mtime_ns, etag=self.etag)


def recorded_identity(path: str, info: ObjectInfo | None) -> ObjectInfo:
    """The identity a scan records for ``path``: the listing's ``info``, completed by a stat.

    A store's listing through pyarrow carries no ETag, and its mtime is compared to the second:
    an object rewritten at the same size within that second would pass for the planned one.
    One HEAD per scanned object (no data bytes) records the ETag, so the reads check it."""
    if info is None:
        return stat(path)
    if info.etag is None and info.version is None and is_remote(path):
        now = stat(path)
        check_unchanged(info, now)  # listed, then rewritten before this scan
        return now
    return info


def identity_fields(info: ObjectInfo) -> dict:
    """``FileScan``'s identity fields from a listing's or a stat's ``info`` (-1/None: unknown)."""
    return dict(size=-1 if info.size is None else info.size, mtime_ns=-1 if info.mtime_ns is None else info.mtime_ns,
                etag=info.etag)


def seek_phase(first_row: int, stride: int) -> int:
    return (-first_row) % stride if stride else 0


class SeekFinder:
    """Folds a JSONL file's newlines, piece by piece in file order, into its row count and the
    offsets of its seek points. A row is a line: n newlines give n rows, plus one if the file
    does not end with a newline; row r >= 1 starts right after newline r - 1 (0-based)."""

    def __init__(self, phase: int, stride: int) -> None:
        self.phase, self.stride = phase, stride
        self.newlines = 0
        self.ends_with_newline = False
        self._parts = [np.zeros(1, np.int64)]

    def add(self, base: int, positions: np.ndarray, end: int) -> None:
        """The newlines of bytes [base, end) of the file, at ``base + positions`` (ascending)."""
        first = (self.phase - self.newlines - 1) % self.stride  # the first newline a seek point follows
        if first < len(positions):
            self._parts.append(positions[first::self.stride].astype(np.int64) + (base + 1))
        self.newlines += len(positions)
        if end > base:
            self.ends_with_newline = len(positions) > 0 and base + int(positions[-1]) == end - 1

    def finish(self, size: int) -> tuple[int, np.ndarray]:
        """(rows, seek offsets) of a file of ``size`` bytes, all of it added."""
        num_rows = self.newlines + (1 if size > 0 and not self.ends_with_newline else 0)
        offsets = np.concatenate(self._parts)
        return num_rows, offsets[(offsets < size) | (np.arange(len(offsets)) == 0)]


def newline_positions(chunk: bytes) -> np.ndarray:
    """Positions of the newlines in ``chunk`` (int64, ascending)."""
    return np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10)


def scan_file(path: str, kind: str, *, first_row: int = 0, stride: int = MAX_SEEK_STRIDE,
              info: ObjectInfo | None = None) -> FileScan:
    """Scan one file (a local path or a URI) in this process. ``info``: its identity as listed;
    the read fails, naming the file, if it is another version now. Errors name the file."""
    with scan_errors(path, kind):
        expect = recorded_identity(path, info)
        identity = identity_fields(expect)
        if kind == "jsonl":
            finder = SeekFinder(seek_phase(first_row, stride), stride)
            size = 0
            with open_input(path, expect=expect) as f:
                while chunk := f.read(SCAN_CHUNK):
                    finder.add(size, newline_positions(chunk), size + len(chunk))
                    size += len(chunk)
            num_rows, offsets = finder.finish(size)
            return FileScan(path, kind, num_rows, **identity, seek_offsets=offsets, seek_phase=finder.phase,
                            seek_stride=stride)
        return FileScan(path, kind, count_rows(path, kind, expect), **identity)


def count_rows(path: str, kind: str, expect: ObjectInfo | None = None) -> int:
    """Rows of a non-JSONL file: a text file is one (an empty one none); Parquet from its footer;
    Arrow IPC from its footer and batch headers (a file, ipc_footer.py) or its batches (a
    stream: read whole, on a store in ``SCAN_CHUNK`` requests)."""
    size = expect.size if expect is not None and expect.size is not None else stat(path).size
    if size == 0:  # an export never finished: no rows (the plan warns), not a corrupt file
        return 0
    if kind == "text":
        return 1
    if kind == "arrow":
        rows = ipc_file_rows(path, size, expect=expect)
        if rows is not None:
            return rows
    with open_arrow_input(path, kind, expect=expect) as f:
        if kind == "parquet":
            return pq.ParquetFile(f).metadata.num_rows
        source = pa.PythonFile(ReadAhead(f), mode="r") if is_remote(path) else f
        try:
            return sum(batch.num_rows for batch in pa.ipc.open_stream(source))
        except pa.ArrowInvalid as e:
            raise ValueError(f"input {display(path)!r}: not an Arrow IPC file or stream ({e})") from None


class ReadAhead:
    """Forward reads of a file on a store in requests of at least ``SCAN_CHUNK`` bytes: an Arrow
    IPC stream is read message by message, a few small reads each, which would otherwise be a
    GET each. (pyarrow's ``BufferedInputStream`` allocates whatever size a message header
    claims: seconds and GBs for a corrupt one; here a read never asks past the file's end.)"""

    def __init__(self, f) -> None:
        self._f = f
        self._buffer = b""
        self._at = 0  # of the next byte in _buffer
        self._position = 0
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            out = self._buffer[self._at:] + self._f.read()
            self._buffer, self._at = b"", 0
        else:
            if self._at + n > len(self._buffer):
                rest = self._buffer[self._at:]
                self._buffer, self._at = rest + self._f.read(max(SCAN_CHUNK, n - len(rest))), 0
            out = self._buffer[self._at:self._at + n]
            self._at += len(out)
        self._position += len(out)
        return out

    def tell(self) -> int:
        return self._position

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


@contextmanager
def scan_errors(path: str, kind: str) -> Iterator[None]:
    """A failure to read ``path`` as one line naming it. pyarrow's errors (ArrowInvalid, ...; a
    plain OSError without errno for a truncated stream) mean a corrupt or truncated file; an
    OSError with an errno is the filesystem's; a StorageError names the object already."""
    try:
        yield
    except StorageError:
        raise
    except Exception as e:
        if type(e).__module__.startswith("pyarrow") or (isinstance(e, OSError) and e.errno is None):
            raise ValueError(f"input {display(path)!r}: not a readable {kind} file ({e}); re-export it or leave "
                             "it out") from None
        if isinstance(e, OSError):
            raise ValueError(f"input {display(path)!r}: cannot read it ({e.strerror or e})") from None
        raise
