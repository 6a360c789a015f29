"""The bytes this process read of input objects on a store, kept (bounded) by object version.

A packing actor's windows draw blocks of rows from all over each source (the seeded shuffle of
plan.py), so one Parquet row group or one stretch of a JSONL file is wanted by several blocks
of a window and by several windows an actor packs. Without a cache each of those reads went
to the store again: a pack of JSONL + Parquet from S3 read its inputs 6.45 times over, the
Parquet files ~18 times (issue 41). Here every ranged read of an input object on a store goes
through ``ReadCache.read``: the parts of ``[start, end)`` read before are served from memory,
the rest is fetched (one request per gap; gaps closer than ``MERGE_GAP`` are one request) and
kept. What is kept is exactly what was read, never more: the cache never makes a read larger
than it was without it.

Keys: ``(uri, size, mtime_ns, etag)`` of the version the plan saw (``cache_key``; no key, no
caching). A read opens the object first, and the open's HEAD fails when the object is another
version now (``storage.check_unchanged``), so a changed object is never served from the
cache: its new version has another key, and its old key is never asked for again.

Bounds: ``capacity`` bytes in all (default ``DEFAULT_CAPACITY``, 256 MiB per process;
``$PACKFEED_READ_CACHE_MIB``, 0 turns it off), least recently used out first; a single read
larger than half of it is not kept. Memory: the bytes kept plus ~100 bytes per extent.
Thread-safe (the scan's threads read through it too). Below it, unless
``$PACKFEED_READ_CACHE_DIR=off``, the node's disk cache (disk_cache.py, shared by the node's
processes) answers what this one lacks before the store does. Measured (bench_storage.py
--quick, 2 actors): 5.56x the input bytes read without either, 2.95x with this one alone,
1.00x with both.

For extents [0, 10) and [20, 30) kept, ``read(key, 5, 25, fetch)`` calls ``fetch(10, 20)``
once and returns bytes 5..25; afterwards [10, 20) is kept too.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from packfeed.service.inputs.disk_cache import disk_cache_from_env
from packfeed.service.storage import RangeReader

DEFAULT_CAPACITY = 256 << 20
CAPACITY_ENV = "PACKFEED_READ_CACHE_MIB"
MERGE_GAP = 64 << 10  # kept bytes between two gaps that one request reads again rather than make two

Key = tuple  # (uri, size, mtime_ns, etag)


def cache_key(uri: str, expect: Any) -> Key | None:
    """The key of the version ``expect`` (a ``storage.ObjectInfo``) names, or None when it names
    none well enough to cache by: its size and its ETag or mtime must be known."""
    if expect is None or expect.size is None or (expect.etag is None and expect.mtime_ns is None):
        return None
    return (uri, expect.size, expect.mtime_ns, expect.etag)


@dataclass
class CacheCounts:
    """Bytes a cache served (``hit_bytes``) and fetched (``fetched_bytes``), and extents evicted."""

    hit_bytes: int = 0
    fetched_bytes: int = 0
    evicted: int = 0


class ReadCache:
    """Kept extents of objects by version; see the module docstring."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 0:
            raise ValueError(f"a read cache holds 0 bytes or more, got {capacity}")
        self.capacity = capacity
        self._extents: OrderedDict[tuple[Key, int], bytes] = OrderedDict()  # (key, start) -> bytes, LRU first
        self._starts: dict[Key, list[int]] = {}  # key -> the starts of its extents, ascending
        self._bytes = 0
        self._lock = threading.Lock()
        self.counts = CacheCounts()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._extents)

    def read(self, key: Key, start: int, end: int, fetch: Callable[[int, int], bytes]) -> bytes:
        """Bytes ``[start, end)`` of the object ``key``: kept parts from memory, the gaps from
        ``fetch(a, b)`` (bytes ``[a, b)``; fewer only past the object's end), kept in turn."""
        if end <= start:
            return b""
        with self._lock:
            parts = self._covered(key, start, end)
        pieces: list[bytes] = []
        for a, b, data in _plan_reads(parts, start, end):
            if data is None:
                data = fetch(a, b)
                with self._lock:
                    self.counts.fetched_bytes += len(data)
                    self._keep(key, a, data)
            else:
                with self._lock:
                    self.counts.hit_bytes += len(data)
            pieces.append(data)
            if len(data) < b - a:  # the object ends here
                break
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def clear(self) -> None:
        with self._lock:
            self._extents.clear()
            self._starts.clear()
            self._bytes = 0

    def _covered(self, key: Key, start: int, end: int) -> list[tuple[int, bytes]]:
        """The kept extents that overlap ``[start, end)``, ascending (each marked recently used)."""
        starts = self._starts.get(key)
        if not starts:
            return []
        i = max(0, bisect.bisect_right(starts, start) - 1)
        out = []
        while i < len(starts) and starts[i] < end:
            data = self._extents[(key, starts[i])]
            if starts[i] + len(data) > start:
                out.append((starts[i], data))
                self._extents.move_to_end((key, starts[i]))
            i += 1
        return out

    def _keep(self, key: Key, start: int, data: bytes) -> None:
        if not data or len(data) * 2 > self.capacity:
            return
        starts = self._starts.get(key, [])
        end = start + len(data)
        i = bisect.bisect_left(starts, start)
        if i > 0 and starts[i - 1] + len(self._extents[(key, starts[i - 1])]) > start:
            return  # another thread kept the start of it meanwhile: keep what is there
        while i < len(starts) and starts[i] < end:  # extents inside this one (a merged gap read them again)
            inner = self._extents[(key, starts[i])]
            if starts[i] + len(inner) > end:
                return  # one reaching past it: keep what is there
            self._drop(key, starts[i])
            starts = self._starts.get(key, [])
        starts = self._starts.setdefault(key, starts)
        starts.insert(i, start)
        self._extents[(key, start)] = data
        self._bytes += len(data)
        while self._bytes > self.capacity:
            old_key, old_start = next(iter(self._extents))
            self._drop(old_key, old_start)
            self.counts.evicted += 1

    def _drop(self, key: Key, start: int) -> None:
        self._bytes -= len(self._extents.pop((key, start)))
        kept = self._starts[key]
        del kept[bisect.bisect_left(kept, start)]
        if not kept:
            del self._starts[key]


