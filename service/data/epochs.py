"""Window counts of a whole stream whose weights change (a schedule): pure numpy.

Without a schedule every epoch has the same windows (``mixture.window_bounds``). A schedule
entry replaces the weights from the first window that starts at or after its ``from_sample``.
The windows stay where they were: every epoch keeps its ``T`` samples and its ``K`` windows,
window j of an epoch starts near the nominal position j W (boundary j; boundary K is T), and
only the make-up of a window changes. From a window j0 at which new weights w take effect, with
``P0`` samples of the epoch already taken (``base``, per source), the rest of the epoch
``R = T - P0`` is shared out as if the whole rest had weights w: ``c = apportion(R, w)``
(largest remainder, as ``epoch_counts``), and boundary j gets ``base + round((j W - P0) c / R)``
(half up, exact integers), so each window holds floor or ceil of its exact share, and every
boundary's total stays within half a sample per source of j W (the offsets of one stage do
not add up over later ones; ``_boundaries`` keeps an epoch's tiny last window from being
emptied). For j0 = 0, P0 = 0 and the config's weights this is exactly ``window_bounds``: an
entry changes nothing before its window.

Worked example: T = 12, W = 4 (K = 3), two sources with counts (6, 6), an entry at sample 4
with weights (0, 1): window 0 takes (2, 2); from window 1 (it starts at 4) R = 8, c = (0, 8),
so windows 1 and 2 take (0, 4) each. Source 0 took 2 samples this epoch, source 1 took 10.

A source's position in its seeded sequence (mixture.SourceOrder) is the number of its
samples taken before, over all epochs, so a paused source resumes where it stopped.

Cost and memory: epochs whose weights do not change inside share one table of their weights
([K + 1, S] int64, computed in O(K S) numpy); each epoch in which an entry takes effect has
its own. Window k's lookup is O(log(tables)).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from packfeed.service.data.mixture import epoch_counts, segment_bounds


def apportion(total: int, weights: Sequence[float]) -> np.ndarray:
    """``total`` samples shared out by ``weights`` (largest remainder; 0 gets 0)."""
    return epoch_counts([1] * len(weights), weights=weights, samples_per_epoch=total)


@dataclass(frozen=True)
class EpochRun:
    """Epochs ``first_epoch`` .. ``first_epoch + num_epochs - 1``, all with the windows
    ``bounds`` ([K + 1, S], cumulative within the epoch); ``taken_before``: each source's
    samples in the epochs before ``first_epoch``."""

    first_epoch: int
    num_epochs: int
    bounds: np.ndarray
    taken_before: np.ndarray


class ScheduledEpochs:
    """The windows of every epoch under a schedule. ``base_bounds``: one epoch's windows under
    the config's weights (``window_bounds``, K + 1 rows, no window dropped inside); ``changes``:
    (from_sample, weights in the sources' order), strictly increasing. Raises ValueError when
    the weights leave a window empty (windows of hardly more samples than there are sources)."""

    def __init__(self, base_bounds: np.ndarray, *, window: int, epochs: int,
                 changes: Sequence[tuple[int, Sequence[float]]]) -> None:
        self.base_bounds = np.asarray(base_bounds, dtype=np.int64)
        self.window, self.epochs = int(window), int(epochs)
        self.windows_per_epoch = len(base_bounds) - 1
        self.num_sources = self.base_bounds.shape[1]
        self.samples_per_epoch = int(self.base_bounds[-1].sum())
        self.changes = [(int(f), tuple(float(x) for x in w)) for f, w in changes]
        # the window at which each change takes effect (several may share one: the last wins);
        # num_windows for a change past the end
        self.effective_windows = [self.windows_per_epoch * self.epochs] * len(self.changes)
        self.runs = self._build()
        self._firsts = [r.first_epoch for r in self.runs]

    def run_of(self, epoch: int) -> EpochRun:
        return self.runs[bisect.bisect_right(self._firsts, epoch) - 1]

    def window_range(self, k: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(epoch, positions of each source's first sample, and one past its last) of window k:
        positions in the source's endless sequence, counted over all epochs."""
        epoch, j = divmod(k, self.windows_per_epoch)
        run = self.run_of(epoch)
        offset = run.taken_before + (epoch - run.first_epoch) * run.bounds[-1]
        return epoch, offset + run.bounds[j], offset + run.bounds[j + 1]

    def stage_of(self, k: int) -> int:
        """0 for a window under the config's weights, i + 1 under change i (the last in force)."""
        return bisect.bisect_right(self.effective_windows, k)

    def window_start(self, k: int) -> int:
        """The global sample position at which window k starts (the samples of all windows before it)."""
        epoch, j = divmod(k, self.windows_per_epoch)
        return epoch * self.samples_per_epoch + int(self.run_of(epoch).bounds[j].sum())

    def _build(self) -> list[EpochRun]:
        T, epochs = self.samples_per_epoch, self.epochs
        runs: list[EpochRun] = []
        taken = np.zeros(self.num_sources, dtype=np.int64)
        table, weights, i, e = self.base_bounds, None, 0, 0  # weights None: the config's
        while e < epochs:
            next_change = self.changes[i][0] // T if i < len(self.changes) else epochs
            if next_change > e:  # whole epochs with the weights in force
                n = min(next_change, epochs) - e
                runs.append(EpochRun(e, n, table, taken.copy()))
                taken += n * table[-1]
                e += n
                continue
            scheduled, i, weights = self._epoch(e, i, weights)
            runs.append(EpochRun(e, 1, scheduled, taken.copy()))
            taken += scheduled[-1]
            e += 1
            if weights is not None:
                table = self._check(self._stage(np.zeros(self.num_sources, np.int64), apportion(T, weights), 0), e)
        return runs

    def _stage(self, base: np.ndarray, counts: np.ndarray, j0: int) -> np.ndarray:
        """Rows j0 .. K of a stage that starts at boundary j0 with ``base`` taken and shares out ``counts``."""
        K = self.windows_per_epoch
        rows = np.empty((K - j0 + 1, self.num_sources), dtype=np.int64)
        rows[0] = base
        rows[1:-1] = self._boundaries(np.arange(j0 + 1, K), base, counts)
        rows[-1] = base + counts
        return rows

    def _boundaries(self, windows: np.ndarray, base: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Boundaries ``windows`` (< K) of a stage (``segment_bounds``), but for one case: when
        the rounding leaves the epoch's last window empty (it is nominally shorter than half the
        number of sources: T - (K-1) W = 1, say), boundary K-1 gives it one sample of the
        largest source of the stage (one sample fewer in window K-2). A function of the stage
        and j only, so a later entry cuts the stage without changing a boundary before it; never
        the case under the config's weights (``window_bounds`` drops such a window)."""
        rows = segment_bounds(windows, self.window, base, counts)
        if len(rows) and windows[-1] == self.windows_per_epoch - 1 and (rows[-1] == base + counts).all():
            rows[-1, int(np.argmax(counts))] -= 1
        return rows

    def _epoch(self, e: int, i: int, weights: tuple[float, ...] | None) -> tuple[np.ndarray, int, tuple | None]:
        """Epoch ``e``'s windows, starting with ``weights``, with the changes from index ``i`` on
        that take effect in it; returns (its table, the next change's index, the weights at its end)."""
        T, K, W = self.samples_per_epoch, self.windows_per_epoch, self.window
        first = e * T
        rows = [np.zeros((1, self.num_sources), dtype=np.int64)]
        j0 = 0
        counts = self.base_bounds[-1] if weights is None else apportion(T, weights)
        while True:
            base = rows[-1][-1]
            start = int(base.sum())
            while i < len(self.changes) and self.changes[i][0] <= first + start:
                weights = self.changes[i][1]
                self.effective_windows[i] = e * K + j0
                i += 1
                counts = apportion(T - start, weights)
            if i < len(self.changes) and self.changes[i][0] < first + T:
                # the first boundary at or after the change: boundary j's total is within S/2 of j W
                f = self.changes[i][0] - first
                hi = min(K - 1, -(-(f + self.num_sources) // W) + 1)
                if hi > j0:
                    candidates = self._boundaries(np.arange(j0 + 1, hi + 1), base, counts)
                    found = np.flatnonzero(candidates.sum(axis=1) >= f)
                    if len(found):
                        rows.append(candidates[: found[0] + 1])
                        j0 += int(found[0]) + 1
                        continue
            rows.append(self._stage(base, counts, j0)[1:])
            break
        return self._check(np.concatenate(rows), e), i, weights

    def _check(self, table: np.ndarray, epoch: int) -> np.ndarray:
        sizes = np.diff(table.sum(axis=1))
        if (sizes <= 0).any():
            k = epoch * self.windows_per_epoch + int(np.flatnonzero(sizes <= 0)[0])
            raise ValueError(f"the schedule leaves window {k} (epoch {epoch + 1}) empty: windows of {self.window:,} "
                             f"samples are too small for {self.num_sources} sources; raise window_samples")
        return table
