"""Input file I/O: where the readers of ``inputs/`` open input files, and read JSONL by range.

Every input, a local path or a URI (``s3://``, ``gs://``, ...), is opened through
``packfeed.service.storage``: on a store every read is a ranged GET, retried and counted
(``storage.COUNTERS``); a local file is read through pyarrow's local filesystem by the same
code. Measured on a 200 MB JSONL file (1 KB lines, 2 shared cores): windows of 8,192 rows read
and ``json.loads``-ed (read.py now decodes with msgspec) in 0.64 s, as with Python's ``open``
and line iteration; splitting the lines alone costs ~0.5 ms/MB more (0.17-0.25 s against
0.10 s), shuffled blocks of 64 rows the same as before.

What reading costs on a store (a request is a round trip, ~10-100 ms on S3):

- JSONL (``read_line_runs``): one HEAD per file and window, then GETs of ``MIN_CHUNK`` to
  ``MAX_CHUNK`` bytes from the seek offset of the first run, sized by the lines still wanted
  times the mean line length (from the runs' seek points, then from the lines read). Runs of
  one file are read in row order by one cursor: the next run continues the same reads when
  its seek point is at most ``MAX_GAP`` bytes past the last (reading ~1 MiB costs about what a
  round trip does) and that gap is no larger than the run (so at most half of what is read is
  passed over), and one GET is sized to reach the end of all the runs read so. A read never
  passes where the plan says a run's lines end (``end_offset``: the next seek point, or the
  file's end). Bytes read: the runs' bytes, the lines passed after each seek (none when blocks
  start on seek points, as the plan's stride makes them), the gaps read through, and, where no
  end is known, 10% to spare and at most one chunk (``FIRST_CHUNK`` when no length is known)
  past the last line. Memory: one chunk plus the longest line, whatever the object's size. On a
  local file runs never read through a gap: a seek costs nothing there.
- Parquet and Arrow IPC (columnar.py): HEAD, the footer or schema, then the column chunks or
  record batches asked for (columnar.py says how Arrow batches are found).
- Text files: HEAD and one GET of the whole file (a file is one document).

Every read of an input on a store whose version the plan knows goes through the read caches
(``open_input``): this process's memory (read_cache.py, 256 MiB) and the node's disk
(disk_cache.py, 1 GiB), keyed by the object's version; only what neither holds is fetched, so
the costs above are those of a first read. The scan's reads fill them, so on one node a pack
reads each input byte from the store about once (bench/bench_storage.py: 5.56x before, 1.00x).

``expect`` (``identity``: what the plan saw) makes the open fail, naming the file, when the
object changed since ("changed since it was planned"), at no extra request: the open's HEAD
answers it. Without it (an old plan, a text piece of several files) nothing is compared.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from packfeed.service import storage
from packfeed.service.inputs.read_cache import CachedFile, cache_key, shared_cache, shared_disk_cache

FIRST_CHUNK = 1 << 20  # a read before any line length is known: ~one round trip's worth at 100 MB/s
MIN_CHUNK = 64 << 10  # a read once the mean line length is known (estimates carry 10% to spare)
MAX_CHUNK = 8 << 20
MAX_GAP = 1 << 20  # bytes a cursor reads through rather than seek to the next run


def identity(path: str, *, size: int = -1, mtime_ns: int = -1, etag: str | None = None) -> storage.ObjectInfo | None:
    """The version of ``path`` a plan saw, for ``expect``; None when it recorded none (-1/None: unknown)."""
    if size < 0 and mtime_ns < 0 and etag is None:
        return None
    return storage.ObjectInfo(path, size if size >= 0 else None, mtime_ns if mtime_ns >= 0 else None, etag=etag)


def open_input(path: str, *, expect: storage.ObjectInfo | None = None) -> Any:
    """A seekable binary file (``read``, ``seek``, ``size``; a context manager) on a local path
    or a URI. Raises ``storage.StorageError`` (one line naming the file) when it cannot be opened
    or changed since ``expect``. On a store, with the version known (``expect``), its reads go
    through this process's ``read_cache``: bytes read before are not fetched again."""
    f = storage.open_input(path, expect=expect)
    key = cache_key(path, expect) if storage.is_remote(path) else None
    if key is None:
        return f
    cache, disk = shared_cache(), shared_disk_cache()
    if not cache.capacity and disk is None:
        return f
    return pa.PythonFile(CachedFile(f, key, cache, disk), mode="r")


