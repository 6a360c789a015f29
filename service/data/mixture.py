"""Mixtures and epochs: which samples of which source each packing window holds. Pure numpy.

A data config lists sources (each a list of files) and says how many samples each contributes
per epoch (``repeat`` r: round(r * n) of its n rows; or ``weight`` w: a share w / sum(w) of
``samples_per_epoch``). Three pieces of arithmetic turn that into windows:

1. ``epoch_counts``: samples per source per epoch, the same for every epoch.

2. ``SourceOrder``: each source is read as an endless sequence of *passes*; every pass visits
   all n rows once, as seeded blocks of ``block`` consecutive rows in a seeded order (a new
   order for every pass). Epoch e takes positions [e * c, (e + 1) * c) of that sequence, so
   ``repeat = 2.5`` gives two whole passes plus half of a third per epoch, and the next epoch
   starts with the other half; ``repeat = 0.5`` gives a seeded half per epoch, the other half
   the next. Blocks keep reads sequential (one seek per block); smaller blocks mix better.

   For n = 10, block = 4 the blocks are rows [0:4], [4:8], [8:10]; a pass in block order
   (2, 0, 1) visits rows 8 9 0 1 2 3 4 5 6 7.

3. ``window_bounds``: the epoch's samples are cut into windows of about W samples; every window
   but the last takes floor or ceil of each source's exact share (W * c_s / T, T = sum of c),
   so the mixture holds in every window, not only over the epoch; the last window of an epoch
   takes what is left and may be short. Worked example: counts (5, 3, 2), W = 4: exact shares
   per window (2.0, 1.2, 0.8); boundaries round (4, 2.4, 1.6) to (4, 2, 2), so the windows take
   (2, 1, 1), (2, 1, 1) and the short last one (1, 1, 0).

Costs: ``window_bounds`` is O(sources) per window (12k windows of 8192 samples per
100M-sample epoch: well under a second); ``SourceOrder.ranges`` builds one permutation of
n / block indices per pass it touches and keeps the last two (4 bytes a block each).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def epoch_counts(
    num_rows: Sequence[int],
    *,
    repeats: Sequence[float] | None = None,
    weights: Sequence[float] | None = None,
    samples_per_epoch: int | None = None,
) -> np.ndarray:
    """Samples each source contributes per epoch (int64 [S]).

    ``repeats``: round(r * n) each (half up). ``weights``: ``samples_per_epoch * w / sum(w)``
    rounded by largest remainder (ties to the earlier source), so they add up exactly.
    For rows (10, 4), weights (1, 1), 7 per epoch: shares (3.5, 3.5) -> (4, 3).
    """
    rows = np.asarray(num_rows, dtype=np.int64)
    if (repeats is None) == (weights is None):
        raise ValueError("give exactly one of repeats or weights")
    if repeats is not None:
        r = np.asarray(repeats, dtype=np.float64)
        return np.floor(r * rows + 0.5).astype(np.int64)
    if samples_per_epoch is None:
        raise ValueError("weights need samples_per_epoch")
    w = np.asarray(weights, dtype=np.float64)
    exact = samples_per_epoch * w / w.sum()
    counts = np.floor(exact).astype(np.int64)
    left = int(samples_per_epoch - counts.sum())
    order = np.lexsort((np.arange(len(w)), -(exact - counts)))  # largest remainder first
    counts[order[:left]] += 1
    return counts


def window_bounds(counts: Sequence[int], window: int) -> np.ndarray:
    """Cumulative samples of each source at each window boundary of one epoch.

    Returns int64 [K + 1, S]: window j holds ``bounds[j + 1] - bounds[j]`` samples of each
    source, K = ceil(T / window) (fewer when W is below the number of sources and rounding left
    windows empty: they are dropped), ``bounds[0] == 0`` and ``bounds[K] == counts``.

    Boundary k gives source s round(k W c_s / T) samples (half up, exact integers): the running
    total of every source is within 1/2 sample of its exact share at every boundary, so each
    window holds floor or ceil of its exact share W c_s / T, and the last window's remainder is
    never negative. The price: the sources' roundings do not always add up to k W, so a window
    may hold a few samples more or fewer than W (fewer than the number of sources). Window k
    costs O(S), whatever k (numpy over all windows at once: ``segment_bounds``).
    """
    c = np.asarray([int(x) for x in counts], dtype=np.int64)
    total = int(c.sum())
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    num_windows = -(-total // window)
    bounds = np.zeros((num_windows + 1, len(c)), dtype=np.int64)
    if num_windows > 1:
        bounds[1:num_windows] = segment_bounds(np.arange(1, num_windows), window, np.zeros_like(c), c)
    if num_windows:
        bounds[num_windows] = c
    # Windows left empty by the rounding (only when W is below the number of sources) are dropped.
    keep = np.concatenate(([True], (np.diff(bounds, axis=0) != 0).any(axis=1)))
    return bounds[keep]


def segment_bounds(windows: np.ndarray, window: int, base: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Cumulative samples of each source at the nominal boundaries ``windows * window``
    (int64 [N, S]) of a stage that starts with ``base`` taken (its sum P0 <= every boundary)
    and shares out R = sum(counts) further samples as ``counts``:
    ``base + round((j W - P0) c / R)``, half up, with exact integers (no float, no overflow
    for j < 2^22 and R <= 2^40: the products are split into multiples of R and remainders)."""
    j = np.asarray(windows, dtype=np.int64)
    start, remaining = int(base.sum()), int(counts.sum())
    out = np.empty((len(j), len(counts)), dtype=np.int64)
    for s, c in enumerate(int(x) for x in counts):
        alpha, beta = divmod(window * c, remaining)  # W c = alpha R + beta
        gamma, eps = divmod(start * c, remaining)  # P0 c = gamma R + eps
        q, r = np.divmod(j * beta, remaining)  # j beta < 2^22 * 2^40
        # (j W - P0) c = (j alpha - gamma + q) R + (r - eps), and round(x / R) = floor((2 x + R) / 2R)
        out[:, s] = int(base[s]) + j * alpha - gamma + q + np.floor_divide(2 * (r - eps) + remaining, 2 * remaining)
    return out


