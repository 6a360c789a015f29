"""Reads by byte range: coalesced, checked against the plan's version, retried, counted.

Costs on an object store:

- ``read_range``: one HEAD (the open) + one GET. ``read_ranges``: one HEAD + one GET per
  coalesced span: ranges closer than ``max_gap`` merge (the gap's bytes cost less than a
  round trip: 1 MiB is ~10 ms at 100 MB/s), up to ``max_request`` bytes a span, so one
  request never buffers more than that beyond a single range's own size.
- ``open_input``: one HEAD; the file it returns reads by ranged GETs, each retried and counted
  (a Parquet reader reads its footer and the row groups it needs, never the whole object).

``expect`` (an ``ObjectInfo`` from the plan) makes a read fail, naming the object, when the
object changed since (``objects.check_unchanged``), at no extra request: the open's HEAD
answers it.

Short reads follow ``pread``: a range past the end of the object gives the bytes up to it.

A request asks for ``MIN_REQUEST`` bytes at least (4 KiB, where the object has them), and the
range asked for is cut out of the answer: pyarrow writes a ranged GET's answer into a buffer
of the range's size, so an error answering a shorter GET (a 503 SlowDown, a 403 AccessDenied:
~150-500 bytes of XML) overflows it and its status is lost ("Failed to flush response
stream"); measured on moto through the fault proxy, 200 bytes suffice for its bodies. With the
status read, throttling is retried and slowed down for (retry.py), and a denied read fails on
its first answer.
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from packfeed.service.storage.objects import ObjectInfo, check_unchanged, info_of_open, open_native
from packfeed.service.storage.redact import display
from packfeed.service.storage.retry import COUNTERS, call
from packfeed.service.storage.uri import is_remote, scheme_of

DEFAULT_MAX_GAP = 1 << 20
DEFAULT_MAX_REQUEST = 64 << 20
MIN_REQUEST = 4 << 10


def read_range(uri: str, offset: int, length: int, *, expect: ObjectInfo | None = None) -> bytes:
    """``length`` bytes of ``uri`` from ``offset`` (fewer past its end)."""
    return read_ranges(uri, [(offset, length)], expect=expect)[0]


def read_ranges(uri: str, ranges: Sequence[tuple[int, int]], *, max_gap: int = DEFAULT_MAX_GAP,
                max_request: int = DEFAULT_MAX_REQUEST, expect: ObjectInfo | None = None) -> list[bytes]:
    """The bytes of each ``(offset, length)`` of ``uri``, in the order given: one open, then
    one request per span of ``coalesce(ranges, ...)``."""
    if any(offset < 0 or length < 0 for offset, length in ranges):
        raise ValueError(f"{display(uri)}: byte ranges need offset >= 0 and length >= 0, got {list(ranges)}")
    return _read_open(uri, open_native(uri), ranges, max_gap=max_gap, max_request=max_request, expect=expect)


def _read_open(uri: str, handle: pa.NativeFile, ranges: Sequence[tuple[int, int]], *, max_gap: int,
               max_request: int, expect: ObjectInfo | None) -> list[bytes]:
    size = handle.size()
    if expect is not None:
        check_unchanged(expect, info_of_open(uri, handle))
    clamped = [(min(offset, size), max(0, min(offset + length, size) - min(offset, size))) for offset, length in ranges]
    out: list[bytes] = [b""] * len(ranges)
    remote = is_remote(uri)
    for start, end, members in coalesce_members(clamped, max_gap=max_gap, max_request=max_request):
        data = call(display(uri), "read", lambda: _read_at(handle, start, end, size, remote), scheme=scheme_of(uri),
                    remote=remote)
        for i in members:
            offset, length = clamped[i]
            out[i] = data[offset - start:offset - start + length]
    return out


def _read_at(handle: pa.NativeFile, start: int, end: int, size: int, remote: bool) -> bytes:
    """Bytes ``[start, end)`` of an object of ``size`` bytes: on a store by a request of at
    least ``MIN_REQUEST`` bytes around them (module docstring). The wire bytes are counted."""
    if not remote or end - start >= MIN_REQUEST:
        data = handle.read_at(end - start, start)
        if remote:
            COUNTERS.add(bytes_read=len(data))
        return data
    high = min(size, start + MIN_REQUEST)
    low = max(0, high - MIN_REQUEST)
    data = handle.read_at(high - low, low)
    COUNTERS.add(bytes_read=len(data))
    return data[start - low:end - low]


def coalesce(ranges: Sequence[tuple[int, int]], *, max_gap: int = DEFAULT_MAX_GAP,
             max_request: int = DEFAULT_MAX_REQUEST) -> list[tuple[int, int]]:
    """The ``(start, end)`` spans ``read_ranges`` requests for ``(offset, length)`` ranges.

    For ranges (0,10), (15,5), (100,10) with max_gap=5: spans (0,20), (100,110)."""
    return [(start, end) for start, end, _ in coalesce_members(ranges, max_gap=max_gap, max_request=max_request)]


def coalesce_members(ranges: Sequence[tuple[int, int]], *, max_gap: int,
                     max_request: int) -> list[tuple[int, int, list[int]]]:
    """``coalesce``, with the indices of the ranges each span holds. Empty ranges join no span.
    A range joins the previous span when the gap to it is at most ``max_gap`` (overlaps
    included) and the span stays within ``max_request`` bytes; a range longer than that is a
    span of its own."""
    spans: list[tuple[int, int, list[int]]] = []
    for i in sorted((i for i, (_, length) in enumerate(ranges) if length > 0), key=lambda i: ranges[i]):
        start, end = ranges[i][0], ranges[i][0] + ranges[i][1]
        if spans:
            span_start, span_end, members = spans[-1]
            if start - span_end <= max_gap and max(end, span_end) - span_start <= max_request:
                members.append(i)
                spans[-1] = (span_start, max(end, span_end), members)
                continue
        spans.append((start, end, [i]))
    return spans


def read_bytes(uri: str, *, expect: ObjectInfo | None = None) -> bytes:
    """The whole of ``uri`` (for small metadata files: a manifest, stats.json)."""
    handle = open_native(uri)
    return _read_open(uri, handle, [(0, handle.size())], max_gap=0, max_request=DEFAULT_MAX_REQUEST, expect=expect)[0]


def open_input(uri: str, *, expect: ObjectInfo | None = None) -> pa.NativeFile:
    """A random-access file on ``uri`` (for ``pyarrow.parquet.ParquetFile``, ``pyarrow.ipc``).
    On a store every read is a ranged GET under the retry policy, counted."""
    handle = open_native(uri)
    if expect is not None:
        check_unchanged(expect, info_of_open(uri, handle))
    if not is_remote(uri):
        return handle
    return pa.PythonFile(_RetryingReader(uri, handle), mode="r")


class RangeReader:
    """A read-only, seekable file of ``size`` bytes for ``pa.PythonFile``: the position and the
    file protocol; a subclass reads ``[start, end)`` (``read_range``) and closes its source
    (``close``, after this one's)."""

    def __init__(self, size: int) -> None:
        self._size, self._position, self.closed = size, 0, False

    def read_range(self, start: int, end: int) -> bytes:
        raise NotImplementedError

    def read(self, nbytes: int = -1) -> bytes:
        end = self._size if nbytes is None or nbytes < 0 else min(self._size, self._position + nbytes)
        if end <= self._position:
            return b""
        data = self.read_range(self._position, end)
        self._position += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self._position = {0: 0, 1: self._position, 2: self._size}[whence] + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


class _RetryingReader(RangeReader):
    """The file-like object behind ``open_input`` on a store: each read one ranged GET under
    the retry policy (the native handle's reads are stateless, so a retry is safe)."""

    def __init__(self, uri: str, handle: pa.NativeFile) -> None:
        super().__init__(handle.size())
        self._uri, self._handle, self._scheme = uri, handle, scheme_of(uri)
        self._tallies = COUNTERS.tallies()  # a read on another thread (pyarrow's) counts for the opener's too

    def read_range(self, start: int, end: int) -> bytes:
        with COUNTERS.counting_for(self._tallies):
            return call(display(self._uri), "read", lambda: _read_at(self._handle, start, end, self._size, True),
                        scheme=self._scheme)

    def close(self) -> None:
        super().close()
        self._handle.close()
