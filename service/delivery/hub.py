"""RowHub: the packed stream held once, read by many consumers by global row index.

One hub serves every consumer of a stream: the gRPC server's ``StreamBatches`` calls (ranks
of any world size) and the Ray Train feeder's ranks. It runs ONE main reader of the
deterministic stream (a ``PackingPipeline``, or any iterator of windows in tests) and keeps a
bounded buffer of its most recent rows; each consumer asks for the global row indices of its
next step and gets them once produced.

Memory is bounded by ``capacity`` rows (plus the window the reader is adding): the reader
pauses while the buffer is full of rows some consumer still needs. So a stalled consumer
stalls the reader, never grows the server; consumers of one stream move within ``capacity``
rows of the slowest one, which data-parallel ranks do anyway. A consumer that asks for nothing
for ``idle_timeout_s`` stops holding rows back (it is *detached*; when it comes back it is
served as a far consumer, below).

Far consumers. Rows below the buffer (a late or returning consumer, a peek at cursor 0) are
not worth moving the main reader for while other consumers read where it is: they are served
by the *catch-up* path, which packs exactly the windows such a consumer needs, one at a time
(``pack_window``), and caches at most ``capacity`` rows of them. So a far consumer costs
packing work for its own rows only and never evicts what near consumers need. The main reader
moves (restarts at the window holding the row) only when no attached consumer reads where it
is, or when there is no catch-up path (the trainer's feeder: its ranks always move together).

The ``Manifest`` (manifest.py) remembers, per window, the global index of its first row
(written to disk as windows arrive), so a restart or a catch-up packs at most the windows from
that window on: the cost of a resume does not grow with the cursor. Without an entry the
reader starts at the last window it knows, at worst the first.

A change of the stream from a window on (an online mixture change, mixture_changes.py) is made
inside ``changing()``: ``window_from(cursor)`` places it at the first window no consumer has
received, and ``rewind`` forgets the rows from there on and starts the reader again there.

Pure Python threads, numpy and packfeed.client: no gRPC, no Ray (readers are injected).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np
from packfeed.client.cost import attention_work
from packfeed.client.rows import PackedRows, select_rows
from packfeed.service import faults
from packfeed.service.delivery.catchup import CatchUp, PackWindow, Piece, gather, gather_work
from packfeed.service.delivery.manifest import Manifest

# open_reader(start_window, first_row) -> iterator of (window, rows); rows carry global
# row_index first_row, first_row + 1, ... in stream order.
OpenReader = Callable[[int, int], Iterable[tuple[int, PackedRows]]]

PIECE_ROWS = 64  # windows are stored in pieces of this many rows: the unit of eviction


class ConsumerGone(Exception):
    """The consumer's call ended (client cancelled or disconnected) while it waited for rows."""


class HubClosed(Exception):
    """The hub is draining or closed (server shutting down): the client should retry."""


@dataclass
class _ConsumerState:
    need: int = 0  # lowest row it may still ask for
    last_active: float = 0.0
    attached: bool = False  # holds back the main reader's eviction