class SourceOrder:
    """The endless seeded sequence of one source's rows (passes of shuffled blocks).

    ``ranges(start, stop)`` gives the row ranges [lo, hi) of positions start..stop-1, in
    sequence order. ``block`` 0 (or >= rows) keeps file order: pass after pass of rows 0..n-1.
    """

    def __init__(self, num_rows: int, *, block: int, seed: int, source: int) -> None:
        if num_rows < 1:
            raise ValueError(f"a source needs at least one row, got {num_rows}")
        self.num_rows, self.seed, self.source = int(num_rows), int(seed), int(source)
        self.block = int(block) if 0 < block < num_rows else self.num_rows
        self.num_blocks = -(-self.num_rows // self.block)
        self.last_block = self.num_rows - self.block * (self.num_blocks - 1)  # rows of the last (short) block
        self._cache: dict[int, tuple[np.ndarray, int]] = {}

    def pass_blocks(self, pass_index: int) -> np.ndarray:
        """Block indices in the order pass ``pass_index`` visits them."""
        return self._pass(pass_index)[0]

    def _pass(self, p: int) -> tuple[np.ndarray, int]:
        """(block order, the position of the short last block in it). 4 bytes a block (int32
        below 2^31 blocks; the same order as ``Generator.permutation``); a visited block's
        offset in the pass is arithmetic (``_start``), so no offsets array is kept."""
        if p not in self._cache:
            order = np.arange(self.num_blocks, dtype=np.int32 if self.num_blocks < 2**31 else np.int64)
            if self.num_blocks > 1:
                np.random.default_rng([self.seed, self.source, p]).shuffle(order)
            short = int(np.flatnonzero(order == self.num_blocks - 1)[0])
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            self._cache[p] = (order, short)
        return self._cache[p]

    def _start(self, i: int, short: int) -> int:
        """Offset within the pass of the i-th visited block (all blocks are ``block`` rows but the short one)."""
        return i * self.block - (self.block - self.last_block if i > short else 0)

    def _position(self, offset: int, short: int) -> int:
        """The visited block holding ``offset`` (0 <= offset < num_rows)."""
        if offset < short * self.block:
            return offset // self.block
        rest = offset - short * self.block
        return short if rest < self.last_block else short + 1 + (rest - self.last_block) // self.block

    def ranges(self, start: int, stop: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        n = self.num_rows
        pos = start
        while pos < stop:
            p, offset = divmod(pos, n)
            end = min(stop - p * n, n)  # within this pass
            order, short = self._pass(p)
            i = self._position(offset, short)
            while offset < end:
                block_start = self._start(i, short)
                take = min(self._start(i + 1, short), end) - offset
                lo = int(order[i]) * self.block + (offset - block_start)
                if out and out[-1][1] == lo:
                    out[-1] = (out[-1][0], lo + take)  # adjacent blocks read as one range
                else:
                    out.append((lo, lo + take))
                offset += take
                i += 1
            pos = p * n + end
        return out


def check_share(value: float, what: str, source: str) -> float:
    """A repeat or weight must be a finite positive number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"source {source!r}: {what} must be a finite number > 0, got {value!r}")
    return float(value)