def open_arrow_input(path: str, kind: str, *, expect: storage.ObjectInfo | None = None) -> Any:
    """A random-access pyarrow file for a ``parquet`` or ``arrow`` (IPC) file. A local Arrow IPC
    file is memory mapped (its record batches are zero-copy views); anything else reads the
    byte ranges pyarrow asks for."""
    if kind == "arrow" and not storage.is_remote(path):
        source = open_input(path, expect=expect)  # the check, and one error for a missing file
        source.close()
        return pa.memory_map(storage.resolve(path)[1], "r")
    return open_input(path, expect=expect)


def read_whole(path: str, *, expect: storage.ObjectInfo | None = None) -> bytes:
    """The whole file (a text input: one document)."""
    return storage.read_bytes(path, expect=expect)


class LineRun(NamedTuple):
    """Lines ``start_row`` to ``start_row + num_rows`` of a file, reached from a seek point:
    line ``seek_row`` (<= ``start_row``) starts at byte ``byte_offset``; none of the lines
    reaches past ``end_offset`` (the next seek point or the file's end; -1: not known)."""

    seek_row: int
    byte_offset: int
    start_row: int
    num_rows: int
    end_offset: int = -1


def read_line_runs(path: str, runs: Sequence[LineRun], *,
                   expect: storage.ObjectInfo | None = None) -> list[list[bytes]]:
    """The lines of each run of ``path``, in the order given, each with its "\\n" (the last line of
    a file may have none): as iterating over the file opened in binary mode splits them. One
    open for all runs; the module docstring says what it reads. A run past the end of the file
    gives the lines there are."""
    out: list[list[bytes]] = [[] for _ in runs]
    max_gap = MAX_GAP if storage.is_remote(path) else 0  # a local seek costs nothing
    order = sorted(range(len(runs)), key=lambda i: (runs[i].start_row, i))
    with open_input(path, expect=expect) as f:
        cursor = _LineCursor(f, mean_line=_seek_point_mean(runs))
        for k, i in enumerate(order):
            run = runs[i]
            ahead = k > 0 and cursor.row <= run.start_row and (
                run.seek_row <= cursor.row or _read_through(run.byte_offset - cursor.offset, run, max_gap))
            if not ahead:  # a new span of runs read without a seek: one read is sized for all of it
                cursor.seek(run.seek_row, run.byte_offset)
                cursor.reach, cursor.cap = _reach(cursor.mean_line(), (runs[j] for j in order[k:]), max_gap)
            cursor.lines(run.start_row - cursor.row, keep=False, then=run.num_rows)
            out[i] = cursor.lines(run.num_rows, keep=True)
    return out


def _seek_point_mean(runs: Sequence[LineRun]) -> float | None:
    """Bytes per line between the runs' seek points (the plan's own measure of the file), or None
    when they share one."""
    points = {(r.seek_row, r.byte_offset) for r in runs}
    (row_lo, offset_lo), (row_hi, offset_hi) = min(points), max(points)
    return (offset_hi - offset_lo) / (row_hi - row_lo) if row_hi > row_lo else None


def _read_through(gap: int, run: LineRun, max_gap: int) -> bool:
    """Read the ``gap`` bytes before ``run`` rather than seek to it (a new request on a store):
    when the gap is at most ``max_gap`` and, where the run's end is known, no larger than the run
    itself, so that at most half of what a window reads is passed over (and on large objects,
    whose blocks lie far apart, almost none)."""
    if gap > max_gap:
        return False
    return run.end_offset < 0 or gap <= run.end_offset - run.byte_offset


def _reach(mean_line: float | None, runs: Iterator[LineRun], max_gap: int) -> tuple[int, int]:
    """For a read of the first of ``runs`` (in row order) and the runs read through after it
    without a seek (each next one at most ``max_gap`` bytes after the last): the byte offset one
    request should reach so that it serves them all (estimated from ``mean_line`` with 10% to
    spare, never past a run's ``end_offset``; 0 when no length is known), and the offset where
    their lines end, which no read of them need pass (0 unless the plan gave every ``end_offset``)."""
    if not mean_line:  # a blind first read (FIRST_CHUNK), stopped where the first run ends
        first = next(iter(runs), None)
        return 0, max(0, first.end_offset) if first is not None else 0
    reach, cap, known = 0, 0, True
    for run in runs:
        if reach and not _read_through(run.byte_offset - reach, run, max_gap):
            break
        estimate = run.byte_offset + int((run.start_row - run.seek_row + run.num_rows) * mean_line * 1.1)
        if run.end_offset >= 0:
            estimate, cap = min(estimate, run.end_offset), max(cap, run.end_offset)
        else:
            known = False
        reach = max(reach, estimate)
    return reach, cap if known else 0


