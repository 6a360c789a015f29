"""The scan manifest: what scanning a run's input files found, kept so it is never done twice.

``build_plan(config, scan_cache=URI)`` (data/plan.py) reads the manifest at ``URI`` (a local
path or any storage URI), reuses the scan of every file whose identity now (a listing: size,
mtime, ETag where the listing gives one) is the one it was scanned at, scans only the rest and
writes the manifest again. A restart that finds every file unchanged reads no input byte: only
the listing of the inputs (``inputs.files.list_inputs``: sizes, mtimes) and the manifest. Callers
keep it beside the run's metadata (``pack``: ``--output/.packfeed/scan.npz``; ``serve``: the
state directory; ``train``: the output directory).

File format (one ``.npz``, numpy's zip of ``.npy`` arrays, read without pickle)::

    header      uint8[]  UTF-8 JSON: {"format": "packfeed-scan", "version": 1, "paths": [...],
                         "kinds": [...], "etags": [...]}: one entry per file scan
    size, mtime_ns, num_rows, seek_phase, seek_stride, seek_counts   int64[F]
    seek_offsets   int64[sum(seek_counts)]: every scan's offsets, back to back

A file appears once per (stride, phase) it was scanned at: a JSONL file's seek points depend
on its first row within its source (scan.py), so one whose earlier neighbours changed their
row count is scanned again. Size: 8 bytes per seek point (~0.3 GB for 10 billion rows at the
default stride of 256 rows), plus ~100 bytes per file.
"""

from __future__ import annotations

import io
import json
import logging
import os
import zipfile
from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np

from packfeed.service.inputs.scan import FileScan
from packfeed.service.storage import (
    ObjectInfo,
    StorageError,
    display,
    is_remote,
    read_bytes,
    write_bytes_atomic,
)
from packfeed.service.storage.store_errors import NO_BUCKET, NOT_FOUND

logger = logging.getLogger("packfeed")

FORMAT = "packfeed-scan"
VERSION = 1
_ARRAYS = ("size", "mtime_ns", "num_rows", "seek_phase", "seek_stride")


def same_version(scan: FileScan, now: ObjectInfo) -> bool:
    """Whether ``now`` (a listing's or a HEAD's identity) is the version ``scan`` saw: the same
    size, and the same ETag where both have one, else the same mtime (on a store to the second:
    a HEAD's Last-Modified has no fraction). Unknown identity never matches."""
    if now.size is None or scan.size < 0 or now.size != scan.size:
        return False
    if scan.etag and now.etag:
        return scan.etag == now.etag
    if now.mtime_ns is None or scan.mtime_ns < 0:
        return False
    unit = 10**9 if is_remote(scan.path) else 1
    return scan.mtime_ns // unit == now.mtime_ns // unit


class ScanManifest:
    """Scans by path; ``matching`` gives those a file's identity and kind still allow."""

    def __init__(self, scans: Iterable[FileScan] = ()) -> None:
        self._by_path: dict[str, list[FileScan]] = defaultdict(list)
        self.num_scans = 0
        for scan in scans:
            self._by_path[scan.path].append(scan)
            self.num_scans += 1

    def matching(self, path: str, kind: str, now: ObjectInfo, stride: int) -> list[FileScan]:
        """The scans of ``path`` as a ``kind`` file that ``now`` confirms (for JSONL: at
        ``stride``; any phase)."""
        return [s for s in self._by_path.get(path, ()) if s.kind == kind and same_version(s, now)
                and (kind != "jsonl" or s.seek_stride == stride)]

    @classmethod
    def load(cls, uri: str) -> "ScanManifest":
        """The manifest at ``uri``; empty when there is none yet, or (with a warning) when it
        cannot be read as one: the files are then scanned again and it is rewritten."""
        try:
            data = read_bytes(uri)
        except StorageError as exc:
            if exc.kind in (NOT_FOUND, NO_BUCKET):
                return cls()
            raise
        try:
            return cls(decode(data))
        except (ValueError, KeyError, OSError, TypeError, zipfile.BadZipFile) as exc:
            logger.warning("scan manifest %s is unreadable (%s); scanning the inputs again", display(uri), exc)
            return cls()

    @staticmethod
    def save(uri: str, scans: Sequence[FileScan]) -> None:
        """Write ``scans`` to ``uri`` whole (a reader sees the old manifest or the new one)."""
        if not is_remote(uri):
            os.makedirs(os.path.dirname(os.path.abspath(uri)), exist_ok=True)
        write_bytes_atomic(uri, encode(scans))


def encode(scans: Sequence[FileScan]) -> bytes:
    header = {"format": FORMAT, "version": VERSION, "paths": [s.path for s in scans],
              "kinds": [s.kind for s in scans], "etags": [s.etag for s in scans]}
    arrays = {name: np.asarray([getattr(s, name) for s in scans], dtype=np.int64) for name in _ARRAYS}
    offsets = [s.seek_offsets for s in scans]
    buffer = io.BytesIO()
    np.savez(buffer, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), **arrays,
             seek_counts=np.asarray([len(o) for o in offsets], dtype=np.int64),
             seek_offsets=np.concatenate(offsets) if offsets else np.zeros(0, np.int64))
    return buffer.getvalue()


def decode(data: bytes) -> list[FileScan]:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        header = json.loads(npz["header"].tobytes())
        if header.get("format") != FORMAT or header.get("version") != VERSION:
            raise ValueError(f"format {header.get('format')!r} version {header.get('version')!r}, not {FORMAT!r} "
                             f"version {VERSION}")
        columns = {name: npz[name].tolist() for name in _ARRAYS}
        counts = npz["seek_counts"]
        offsets = np.split(npz["seek_offsets"], np.cumsum(counts)[:-1]) if len(counts) else []
    return [FileScan(path, kind, columns["num_rows"][i], size=columns["size"][i], mtime_ns=columns["mtime_ns"][i],
                     etag=etag, seek_offsets=offsets[i], seek_phase=columns["seek_phase"][i],
                     seek_stride=columns["seek_stride"][i])
            for i, (path, kind, etag) in enumerate(zip(header["paths"], header["kinds"], header["etags"]))]
