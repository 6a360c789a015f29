"""Exact-fit packing: fill each row to exactly ``seq_len`` where the remaining samples allow it.

Best-fit decreasing (bfd.py) is within a few rows of the bound when short samples are
plentiful, because they fill every gap. When every sample is long next to the gaps
(long-context SFT, code files, documents of 300-4,000 tokens) it leaves a gap in almost every
row: 2.5-4.4% more rows than the lower bound on 8k-sample windows. This strategy builds rows
one at a time instead, like bin-completion and minimum-bin-slack heuristics (Korf 2002;
Gupta and Ho 1999; Fleszar and Hindi 2002), over the window's length histogram:

1. Open a row with the longest remaining sample, of length a; the gap is g = L - a.
2. Close the gap exactly with at most 5 more samples (4 after a long opener) whose lengths
   sum to g, found by a small depth-first search (at most 100 nodes) over the lengths still
   available:

   * rows opened by a sample of at most L/2: two samples summing to g are looked up in one
     step, preferring the pair whose rarer length is most plentiful (so no length runs out
     early and strands its partners), then the one closest to g/2;
   * rows opened by a sample longer than L/2 (its gap is < L/2): the largest sample that
     still leaves an exact completion, and never a last piece shorter than twice the
     shortest length left, which keeps the shortest samples for the tightest gaps.

3. No exact completion: add the longest sample that fits (best fit) and search again with
   the smaller gap. A gap that failed once is not searched again (samples only get used up,
   so it can only fail again) and a row ends when nothing fits.
4. Repeat the finished row while its lengths last (one step for many equal rows).

Worked example, L = 10, lengths [6, 5, 4, 4, 3, 3, 3, 2] (30 tokens, bound 3 rows). Rows:
6 + 4 (exact single); 5 + 3 + 2 (the pair for gap 5); 4 + 3 + 3 (the pair for gap 6):
3 rows. bfd needs 4: 6 + 4, 5 + 4 (1 slot left), 3 + 3 + 3 (1 left), and the 2 opens a row.

Never worse than bfd, by construction: bfd runs first (a few ms) and its layout is kept when
it already meets the lower bound (bounds.py: Martello-Toth L2), when this search stops
being able to beat it (checked as rows are built), or when it is not strictly better. So
wherever bfd is as good (most short-sample windows) the result is bfd's, identical.

Lengths are small integers, so the sets "lengths with >= 1, >= 2, >= 4, ... samples left"
are Python ints used as bitsets: "is there a pair summing to g" is one AND of a set with
the mirror of another, shifted (bit s of ``fwd[k]`` and bit L - s of ``rev[k]`` are set
when length s has >= 2**k samples left). Each search step costs about a microsecond.

Measured (bench/bench_packing.py, table 4, 8,192-sample windows): rows / lower bound
1.0000-1.0048 on the long-sample distributions at L 2048-32768, where bfd gives 1.0007-1.043;
10-125 ms per window (bfd: 1-7 ms). 1M-sample windows: 0.03-0.45 s (table 1 and 2).
"""

from __future__ import annotations

import numpy as np

from packfeed.client.offsets import concat_ranges, offsets_of, starts_of

from .bfd import _longest_first, pack_bfd
from .bounds import lower_bound_of_counts
from .types import Layout

_DEPTH = 5  # samples in one exact completion (4 after an opener longer than L/2)
_NODES_PER_SEARCH = 100
_NODES_PER_SAMPLE = 64  # total search budget of a window; then best fit only


def pack_exactfit(lengths: np.ndarray, seq_len: int) -> Layout:
    """Pack pieces of ``lengths`` (int64, each 1..seq_len) whole into rows, closing rows exactly.

    Returns bfd's layout unless this one has strictly fewer rows (see the module docstring).
    Within a row pieces appear longest first; equal lengths go to rows in index order.
    Deterministic.
    """
    if len(lengths) == 0:
        return Layout.empty()
    plain = pack_bfd(lengths, seq_len)
    plain_rows = len(plain.row_splits) - 1
    counts = np.bincount(lengths, minlength=seq_len + 1)
    if plain_rows <= lower_bound_of_counts(counts, seq_len):
        return plain
    rows = _ExactFit(counts, seq_len, _NODES_PER_SAMPLE * len(lengths)).rows(plain_rows)
    return plain if rows is None else _layout(rows, lengths, seq_len)