class _LineCursor:
    """Reads lines forward from a byte offset in chunks. ``row``: the line it reads next, which
    starts at byte ``offset``. For lines "ab\\n", "c" from offset 0: ``lines(2)`` -> [b"ab\\n", b"c"].

    Each chunk's newlines are found once, with numpy; lines are then slices between them, so
    passing over lines costs nothing per line and taking them one slice each."""

    def __init__(self, f: Any, *, mean_line: float | None = None) -> None:
        self._f, self._size = f, f.size()
        self._mean_hint = mean_line  # bytes per line before any line was read
        self.reach = 0  # a byte offset the next read should reach (0: none)
        self.cap = 0  # a byte offset no read need pass: where the wanted lines end (0: not known)
        self.row = self.offset = 0
        self._buf, self._start = b"", 0  # the unread bytes are _buf[_start:], from byte offset on
        self._newlines, self._next = np.zeros(0, np.int64), 0  # "\\n" positions in _buf; the first unread
        self._line_bytes = self._num_lines = 0  # lines passed so far, for their mean length

    def seek(self, row: int, offset: int) -> None:
        self.row, self.offset = row, offset
        self._buf, self._start = b"", 0
        self._newlines, self._next = np.zeros(0, np.int64), 0

    def lines(self, n: int, *, keep: bool, then: int = 0) -> list[bytes]:
        """The next ``n`` lines (fewer at the end of the file); with ``keep=False`` they are
        passed over and [] is returned. ``then``: lines the caller wants next (reads are sized
        for them too)."""
        out: list[bytes] = []
        passed = 0
        while passed < n:
            if self._next == len(self._newlines):  # no whole line buffered
                if self._fill(n - passed + then):
                    continue
                if self._start < len(self._buf):  # the last line, without "\\n"
                    out.extend([self._buf[self._start:]] if keep else [])
                    self._advance(len(self._buf), 1)
                    passed += 1
                break
            take = min(len(self._newlines) - self._next, n - passed)
            ends = self._newlines[self._next:self._next + take] + 1
            if keep:
                buf, bounds = self._buf, [self._start, *ends.tolist()]
                out.extend(buf[a:b] for a, b in zip(bounds, bounds[1:]))
            self._next += take
            self._advance(int(ends[-1]), take)
            passed += take
        return out

    def mean_line(self) -> float | None:
        """Bytes per line: of the lines passed so far, else the hint."""
        return self._line_bytes / self._num_lines if self._num_lines else self._mean_hint

    def _advance(self, end: int, num_lines: int) -> None:
        self.row += num_lines
        self._num_lines += num_lines
        self._line_bytes += end - self._start
        self.offset += end - self._start
        self._start = end

    def _fill(self, lines_wanted: int) -> bool:
        """Read the bytes after the buffered ones: ``FIRST_CHUNK`` while no line length is
        known, else the ``lines_wanted`` at the mean length plus 10%, or up to ``reach`` when
        that is further (``MIN_CHUNK`` to ``MAX_CHUNK``); at least as many as are buffered, so
        a line longer than a chunk costs O(its length) copies, not O(length^2 / chunk). False
        at the end of the file."""
        buffered = len(self._buf) - self._start
        position = self.offset + buffered
        if position >= self._size:
            return False
        mean = self.mean_line()
        if mean:
            estimate = max(int(lines_wanted * mean * 1.1) - buffered, self.reach - position)
            want = min(MAX_CHUNK, max(MIN_CHUNK, estimate))
        else:
            want = FIRST_CHUNK
        want = max(want, buffered)
        if self.cap > position:  # the plan says where the wanted lines end: never past it
            want = min(want, self.cap - position)
        self._f.seek(position)
        return self._take(self._f.read(min(want, self._size - position)), buffered)

    def _take(self, more: bytes, buffered: int) -> bool:
        if not more:
            return False
        self._newlines = np.flatnonzero(np.frombuffer(more, np.uint8) == 10) + buffered
        self._buf, self._start, self._next = self._buf[self._start:] + more if buffered else more, 0, 0
        return True
