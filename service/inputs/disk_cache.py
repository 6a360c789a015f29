"""A node's copy of the input bytes its processes read from a store, on local disk, shared.

The memory cache (read_cache.py) is per process: on one node the driver's scan reads every JSONL
byte, then each packing actor reads again what its windows need, and in a small corpus every
window needs a little of every file, so every actor reads nearly all of it (a pack of 4.3 MB on
2 actors: ~3x its inputs with the memory cache alone). Here the bytes one process fetched are
written to a directory of the node, and any process of the node (the probe, the driver's head
start, every actor, a restarted serve) reads them from there instead of the store. A node then
reads each input byte from the store about once per node.

Layout: ``<root>/<digest of the key>/<start>-<end>``, one file per extent fetched, written to a
temporary name and renamed (a reader sees a whole extent or none). Keys are the memory cache's
(uri, size, mtime_ns, ETag): another version of an object is another directory, so a changed
object is never served from here; only keys with an ETag are kept (a content digest on S3, so a
directory kept from an earlier run can only hold that content). ``root``:
``$PACKFEED_READ_CACHE_DIR``, else ``<tmp>/packfeed-read-cache-<uid>`` (made with mode 0700; a
directory another user owns is not used); ``$PACKFEED_READ_CACHE_DIR=off`` turns it off.

Bounds: ``capacity`` bytes (``$PACKFEED_READ_CACHE_DISK_MIB``, default ``DEFAULT_CAPACITY``, 1
GiB, and never more than a quarter of the disk's free space when the cache starts): after each
``capacity / 8`` bytes a process writes, it lists the directory and deletes the oldest extents
(by write time) down to 3/4 of the capacity. Cost per read: one listing of the key's directory
and a read of each extent used; a file that vanished under a read (another process trimmed it)
is fetched from the store instead. A process that has written ``THRASH`` times the capacity
(a corpus far larger than the cache, read once: its extents are trimmed before anyone reads
them) writes no more, so a multi-terabyte scan costs at most that in disk writes per process.

Measured (bench/bench_storage.py --quick, 3.6 MiB of JSONL + Parquet on moto, 2 packing
actors): a pack read 5.56x its inputs from the store; 3.00x with the memory cache alone, 1.00x
with this one too (the scan's reads; every window and the probe's JSONL from the node's copy).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from typing import Callable

DEFAULT_CAPACITY = 1 << 30
DIR_ENV = "PACKFEED_READ_CACHE_DIR"
CAPACITY_ENV = "PACKFEED_READ_CACHE_DISK_MIB"
OFF = "off"
THRASH = 2


class DiskCache:
    """Extents of object versions under ``root``, shared by the node's processes; see the module docstring."""

    def __init__(self, root: str, capacity: int = DEFAULT_CAPACITY) -> None:
        os.makedirs(root, mode=0o700, exist_ok=True)
        self.root, self.capacity = root, capacity
        self._written = self._written_total = 0
        self._lock = threading.Lock()

    def read(self, key: tuple, start: int, end: int, fetch: Callable[[int, int], bytes]) -> bytes:
        """Bytes ``[start, end)`` of the object ``key``: extents on disk where there are some, the
        rest from ``fetch(a, b)``, written to disk in turn (fewer bytes only past the object's end)."""
        folder = os.path.join(self.root, _digest(key))
        out: list[bytes] = []
        at = start
        for s, e in _extents(folder):
            if e <= at or s >= end:
                continue
            if s > at:
                out.append(self._fetch_keep(folder, at, s, fetch))
                if len(out[-1]) < s - at:
                    return b"".join(out)
                at = s
            data = _load(os.path.join(folder, f"{s}-{e}"), at - s, min(e, end) - at)
            if data is None:  # trimmed by another process meanwhile
                continue
            out.append(data)
            at += len(data)
            if at >= end:
                break
        if at < end:
            out.append(self._fetch_keep(folder, at, end, fetch))
        return out[0] if len(out) == 1 else b"".join(out)

    def _fetch_keep(self, folder: str, start: int, end: int, fetch: Callable[[int, int], bytes]) -> bytes:
        data = fetch(start, end)
        if data and len(data) * 4 <= self.capacity and self._written_total <= THRASH * self.capacity:
            try:
                _write(folder, start, data)
            except OSError:
                return data  # a full or read-only disk: the cache is only a saving
            with self._lock:
                self._written += len(data)
                self._written_total += len(data)
                trim = self._written * 8 > self.capacity
                if trim:
                    self._written = 0
            if trim:
                self.trim()
        return data

    def trim(self) -> None:
        """Delete the oldest extents (by write time) while the cache holds more than
        ``capacity``, down to 3/4 of it. Extents other processes delete meanwhile are skipped."""
        files = []
        for folder in _scandir(self.root):
            for entry in _scandir(folder.path):
                try:
                    stat = entry.stat()
                except OSError:
                    continue
                files.append((stat.st_mtime_ns, stat.st_size, entry.path))
        total = sum(size for _, size, _ in files)
        if total <= self.capacity:
            return
        for _, size, path in sorted(files):
            try:
                os.remove(path)
            except OSError:
                pass
            total -= size
            if total <= self.capacity * 3 // 4:
                break

    def clear(self) -> None:
        """Delete every extent (of every process of the node)."""
        for folder in _scandir(self.root):
            shutil.rmtree(folder.path, ignore_errors=True)

    def nbytes(self) -> int:
        """The bytes of the extents on disk now."""
        total = 0
        for folder in _scandir(self.root):
            for entry in _scandir(folder.path):
                try:
                    total += entry.stat().st_size
                except OSError:
                    pass
        return total


def _digest(key: tuple) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:32]


def _scandir(path: str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as entries:
            return [e for e in entries if not e.name.startswith(".")]
    except OSError:
        return []


def _extents(folder: str) -> list[tuple[int, int]]:
    """(start, end) of the extents in ``folder``, ascending."""
    out = []
    for entry in _scandir(folder):
        start, _, end = entry.name.partition("-")
        if start.isdigit() and end.isdigit():
            out.append((int(start), int(end)))
    return sorted(out)


def _load(path: str, offset: int, length: int) -> bytes | None:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(length)
    except OSError:
        return None
    return data if len(data) == length else None


def _write(folder: str, start: int, data: bytes) -> None:
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        now = time.time_ns()  # the write order, finer than a file system's own clock
        os.utime(tmp, ns=(now, now))
        os.replace(tmp, os.path.join(folder, f"{start}-{start + len(data)}"))
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def disk_cache_from_env() -> DiskCache | None:
    """The node's cache as the environment sets it (module docstring), or None when it is off
    or its directory cannot be made. ValueError for a capacity that is not a whole number >= 0."""
    root = os.environ.get(DIR_ENV, "").strip()
    if root.lower() == OFF:
        return None
    text = os.environ.get(CAPACITY_ENV, "").strip()
    try:
        capacity = int(text) << 20 if text else DEFAULT_CAPACITY
    except ValueError:
        capacity = -1
    if capacity < 0:
        raise ValueError(f"${CAPACITY_ENV} must be a whole number of MiB >= 0 (0: no disk cache), got {text!r}")
    root = root or os.path.join(tempfile.gettempdir(), f"packfeed-read-cache-{os.getuid()}")
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        if os.stat(root).st_uid != os.getuid():
            return None  # someone else's directory: never read bytes they could have written
        capacity = min(capacity, shutil.disk_usage(root).free // 4)
    except OSError:
        return None
    return DiskCache(root, capacity) if capacity > 0 else None
