"""Manifest: the global index of each window's first row, kept on disk or on an object store,
so a resume is cheap.

The hub (hub.py) starts its main reader, and its catch-up path packs, at the latest window known
to start at or before the row wanted (``locate``). The file is a cache of what packing learns
anyway: losing it costs packing time, never rows.

A URI (``s3://bucket/state/KEY.json``) is read and written through ``service.storage``.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import threading
import time
from pathlib import Path

from packfeed.service import storage
from packfeed.service.storage.store_errors import NO_BUCKET, NOT_FOUND

logger = logging.getLogger("packfeed")


class Manifest:
    """Global index of the first row of each window, and the stream length once known.

    Optionally persisted at ``path`` as JSON lines: a header ``{"key": ...}``, then one line per
    window learnt (``{"w": window, "r": first_row}``) and ``{"end": total_rows}``, appended as
    they arrive, so recording costs the same at window 10 and at window 100,000. A torn last
    line (a killed server) is ignored on load.

    It also holds the stream's online mixture changes (``{"mixture": MixtureChange record}``,
    delivery/mixture_changes.py), which are not a cache: ``record_mixture`` writes the whole
    file atomically (a new file renamed over the old one, or one PUT) and raises when it cannot,
    so a change is either recorded or not made.

    ``key`` identifies the stream (data config hash + the plan): a file written for another
    key is ignored, never trusted, and replaced at the first write. The file is a cache: a
    failed write is logged once and the stream goes on (``check_writable`` is the start-up check).

    On an object store (``path`` a URI) an object cannot be appended to: the whole file is
    written again (one PUT), at the first write, at the end of the stream, at ``flush`` and
    otherwise at most every ``remote_write_s`` seconds, so a stream of 100,000 windows does not
    rewrite a growing object 100,000 times. What a killed server had not written yet is packed
    again by the next one.
    """

    remote_write_s = 5.0

    def __init__(self, key: str, path: str | Path | None = None) -> None:
        self.key = key
        self.path = None if path is None else (os.fspath(path) if storage.is_remote(path) else Path(path))
        self._remote = isinstance(self.path, str)
        self._lock = threading.Lock()
        self.first_row: dict[int, int] = {0: 0}
        self._starts: list[tuple[int, int]] = [(0, 0)]  # (first_row, window), sorted: what locate searches
        self.total_rows: int | None = None
        self.mixture: list[dict] = []  # online mixture changes, in the order made
        self._write_failed = False
        self._file_ours = False  # the file at path holds this key's header: append to it
        self._torn = False
        self._unwritten = False  # on a store: learnt since the last write
        self._written_at = float("-inf")
        self._pending: list[dict] = []  # learnt, not written yet (record(write=False))
        if self.path is not None:
            self._load()

    def _load(self) -> None:
        text = self._read()
        if text is None:
            return
        lines = text.splitlines()
        self._torn = not text.endswith("\n")  # the next line must not continue a torn one
        try:
            header = json.loads(lines[0]) if lines else None
        except ValueError:
            return
        if not isinstance(header, dict) or header.get("key") != self.key:
            return
        self._file_ours = True
        for line in lines[1:]:
            try:
                entry = json.loads(line)
                if "end" in entry:
                    self.total_rows = int(entry["end"])
                elif "mixture" in entry:
                    self.mixture.append(dict(entry["mixture"]))
                else:
                    self._set(int(entry["w"]), int(entry["r"]))
            except (ValueError, TypeError, KeyError, AttributeError):
                continue  # a torn line: what it said is learnt again

    def _read(self) -> str | None:
        """The file's text; None when there is none (or it cannot be read: a cache miss)."""
        if not self._remote:
            try:
                return self.path.read_text() if self.path.exists() else None
            except OSError:
                return None
        try:
            return storage.read_bytes(self.path).decode()
        except UnicodeDecodeError:
            return None
        except storage.StorageError as e:
            if e.kind not in (NOT_FOUND, NO_BUCKET):
                logger.warning("cannot read the stream manifest (%s); packing starts from the windows it knows", e)
            return None

    def check_writable(self) -> None:
        """OSError (on disk) or ``StorageError`` (a URI) naming the place unless the manifest
        can be written there."""
        if self.path is None:
            return
        if self._remote:
            directory, _, name = self.path.rpartition("/")
            probe = f"{name}.probe{os.getpid()}"
            storage.write_bytes_atomic(f"{directory}/{probe}", b"")
            storage.delete_prefix(directory, only=lambda rel: rel == probe)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        probe = self.path.with_suffix(f".probe{os.getpid()}")
        probe.write_text("")
        probe.unlink()

    def locate(self, row: int) -> tuple[int, int]:
        """(window, its first row) of the latest known window starting at or before ``row``."""
        with self._lock:
            i = bisect.bisect_right(self._starts, (row, float("inf"))) - 1
            first, window = self._starts[max(i, 0)]
        return window, first

    def last_window(self) -> int:
        """The highest window whose first row is known (0 at least)."""
        with self._lock:
            return max(self.first_row)

    def record(self, window: int, first_row: int, *, write: bool = True) -> None:
        """Learn ``window``'s first row; with ``write`` False it is written by the next
        ``write_pending`` (a caller holding a lock of its own does no I/O under it)."""
        with self._lock:
            if self.first_row.get(window) == first_row:
                return
            self._set(window, first_row)
            if write:
                self._append({"w": window, "r": first_row})
            else:
                self._pending.append({"w": window, "r": first_row})

    def write_pending(self) -> None:
        """Write what ``record(write=False)`` learnt (in order)."""
        with self._lock:
            pending, self._pending = self._pending, []
            for entry in pending:
                self._append(entry)

    def record_end(self, total_rows: int) -> None:
        with self._lock:
            if self.total_rows == total_rows:
                return
            self.total_rows = total_rows
            self._append({"end": total_rows})

    def record_mixture(self, change: dict) -> None:
        """Record an online mixture change: the whole file written atomically; OSError (on disk)
        or ``StorageError`` (a URI) when it cannot be, and then nothing is recorded. The windows
        after the change's ``window`` and the end are forgotten with it (the change repacks them)."""
        with self._lock:
            kept = {w: r for w, r in self.first_row.items() if w <= int(change["window"])}
            if self.path is not None:
                text = self._whole(extra=[change], first_row=kept, end=False)
                if self._remote:
                    storage.write_bytes_atomic(self.path, text.encode())
                else:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = self.path.with_suffix(f".tmp{os.getpid()}")
                    tmp.write_text(text)
                    os.replace(tmp, self.path)
                self._file_ours, self._torn, self._unwritten = True, False, False
            self.mixture.append(dict(change))
            self.first_row, self.total_rows, self._pending = kept, None, []
            self._starts = sorted((r, w) for w, r in kept.items())

    def reset(self, mixture: list[dict]) -> None:
        """Forget every window and the end, and hold ``mixture`` as the changes made (a resumed
        run whose checkpoint has other changes than this file: what the file learnt after them
        belongs to another stream). The next write starts the file again."""
        with self._lock:
            self.first_row, self._starts, self.total_rows = {0: 0}, [(0, 0)], None
            self.mixture = [dict(m) for m in mixture]
            self._file_ours, self._pending = False, []

    def to_dict(self) -> dict:
        """The manifest as a checkpoint keeps it (``mixture`` only when a change was made)."""
        with self._lock:
            d = {"key": self.key, "first_row": {str(w): r for w, r in self.first_row.items()},
                 "total_rows": self.total_rows}
            if self.mixture:
                d["mixture"] = [dict(m) for m in self.mixture]
            return d

    def _set(self, window: int, first_row: int) -> None:
        old = self.first_row.get(window)
        if old is not None:
            self._starts.remove((old, window))
        self.first_row[window] = first_row
        bisect.insort(self._starts, (first_row, window))

    def flush(self) -> None:
        """Write what was learnt and not written yet (on a store; on disk every line is)."""
        with self._lock:
            if self._remote and self._unwritten:
                self._write_remote()

    def _append(self, entry: dict) -> None:
        """Write what was learnt (caller holds the lock: lines keep their order)."""
        if self.path is None:
            return
        if self._remote:
            self._unwritten = True
            first = not self._file_ours and not self._write_failed  # after a failure: once an interval
            if first or "end" in entry or time.monotonic() - self._written_at >= self.remote_write_s:
                self._write_remote()
            return
        try:
            if not self._file_ours:  # a new file, or another stream's: start it with what we know
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(self._whole())
                os.replace(tmp, self.path)
                self._file_ours = True
                return
            with open(self.path, "a") as f:
                f.write(("\n" if self._torn else "") + json.dumps(entry) + "\n")
            self._torn = False
        except OSError as e:  # tried again at the next window; said once
            self._torn = True  # a write cut short may have left half a line
            if not self._write_failed:
                logger.warning("cannot write the stream manifest %s (%s); the stream goes on, but a "
                               "restart will pack from the last window it knows", self.path, e)
            self._write_failed = True

    def _whole(self, extra: list[dict] = (), first_row: dict[int, int] | None = None, end: bool = True) -> str:
        """The whole file: the header, the mixture changes (and ``extra`` ones), every window
        known (or those of ``first_row``), the end when known (and ``end``)."""
        firsts = self.first_row if first_row is None else first_row
        lines = [{"key": self.key}, *({"mixture": m} for m in [*self.mixture, *extra]),
                 *({"w": w, "r": r} for w, r in sorted(firsts.items()))]
        if end and self.total_rows is not None:
            lines.append({"end": self.total_rows})
        return "".join(json.dumps(line) + "\n" for line in lines)

    def _write_remote(self) -> None:
        """The whole file in one PUT (caller holds the lock); a failure is said once."""
        self._written_at = time.monotonic()
        try:
            storage.write_bytes_atomic(self.path, self._whole().encode())
        except storage.StorageError as e:
            if not self._write_failed:
                logger.warning("cannot write the stream manifest (%s); the stream goes on, but a restart will pack "
                               "from the last window it knows", e)
            self._write_failed = True
            return
        self._file_ours, self._unwritten = True, False