def _bitset(mask: np.ndarray) -> int:
    """Bool array -> int with bit i set where mask[i]."""
    return int.from_bytes(np.packbits(mask, bitorder="little").tobytes(), "little")


class _ExactFit:
    """The remaining samples as a histogram plus bitsets, and the row search over them."""

    def __init__(self, counts: np.ndarray, seq_len: int, budget: int):
        self.L = seq_len
        self.cnt = counts.tolist()
        levels = max(1, int(counts.max()).bit_length())
        self.fwd = [_bitset(counts >= (1 << k)) for k in range(levels)]
        self.rev = [_bitset((counts >= (1 << k))[::-1]) for k in range(levels)]
        self.tokens = int(counts @ np.arange(seq_len + 1))
        self.budget = budget  # search nodes left for the whole window
        self.nodes = 0  # search nodes left for the current search

    # -- the histogram -------------------------------------------------------------------

    def take(self, s: int, m: int = 1) -> None:
        """Use m samples of length s: clear s from the levels its count drops below."""
        c = self.cnt[s]
        self.cnt[s] = c - m
        for k in range((c - m).bit_length(), c.bit_length()):
            self.fwd[k] ^= 1 << s
            self.rev[k] ^= 1 << (self.L - s)

    def give_back(self, s: int, m: int = 1) -> None:
        c = self.cnt[s]
        self.cnt[s] = c + m
        for k in range(c.bit_length(), (c + m).bit_length()):
            self.fwd[k] ^= 1 << s
            self.rev[k] ^= 1 << (self.L - s)

    def longest_upto(self, x: int) -> int:
        """The longest length <= x with a sample left, or -1 (for x < 1 too)."""
        if x < 1:
            return -1
        return (self.fwd[0] & ((2 << x) - 1)).bit_length() - 1

    def shortest(self) -> int:
        f = self.fwd[0]
        return (f & -f).bit_length() - 1

    # -- the search ----------------------------------------------------------------------

    def pair(self, g: int, hi: int) -> int:
        """b >= g - b, b <= hi, both available, the rarer of the two as plentiful as possible;
        returns b, or 0 if there is no such pair.

        Pairs b + (g - b) at level k: bit b of ``fwd[k]`` and bit L - g + b of ``rev[k]``,
        i.e. bit b of ``rev[k] >> (L - g)``. E.g. L = 10, g = 7, lengths {3, 4, 6} left:
        rev has bits {7, 6, 4}, shifted by 3: {4, 3, 1}; AND fwd {3, 4, 6} -> {3, 4}: 4 + 3.
        The level (how plentiful) is found by bisection, then the b closest to g / 2.
        """
        lo, top = (g + 1) >> 1, min(hi, g - 1)
        if top < lo:
            return 0
        window = ((2 << top) - 1) >> lo << lo
        shift = self.L - g
        half = g >> 1 if g % 2 == 0 else 0

        def found(k: int) -> int:
            m = self.fwd[k] & (self.rev[k] >> shift) & window
            if k == 0 and half and self.cnt[half] == 1 and (m >> half) & 1:
                m ^= 1 << half  # g/2 + g/2 needs two samples
            return m

        best = found(0)
        if not best:
            return 0
        low, high = 0, len(self.fwd) - 1
        while low < high:
            mid = (low + high + 1) >> 1
            m = found(mid)
            if m:
                low, best = mid, m
            else:
                high = mid - 1
        return (best & -best).bit_length() - 1

    def complete(self, g: int, hi: int, depth: int, long_opener: bool) -> list[int] | None:
        """At most ``depth`` available lengths, each <= hi, summing exactly to g (longest
        first), or None. Depth-first over the longest one, b, from the longest that leaves
        room for two more down to g / depth (b is the longest, so depth * b >= g); a long
        opener's row gets no pair look-up and no completion shorter than twice the shortest
        length left (see the module docstring). Spends ``self.nodes``.
        """
        if g <= hi and self.cnt[g]:
            return [g]
        if depth == 1:
            return None
        if not long_opener:
            b = self.pair(g, hi)
            if b:
                return [b, g - b]
        if depth == 2:
            return None
        smallest = self.shortest()
        if 3 * smallest > g:
            return None
        b = self.longest_upto(min(hi, g - 2 * smallest))
        while b > 0 and b * depth >= g:  # b is the longest of the rest: depth * b >= g
            self.nodes -= 1
            if self.nodes < 0:
                return None
            self.take(b)
            rest = self.complete(g - b, b, depth - 1, long_opener)
            self.give_back(b)
            if rest:
                return [b] + rest
            b = self.longest_upto(b - 1)
        return None

    def rows(self, row_limit: int) -> list[tuple[int, tuple[int, ...]]] | None:
        """All rows as (repeats, lengths longest first), or None once they cannot number
        fewer than ``row_limit``."""
        L = self.L
        failed = (set(), set())  # gaps whose search failed, for short and long openers
        out: list[tuple[int, tuple[int, ...]]] = []
        num_rows = 0
        while self.fwd[0]:
            a = self.fwd[0].bit_length() - 1
            self.take(a)
            row = [a]
            g = L - a
            long_opener = 2 * a > L
            tried = failed[long_opener]
            while g:
                s = self.longest_upto(g)
                if s < 0:
                    break
                if g <= _DEPTH * s and g not in tried and self.budget > 0:
                    self.nodes = _NODES_PER_SEARCH
                    rest = self.complete(g, L, _DEPTH, long_opener)
                    self.budget -= _NODES_PER_SEARCH - max(self.nodes, 0)
                    if rest:
                        for x in rest:
                            self.take(x)
                        row += rest
                        g = 0
                        break
                    tried.add(g)
                self.take(s)
                row.append(s)
                g -= s
            row.sort(reverse=True)
            repeats = 1 + self._repeat(row)
            out.append((repeats, tuple(row)))
            num_rows += repeats
            self.tokens -= repeats * (L - g)
            if num_rows + -(-self.tokens // L) >= row_limit:
                return None
        return out

    def _repeat(self, row: list[int]) -> int:
        """Take as many more copies of ``row`` as the histogram holds; return how many."""
        need: dict[int, int] = {}
        for x in row:
            need[x] = need.get(x, 0) + 1
        extra = min(self.cnt[x] // m for x, m in need.items())
        if extra:
            for x, m in need.items():
                self.take(x, m * extra)
        return extra


def _layout(rows: list[tuple[int, tuple[int, ...]]], lengths: np.ndarray, seq_len: int) -> Layout:
    """Rows of lengths -> Layout: the k-th slot of length s (in row order) gets the k-th
    sample of length s (in index order). E.g. rows (6, 4), (4, 3, 3) over lengths
    [4, 3, 6, 4, 3]: the 4-slots get samples 0 and 3, the 3-slots 1 and 4."""
    repeats = np.array([r for r, _ in rows], dtype=np.int64)
    row_len = np.array([len(p) for _, p in rows], dtype=np.int64)
    flat = np.fromiter((x for _, p in rows for x in p), dtype=np.int64, count=int(row_len.sum()))
    first = starts_of(row_len)
    row_kind = np.repeat(np.arange(len(rows), dtype=np.int64), repeats)
    row_splits = offsets_of(row_len[row_kind])
    slot_len = flat[concat_ranges(first[row_kind], row_len[row_kind])]
    piece = np.empty(len(lengths), dtype=np.int64)
    piece[_longest_first(slot_len, seq_len)] = _longest_first(lengths, seq_len)
    return Layout(piece, np.zeros(len(lengths), dtype=np.int64), slot_len, row_splits)