class RowHub:
    """Rows of the packed stream by global index, for many consumers, in bounded memory.

    ``open_reader``: starts the main stream at a window (see OpenReader). ``pack_window``:
    the catch-up path for far consumers (None: far requests move the main reader).
    ``capacity``: rows held at most by the main buffer, and again by the catch-up cache. Use::

        with hub.consumer() as c:
            rows, total = c.rows(range(0, 8, 2))  # blocks until produced

    A consumer's step (the rows from its lowest to its highest index) must span at most
    ``capacity - PIECE_ROWS`` rows, or it could wait for rows that do not fit: callers check.

    An error raised by the main reader (a bad sample under --strict, a lost Ray worker)
    reaches every consumer whose rows are not held yet; rows already held are still served.
    The failed reader is not restarted (the server reports NOT_SERVING through ``on_error``).
    """

    def __init__(
        self,
        open_reader: OpenReader,
        manifest: Manifest,
        *,
        capacity: int = 2048,
        pack_window: PackWindow | None = None,
        idle_timeout_s: float = 120.0,
        poll_s: float = 0.2,
        on_error: Callable[[BaseException], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 2 * PIECE_ROWS:
            raise ValueError(f"capacity must be >= {2 * PIECE_ROWS} rows, got {capacity}")
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
        self._open_reader, self._on_error = open_reader, on_error
        self.manifest = manifest
        self.capacity = capacity
        self.idle_timeout_s = idle_timeout_s
        self._poll_s, self._clock = poll_s, clock
        self._cond = threading.Condition()
        self._pieces: list[Piece] = []
        self._held = 0  # rows in self._pieces
        self._floor = 0  # rows below this index are not held and the reader will not produce them
        self._produced = 0  # the main reader has produced every row below this index
        self._generation = 0  # bumped to stop the current reader thread
        self._reader: threading.Thread | None = None  # the current main reader
        self._readers: list[threading.Thread] = []  # every reader still running (superseded ones end soon)
        self._error: BaseException | None = None
        self._consumers: dict[int, _ConsumerState] = {}
        self._waiting: dict[object, int] = {}  # one entry per waiting call: the highest row it waits for
        self._next_consumer = 0
        self._closed = False
        self._catchup = None if pack_window is None else CatchUp(pack_window, manifest, capacity)
        self._reached = 0  # every row below it was produced here, so the manifest knows its window
        self.reader_starts = 0  # main readers started: the first, then one per restart
        self.rows_served = 0
        self.peak_held = 0

    # -- consumers ------------------------------------------------------------------------------

    def consumer(self, alive: Callable[[], bool] = lambda: True) -> "Consumer":
        with self._cond:
            cid = self._next_consumer
            self._next_consumer += 1
            # Detached until its first request: a consumer that has asked for nothing yet holds nothing back.
            self._consumers[cid] = _ConsumerState(last_active=self._clock(), attached=False)
        return Consumer(self, cid, alive)

    @property
    def total_rows(self) -> int | None:
        """The stream length, once a reader has reached the end (or the manifest knew it)."""
        return self.manifest.total_rows

    @property
    def restarts(self) -> int:
        """Times the main reader was started again (at another window) after its first start:
        0 while the first reader runs, or before any started."""
        return max(self.reader_starts - 1, 0)

    @property
    def catchup_windows(self) -> int:
        """Windows packed by the catch-up path."""
        return 0 if self._catchup is None else self._catchup.windows

    @property
    def held_rows(self) -> int:
        with self._cond:
            return self._held

    def snapshot(self) -> dict:
        """Numbers for logs and metrics: buffer, reader position, consumers and their lag."""
        with self._cond:
            now = self._clock()
            lags = {cid: self._produced - c.need for cid, c in self._consumers.items() if self._is_attached(c, now)}
            return {
                "held_rows": self._held, "capacity": self.capacity, "produced": self._produced,
                "floor": self._floor, "consumers": len(self._consumers), "attached": len(lags),
                "lags": lags, "max_lag": max(lags.values(), default=0),
                "restarts": self.restarts, "catchup_windows": self.catchup_windows, "rows_served": self.rows_served,
            }  # fmt: skip

    def start(self, row: int = 0) -> None:
        """Start reading at the window holding ``row`` before any consumer asks (warms the
        pipeline up while the consumers start)."""
        with self._cond:
            if self._reader is None and not self._closed:
                self._restart_reader(row)

    def drain(self) -> None:
        """Stop serving: every waiting and future request raises HubClosed."""
        with self._cond:
            self._closed = True
            self._generation += 1
            self._cond.notify_all()

    def close(self, timeout: float = 10.0) -> bool:
        """Drain and wait for every reader thread (superseded ones too) to end, within
        ``timeout`` in all; True when they did. Nothing of the pipeline runs after it."""
        self.drain()
        deadline = time.monotonic() + timeout
        with self._cond:
            readers = list(self._readers)
        for reader in readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        return not any(reader.is_alive() for reader in readers)

    def _rows(self, cid: int, indices: range, alive: Callable[[], bool], through: int | None = None,
              work: bool = False) -> tuple[PackedRows | None, int | None]:
        """Rows ``indices`` (an increasing range) that exist, and the stream length if known;
        with ``work``, only their attention work (float64, ``gather_work``; not counted served).

        Blocks until every requested row below the end of the stream is produced, and, with
        ``through``, until row ``through`` exists or the stream's length is known: a step's
        cursor (the row after its last) holds only when the stream reaches it.
        """
        with self._cond:
            state = self._consumers[cid]
            if len(indices):
                moved_on = indices.start > state.need
                state.need = indices.start
                if moved_on:  # rows below may be evicted now: a reader waiting for room goes on
                    self._cond.notify_all()
            state.last_active = self._clock()
            while True:
                if self._closed:
                    raise HubClosed("the server is shutting down")
                total = self.manifest.total_rows
                want = indices if total is None else range(indices.start, min(indices.stop, max(total, indices.start)), indices.step)
                if len(want) == 0:
                    return None, total
                reach = want[-1] if total is not None or through is None else max(want[-1], through)
                if self._reader is not None and self._floor <= want[0] and reach < self._produced:
                    state.attached = True
                    if work:
                        return gather_work(self._pieces, want), total
                    rows = self._gather(want)
                    self.rows_served += len(want)
                    return rows, total
                if self._error is not None and want[0] >= self._floor:  # the rows will not come: the pipeline failed
                    raise self._error
                behind = self._reader is not None and want[0] < self._floor
                if behind and self._catchup is not None and self._others_attached(cid):
                    state.attached = False  # a far consumer: served apart, holds nothing back
                    break
                state.attached = True
                if self._error is not None:  # rows below the failure's floor: the pipeline is not run again
                    raise self._error
                if self._reader is None or behind or self._worth_jumping(want[0]):
                    self._restart_reader(self._low())
                token = object()  # one consumer may wait in several calls (a restarted trainer rank)
                self._waiting[token] = reach
                try:
                    self._cond.wait(self._poll_s)
                finally:
                    del self._waiting[token]
                state.last_active = self._clock()
                if not alive():
                    raise ConsumerGone()
        rows, end = self._catchup.rows(want, reach)
        with self._cond:
            self._reached = max(self._reached, end)
            if work:
                return attention_work(rows), self.manifest.total_rows
            self.rows_served += rows.num_rows
            return rows, self.manifest.total_rows

    def _forget(self, cid: int) -> None:
        with self._cond:
            self._consumers.pop(cid, None)
            self._cond.notify_all()

    # -- the main reader --------------------------------------------------------------------------

    def _is_attached(self, c: _ConsumerState, now: float) -> bool:
        return c.attached and now - c.last_active < self.idle_timeout_s

    def _others_attached(self, cid: int) -> bool:
        """Another consumer reads from the main buffer (and is not idle)."""
        now = self._clock()
        return any(self._is_attached(c, now) for k, c in self._consumers.items() if k != cid)

    def _low(self) -> int:
        """The lowest row an attached consumer may still ask for: rows below it can be dropped.
        With no attached consumer nothing is dropped, so the reader fills the buffer and pauses."""
        now = self._clock()
        needs = [c.need for c in self._consumers.values() if self._is_attached(c, now)]
        return min(needs) if needs else self._floor

    def _worth_jumping(self, row: int) -> bool:
        """True when every attached consumer is past what the reader will produce and a known
        window starts beyond the reader's position: restarting there skips packing the gap."""
        low = self._low()
        return row >= self._produced and low >= self._produced and self.manifest.locate(low)[1] > self._produced

    def _restart_reader(self, row: int) -> None:
        """Start a reader at the known window holding ``row`` (caller holds the lock)."""
        window, first_row = self.manifest.locate(row)
        self._pieces, self._held = [], 0
        self._floor = self._produced = first_row
        self._launch(window, first_row)

    def _launch(self, window: int, first_row: int) -> None:
        """A new main reader from ``window`` (rows from ``first_row``); the current one is
        superseded (caller holds the lock)."""
        self._generation += 1
        self._error = None
        self.reader_starts += 1
        thread = threading.Thread(
            target=self._read, args=(self._generation, window, first_row), name=f"packfeed-reader-{window}", daemon=True
        )
        self._reader = thread
        self._readers = [t for t in self._readers if t.is_alive()] + [thread]
        thread.start()

    def _read(self, generation: int, window: int, first_row: int) -> None:
        reader = None
        try:
            reader = iter(self._open_reader(window, first_row))
            next_row, last_window = first_row, None
            for w, rows in reader:
                if w != last_window:  # a window's rows may come in several blocks
                    if last_window is not None:
                        faults.point("reader-window", last_window)  # between two windows
                    with self._cond:  # a superseded reader's windows may belong to another plan
                        if generation != self._generation:
                            return
                        self.manifest.record(w, next_row, write=False)  # no I/O under the lock
                    self.manifest.write_pending()
                    last_window = w
                if rows.num_rows == 0:
                    continue
                if int(rows.row_index[0]) != next_row:
                    raise RuntimeError(f"reader produced row {int(rows.row_index[0])}, expected {next_row}")
                for start in range(0, rows.num_rows, PIECE_ROWS):
                    piece = select_rows(rows, range(start, min(start + PIECE_ROWS, rows.num_rows)))
                    if not self._append(generation, Piece(next_row + start, piece)):
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

    def _append(self, generation: int, piece: Piece) -> bool:
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
            self._reached = max(self._reached, piece.end)
            self.peak_held = max(self.peak_held, self._held)
            self._cond.notify_all()
            return True

    def _evict(self, room: int) -> None:
        """Drop the oldest rows no attached consumer needs until ``room`` more rows fit: whole
        pieces, and, while a consumer waits for rows not produced yet, the front of the piece
        holding the lowest needed row. So a step of up to capacity - PIECE_ROWS rows can always
        be completed, and rows a late consumer may still want are kept as long as possible."""
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
                self._pieces[0] = Piece(low, select_rows(first.rows, range(cut, first.rows.num_rows)))
                self._held -= cut
                self._floor = low

    def _gather(self, want: range) -> PackedRows:
        """The rows ``want`` (all held) in order (caller holds the lock)."""
        return gather(self._pieces, want)

    # -- a change of the stream from a window on (an online mixture change) -------------------

    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        """Hold the hub still (no row handed out, no window packed) while the stream changes
        under it: ``window_from`` and ``rewind`` are called inside."""
        with self._catchup.lock if self._catchup is not None else contextlib.nullcontext(), self._cond:
            yield

    def window_from(self, row: int) -> tuple[int, int] | None:
        """(the window holding ``row``, the first window starting at or after it) or None when
        the manifest cannot tell (``row`` beyond every row produced here). Windows of 40 rows
        known, row 100: (2, 3); row 80: (2, 2). Inside ``changing()``."""
        window, first = self.manifest.locate(row)
        if first == row:
            return window, window
        total = self.manifest.total_rows
        known = window + 1 in self.manifest.first_row or row < self._reached
        return (window, window + 1) if known or (total is not None and row < total) else None

    def rewind(self, window: int, cursor: int | None = None) -> None:
        """Forget every row from ``window`` on (a change made them stale) and start the main
        reader again there: at ``window`` when its first row is known, else at the last known
        window before it (at most one window packed again); at the window holding ``cursor``
        (where the consumers read on) when its rows are no longer held. Inside ``changing()``,
        after the manifest forgot the windows after ``window``."""
        if self._catchup is not None:
            self._catchup.forget_from(window)
        if self._reader is None:
            return
        first = self.manifest.first_row.get(window)
        if first is None or first > self._produced:  # the reader is not there yet: from its own window
            start, first = self.manifest.locate(self._produced)
        else:
            start = window
        if cursor is not None and cursor < first and self._floor > cursor:  # theirs are gone: one reader, not two
            start, first = self.manifest.locate(cursor)
        while self._pieces and self._pieces[-1].start >= first:  # pieces never span two windows
            self._held -= self._pieces.pop().rows.num_rows
        self._produced, self._reached = first, min(self._reached, first)
        if not self._pieces:
            self._floor = self._produced
        self._launch(start, first)
        self._cond.notify_all()

class Consumer:
    """One consumer's handle on the hub (a context manager: leaving it releases its rows)."""

    def __init__(self, hub: RowHub, cid: int, alive: Callable[[], bool]) -> None:
        self._hub, self._cid, self._alive = hub, cid, alive

    def rows(self, indices: range, through: int | None = None) -> tuple[PackedRows | None, int | None]:
        """See RowHub: the existing rows of ``indices`` and the stream length if known (or,
        with ``through``, the knowledge that the stream reaches row ``through``)."""
        return self._hub._rows(self._cid, indices, self._alive, through)

    def work(self, indices: range, through: int | None = None) -> tuple[np.ndarray | None, int | None]:
        """``rows`` as the rows' attention work alone (client/cost.py; None for no rows): what
        balance "compute" weighs a step by, with no token copied."""
        return self._hub._rows(self._cid, indices, self._alive, through, work=True)

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> None:
        self._hub._forget(self._cid)
