"""RowHub: the packed stream held once in the server, read by many consumers by row index.

The gRPC server runs ONE reader of the deterministic packed stream (a ``PackedStream`` over Ray
Data, or any iterator of windows in tests) and keeps a bounded buffer of its most recent rows.
Every consumer (one ``StreamBatches`` call: a rank of some world size) asks for the global row
indices of its next step and gets them as soon as the reader has produced them.

Memory is bounded by ``capacity`` rows (plus the window the reader is adding): the reader
pauses while the buffer is full of rows some consumer still needs. So a stalled consumer
stalls the reader, never grows the server; consumers of one server move within
``capacity`` rows of the slowest one, which data-parallel ranks do anyway.

Rows that are no longer in the buffer (a late consumer, a restarted server, a resume with
another world size) are produced again by restarting the reader at the window that holds the
row. ``Manifest`` remembers, per window of the seeded plan order, the global index of its first
row (written to disk as windows arrive), so a restart packs at most the windows from that
window on: the cost of a resume does not grow with the cursor. Without a manifest entry the
reader starts at the last window it knows, at worst the first.

Pure Python threads, numpy and packfeed.client: no gRPC, no Ray (the reader is injected).
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from packfeed.client.rows import PackedRows, concat_rows, select_rows

# open_reader(start_window, first_row) -> iterator of (window position, rows); rows carry global
# row_index first_row, first_row + 1, ... in stream order.
OpenReader = Callable[[int, int], Iterable[tuple[int, PackedRows]]]

PIECE_ROWS = 64  # windows are stored in pieces of this many rows: the unit of eviction


class ConsumerGone(Exception):
    """The consumer's call ended (client cancelled or disconnected) while it waited for rows."""


class HubClosed(Exception):
    """The hub is draining or closed (server shutting down): the client should retry."""


class Manifest:
    """Global index of the first row of each window (by position in the seeded plan order),
    and the stream length once a reader has reached the end. Optionally persisted as JSON at
    ``path`` (rewritten atomically when it learns something new).

    ``key`` identifies the stream (data config hash + the planned windows): a file written for
    another key is ignored, never trusted.
    """

    def __init__(self, key: str, path: Path | None = None) -> None:
        self.key = key
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self.first_row: dict[int, int] = {0: 0}
        self.total_rows: int | None = None
        if self.path is not None and self.path.exists():
            try:
                saved = json.loads(self.path.read_text())
            except (OSError, ValueError):
                saved = {}
            if saved.get("key") == key:
                self.first_row.update({int(w): int(r) for w, r in saved.get("first_row", {}).items()})
                self.total_rows = saved.get("total_rows")

    def locate(self, row: int) -> tuple[int, int]:
        """(window position, its first row) of the latest known window starting at or before ``row``."""
        with self._lock:
            known = sorted(self.first_row.items(), key=lambda wr: wr[1])
        rows = [r for _, r in known]
        i = bisect.bisect_right(rows, row) - 1
        return known[max(i, 0)]

    def record(self, window: int, first_row: int) -> None:
        with self._lock:
            if self.first_row.get(window) == first_row:
                return
            self.first_row[window] = first_row
        self._save()

    def record_end(self, total_rows: int) -> None:
        with self._lock:
            if self.total_rows == total_rows:
                return
            self.total_rows = total_rows
        self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        with self._lock:  # held while writing: an older snapshot never replaces a newer one
            blob = json.dumps({"key": self.key, "first_row": self.first_row, "total_rows": self.total_rows})
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(blob)
            os.replace(tmp, self.path)


@dataclass
class _Piece:
    start: int  # global index of the first row
    rows: PackedRows

    @property
    def end(self) -> int:
        return self.start + self.rows.num_rows