class CachedFile(RangeReader):
    """A read-only file on one object version (``key``) for ``pa.PythonFile``: reads go through
    ``cache``, and ``inner`` (a random-access file on the object, e.g. ``storage.open_input``'s)
    is read only for the bytes the cache lacks."""

    def __init__(self, inner: Any, key: Key, cache: ReadCache, disk: Any = None) -> None:
        super().__init__(inner.size())
        self._inner, self._key, self._cache = inner, key, cache
        self._disk = disk if key[3] is not None else None  # disk_cache.DiskCache: keys with an ETag only

    def read_range(self, start: int, end: int) -> bytes:
        return self._cache.read(self._key, start, end, self._fetch)

    def _fetch(self, start: int, end: int) -> bytes:
        if self._disk is not None:
            return self._disk.read(self._key, start, end, self._fetch_store)
        return self._fetch_store(start, end)

    def _fetch_store(self, start: int, end: int) -> bytes:
        self._inner.seek(start)
        return self._inner.read(end - start)

    def close(self) -> None:
        super().close()
        self._inner.close()



_SHARED: dict[str, Any] = {}
_SHARED_LOCK = threading.Lock()


def shared_cache() -> ReadCache:
    """This process's cache (``capacity_from_env()`` bytes), made on first use."""
    with _SHARED_LOCK:
        if "memory" not in _SHARED:
            _SHARED["memory"] = ReadCache(capacity_from_env())
        return _SHARED["memory"]


def shared_disk_cache() -> Any:
    """The node's disk cache (disk_cache.py) as the environment sets it, or None when it is off."""
    with _SHARED_LOCK:
        if "disk" not in _SHARED:
            _SHARED["disk"] = disk_cache_from_env()
        return _SHARED["disk"]


def reset_shared_caches(*, clear_disk: bool = False) -> None:
    """Forget this process's caches (kept bytes dropped; the environment read again on next use),
    and with ``clear_disk`` delete the node's disk cache too: for tests that count what a read
    fetches from a store."""
    disk = shared_disk_cache() if clear_disk else None
    if disk is not None:
        disk.clear()
    with _SHARED_LOCK:
        _SHARED.clear()


def _plan_reads(parts: list[tuple[int, bytes]], start: int, end: int) -> list[tuple[int, int, bytes | None]]:
    """``[start, end)`` as (a, b, kept bytes) and (a, b, None) gaps to fetch, ascending; gaps
    whose kept bytes between them are fewer than ``MERGE_GAP`` become one gap."""
    out: list[tuple[int, int, bytes | None]] = []
    at = start
    for s, data in parts:
        lo, hi = max(s, start), min(s + len(data), end)
        if lo > at:
            out.append((at, lo, None))
        out.append((lo, hi, data[lo - s:hi - s]))
        at = hi
    if at < end:
        out.append((at, end, None))
    merged: list[tuple[int, int, bytes | None]] = []
    for a, b, data in out:
        if (data is None and len(merged) >= 2 and merged[-2][2] is None and merged[-1][2] is not None
                and merged[-1][1] - merged[-1][0] < MERGE_GAP):
            merged[-2:] = [(merged[-2][0], b, None)]
        else:
            merged.append((a, b, data))
    return merged


def capacity_from_env() -> int:
    """``$PACKFEED_READ_CACHE_MIB`` in bytes, else ``DEFAULT_CAPACITY``. ValueError for a value
    that is not a whole number >= 0."""
    text = os.environ.get(CAPACITY_ENV, "").strip()
    if not text:
        return DEFAULT_CAPACITY
    try:
        mib = int(text)
    except ValueError:
        mib = -1
    if mib < 0:
        raise ValueError(f"${CAPACITY_ENV} must be a whole number of MiB >= 0 (0: no read cache), got {text!r}")
    return mib << 20
