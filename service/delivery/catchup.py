"""The rows a RowHub holds (``Piece``, ``gather``) and its catch-up path (``CatchUp``).

A piece is a run of consecutive rows of one window, by global index; the main buffer and the
catch-up cache both hold pieces, and ``gather`` takes any increasing range of rows out of a
sorted list of them. The catch-up path serves far consumers (rows below the main buffer, see
hub.py): it packs exactly the windows such a consumer needs, one at a time, through
``pack_window``, records their first rows in the manifest, and caches at most ``capacity``
rows of them (least recently used first out). A mixture change forgets the windows it makes
stale (``forget_from``). Pure Python and numpy.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
from packfeed.client.cost import attention_work
from packfeed.client.rows import PackedRows, concat_rows, renumber_rows, select_rows
from packfeed.service.delivery.manifest import Manifest

# pack_window(window) -> that window's rows (row_index local), or None past the last window.
PackWindow = Callable[[int], "PackedRows | None"]


@dataclass
class Piece:
    start: int  # global index of the first row
    rows: PackedRows

    @property
    def end(self) -> int:
        return self.start + self.rows.num_rows


def gather(pieces: list[Piece], want: range) -> PackedRows | None:
    """Rows ``want`` from ``pieces`` (sorted, covering them) in order; None for no rows."""
    if len(want) == 0:
        return None
    parts = [select_rows(piece.rows, positions) for piece, positions in _runs(pieces, want)]
    return parts[0] if len(parts) == 1 else concat_rows(parts)


def gather_work(pieces: list[Piece], want: range) -> np.ndarray:
    """float64 [len(want)]: the attention work (client/cost.py) of rows ``want``, read from the
    pieces' segment lengths alone: no token is copied (balance "compute" weighs a whole step)."""
    parts = [attention_work(piece.rows)[positions] for piece, positions in _runs(pieces, want)]
    return np.concatenate(parts) if parts else np.zeros(0)


def _runs(pieces: list[Piece], want: range) -> Iterator[tuple[Piece, np.ndarray]]:
    """(piece, positions in it) of the rows ``want``, in order."""
    starts = [p.start for p in pieces]
    indices = np.arange(want.start, want.stop, want.step, dtype=np.int64)
    i = 0
    while i < len(indices):
        k = bisect.bisect_right(starts, int(indices[i])) - 1
        piece = pieces[k]
        j = int(np.searchsorted(indices, piece.end))
        yield piece, indices[i:j] - piece.start
        i = j


class CatchUp:
    """Windows packed apart for far consumers, cached (see the module docstring). ``lock``:
    held while a window is packed (one at a time) and by whoever changes the stream under it."""

    def __init__(self, pack_window: PackWindow, manifest: Manifest, capacity: int) -> None:
        self._pack_window, self.manifest, self.capacity = pack_window, manifest, capacity
        self.lock = threading.Lock()
        self._cache: OrderedDict[int, Piece] = OrderedDict()  # window -> its rows (global index)
        self._rows = 0
        self.windows = 0  # windows packed

    def rows(self, want: range, reach: int) -> tuple[PackedRows, int]:
        """Rows ``want`` from the cache, packing the windows it lacks one at a time, up to row
        ``reach`` or the end; and the end of the last piece (rows produced up to there)."""
        with self.lock:
            window, first = self.manifest.locate(want[0])
            pieces: list[Piece] = []
            while first <= reach:
                piece = self._cache.get(window)
                if piece is None:
                    rows = self._pack_window(window)
                    if rows is None:  # past the last window: the stream ends here
                        self.manifest.record_end(first)
                        break
                    self.windows += 1
                    piece = Piece(first, renumber_rows(rows, first))
                    self._put(window, piece)
                else:
                    self._cache.move_to_end(window)
                self.manifest.record(window, first)
                self.manifest.record(window + 1, piece.end)
                if piece.end > want[0] and piece.rows.num_rows:
                    pieces.append(piece)
                window, first = window + 1, piece.end
            total = self.manifest.total_rows
            if total is not None:
                want = range(want.start, min(want.stop, max(total, want.start)), want.step)
            return gather(pieces, want), first

    def forget_from(self, window: int) -> None:
        """Drop the cached windows from ``window`` on (caller holds ``lock``)."""
        for w in [w for w in self._cache if w >= window]:
            self._rows -= self._cache.pop(w).rows.num_rows

    def _put(self, window: int, piece: Piece) -> None:
        self._cache[window] = piece
        self._rows += piece.rows.num_rows
        while self._rows > self.capacity and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._rows -= old.rows.num_rows