class RowHub:
    """Rows of the packed stream by global index, for many consumers, in bounded memory.

    ``open_reader``: starts the stream at a window (see OpenReader). ``capacity``: rows held at
    most (plus one window in flight). Use::

        with hub.consumer() as c:
            rows, total = c.rows(range(0, 8, 2))  # blocks until produced

    A consumer's step (the rows from its lowest to its highest index) must span at most
    ``capacity - PIECE_ROWS`` rows, or it could wait for rows that do not fit: the server checks.

    An error raised by the reader (a bad sample under --strict, a lost Ray worker) reaches every
    consumer whose rows are not held yet; rows already held are still served. The failed reader
    is not restarted (the server reports NOT_SERVING through ``on_error``): restart the server.
    """

    def __init__(
        self,
        open_reader: OpenReader,
        manifest: Manifest,
        *,
        capacity: int = 2048,
        poll_s: float = 0.2,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        if capacity < 2 * PIECE_ROWS:
            raise ValueError(f"capacity must be >= {2 * PIECE_ROWS} rows, got {capacity}")
        self._open_reader = open_reader
        self._on_error = on_error
        self.manifest = manifest
        self.capacity = capacity
        self._poll_s = poll_s
        self._cond = threading.Condition()
        self._pieces: list[_Piece] = []
        self._held = 0  # rows in self._pieces
        self._floor = 0  # rows below this index are not held and the reader will not produce them
        self._produced = 0  # the reader has produced every row below this index
        self._generation = 0  # bumped to stop the current reader thread
        self._reader: threading.Thread | None = None
        self._error: BaseException | None = None
        self._needs: dict[int, int] = {}  # consumer id -> lowest row it may still ask for
        self._waiting: dict[int, int] = {}  # consumer id -> the highest row it is waiting for
        self._next_consumer = 0
        self._closed = False
        self.restarts = 0  # readers started (for stats and tests)
        self.peak_held = 0

    # -- consumers ------------------------------------------------------------------------------

    def consumer(self, alive: Callable[[], bool] = lambda: True) -> "Consumer":
        with self._cond:
            cid = self._next_consumer
            self._next_consumer += 1
        return Consumer(self, cid, alive)

    @property
    def total_rows(self) -> int | None:
        """The stream length, once a reader has reached the end (or the manifest knew it)."""
        return self.manifest.total_rows

    @property
    def held_rows(self) -> int:
        with self._cond:
            return self._held

    def start(self) -> None:
        """Start reading from the beginning before any consumer asks (warms the pipeline up)."""
        with self._cond:
            if self._reader is None and not self._closed:
                self._restart_reader()

    def drain(self) -> None:
        """Stop serving: every waiting and future request raises HubClosed."""
        with self._cond:
            self._closed = True
            self._generation += 1
            self._cond.notify_all()

    def close(self, timeout: float = 10.0) -> None:
        self.drain()
        reader = self._reader
        if reader is not None:
            reader.join(timeout)

    def _rows(self, cid: int, indices: range, alive: Callable[[], bool]) -> tuple[PackedRows | None, int | None]:
        """Rows ``indices`` (an increasing range) that exist, and the stream length if known.

        Blocks until the reader has produced every requested row below the end of the stream.
        """
        with self._cond:
            self._needs[cid] = indices.start if len(indices) else self._needs.get(cid, 0)
            while True:
                if self._closed:
                    raise HubClosed("the server is shutting down")
                total = self.manifest.total_rows
                want = indices if total is None else range(indices.start, min(indices.stop, max(total, indices.start)), indices.step)
                if len(want) == 0:
                    return None, total
                held = self._reader is not None and self._floor <= want[0] and want[-1] < self._produced
                if held:
                    break
                if self._error is not None:  # the rows will not come: the pipeline failed
                    raise self._error
                if self._reader is None or want[0] < self._floor or self._worth_jumping(want[0]):
                    self._restart_reader()
                self._waiting[cid] = want[-1]
                try:
                    self._cond.wait(self._poll_s)
                finally:
                    del self._waiting[cid]
                if not alive():
                    raise ConsumerGone()
            return self._gather(want), total

    def _forget(self, cid: int) -> None:
        with self._cond:
            self._needs.pop(cid, None)
            self._cond.notify_all()

    # -- the reader -------------------------------------------------------------------------------

    def _low(self) -> int:
        """The lowest row any consumer may still ask for: rows below it can be dropped. With no
        consumer nothing is dropped, so the reader fills the buffer and pauses."""
        return min(self._needs.values()) if self._needs else self._floor

    def _worth_jumping(self, row: int) -> bool:
        """True when every consumer is past what the reader will produce and a known window
        starts beyond the reader's position: restarting there skips packing the gap."""
        low = self._low()
        return row >= self._produced and low >= self._produced and self.manifest.locate(low)[1] > self._produced

    def _restart_reader(self) -> None:
        """Start a reader at the known window holding the lowest row a consumer needs (caller holds the lock)."""
        window, first_row = self.manifest.locate(self._low())
        self._generation += 1
        self._pieces, self._held = [], 0
        self._floor = self._produced = first_row
        self._error = None
        self.restarts += 1
        thread = threading.Thread(
            target=self._read, args=(self._generation, window, first_row), name=f"packfeed-reader-{window}", daemon=True
        )
        self._reader = thread
        thread.start()

    def _read(self, generation: int, window: int, first_row: int) -> None:
        reader = None
        try:
            reader = iter(self._open_reader(window, first_row))
            next_row, last_position = first_row, None
            for position, rows in reader:
                if rows.num_rows == 0:
                    continue
                if int(rows.row_index[0]) != next_row:
                    raise RuntimeError(f"reader produced row {int(rows.row_index[0])}, expected {next_row}")
                if position != last_position:  # a window's rows may come in several blocks
                    self.manifest.record(position, next_row)
                    last_position = position
                for start in range(0, rows.num_rows, PIECE_ROWS):
                    piece = select_rows(rows, range(start, min(start + PIECE_ROWS, rows.num_rows)))
                    if not self._append(generation, _Piece(next_row + start, piece)):
                        return
                next_row += rows.num_rows
            with self._cond:
                if generation == self._generation:
                    self.manifest.record_end(next_row)
                    self._cond.notify_all()
        except BaseException as exc:  # reaches the consumers; the reader thread ends
            with self._cond:
                current = generation == self._generation
                if current:
                    self._error = exc
                    self._cond.notify_all()
            if current and self._on_error is not None:
                self._on_error(exc)
        finally:
            close = getattr(reader, "close", None)
            if close is not None:  # a generator: stops the pipeline behind it
                close()

    def _append(self, generation: int, piece: _Piece) -> bool:
        """Add a piece once there is room; False when this reader has been superseded."""
        with self._cond:
            while True:
                if generation != self._generation:
                    return False
                self._evict(piece.rows.num_rows)
                if self._held + piece.rows.num_rows <= self.capacity:
                    break
                self._cond.wait(self._poll_s)
            self._pieces.append(piece)
            self._held += piece.rows.num_rows
            self._produced = piece.end
            self.peak_held = max(self.peak_held, self._held)
            self._cond.notify_all()
            return True

    def _evict(self, room: int) -> None:
        """Drop the oldest rows no consumer needs until ``room`` more rows fit: whole pieces,
        and, while a consumer waits for rows not produced yet, the front of the piece holding
        the lowest needed row. So a step of up to capacity - PIECE_ROWS rows can always be
        completed, and rows a late consumer may still want are kept as long as possible."""
        low = self._low()
        while self._pieces and self._held + room > self.capacity and self._pieces[0].start < low:
            first = self._pieces[0]
            starving = any(row >= self._produced for row in self._waiting.values())
            if first.end > low and not starving:
                break
            if first.end <= low:
                self._pieces.pop(0)
                self._held -= first.rows.num_rows
                self._floor = first.end
            else:
                cut = low - first.start
                self._pieces[0] = _Piece(low, select_rows(first.rows, range(cut, first.rows.num_rows)))
                self._held -= cut
                self._floor = low

    def _gather(self, want: range) -> PackedRows:
        """The rows ``want`` (all held) in order (caller holds the lock)."""
        starts = [p.start for p in self._pieces]
        parts = []
        indices = np.arange(want.start, want.stop, want.step, dtype=np.int64)
        i = 0
        while i < len(indices):
            k = bisect.bisect_right(starts, int(indices[i])) - 1
            piece = self._pieces[k]
            j = int(np.searchsorted(indices, piece.end))
            parts.append(select_rows(piece.rows, indices[i:j] - piece.start))
            i = j
        return parts[0] if len(parts) == 1 else concat_rows(parts)


class Consumer:
    """One consumer's handle on the hub (a context manager: leaving it releases its rows)."""

    def __init__(self, hub: RowHub, cid: int, alive: Callable[[], bool]) -> None:
        self._hub, self._cid, self._alive = hub, cid, alive

    def rows(self, indices: range) -> tuple[PackedRows | None, int | None]:
        """See RowHub: the existing rows of ``indices`` and the stream length if known."""
        return self._hub._rows(self._cid, indices, self._alive)

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> None:
        self._hub._forget(self._cid)
