"""``check_packing``: prove a ``Packing`` is a correct packing of given lengths (raises ValueError).

Independent of how the packing was computed; the tests run every strategy and policy through
it, and a pipeline can run it on a sample of windows. Checks:

* shapes and dtypes; ``row_splits`` from 0 to the number of segments, no empty row;
* every row holds at most ``seq_len`` tokens; every segment at least 1;
* coverage: each sample's segments tile exactly its kept tokens, no overlap and no gap: all
  ``n`` tokens, or the first ``seq_len`` if truncated, or none if dropped;
* ``truncated`` / ``split`` / ``dropped`` are exactly the samples longer than ``seq_len``
  for the policy, and empty for the others;
* bfd, exactfit (strategies that do not cut at row ends): every segment is a whole sample,
  or under ``split`` a whole ``seq_len``-aligned piece;
* concat: every row but the last is exactly full and the stream is in input order;
* with ``pairs``: every kept pair is one whole segment, every overlong pair dropped, and a
  concat row ends early only where the pair that starts the next row would not fit.

Cost: O(segments log segments), vectorised.

``reference_bfd_fills`` is plain best-fit decreasing, one item at a time (slow: for tests,
to show the grouped implementation in bfd.py is exact).
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np

from .overlong import check_policy
from .registry import get_strategy
from .types import Packing


def check_packing(
    packing: Packing, lengths, seq_len: int, *, strategy: str = "exactfit", overlong: str = "truncate",
    pairs=None,
) -> None:
    """Raise ValueError unless ``packing`` is what ``pack(lengths, seq_len, strategy=...,
    overlong=..., pairs=...)`` may return (see the module docstring for the list of checks)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    pairs = np.zeros(len(lengths), dtype=bool) if pairs is None else np.asarray(pairs, dtype=bool)
    whole_samples = not get_strategy(strategy).cuts_at_row_ends
    check_policy(overlong)
    seg_sample, seg_start, seg_len = packing.segment_sample, packing.segment_start, packing.segment_len
    splits = packing.row_splits

    for name in ("segment_sample", "segment_start", "segment_len", "row_splits", "truncated", "split", "dropped"):
        arr = getattr(packing, name)
        if arr.dtype != np.int64 or arr.ndim != 1:
            raise ValueError(f"{name} must be 1-D int64, got {arr.dtype} {arr.shape}")
    if not (len(seg_sample) == len(seg_start) == len(seg_len)):
        raise ValueError("segment arrays must have equal length")
    if len(splits) < 1 or splits[0] != 0 or splits[-1] != len(seg_len) or (np.diff(splits) < 1).any():
        raise ValueError("row_splits must go from 0 to the number of segments, >= 1 segment per row")
    if len(seg_len) and ((seg_len < 1).any() or (seg_start < 0).any()):
        raise ValueError("segments must have length >= 1 and start >= 0")
    if len(seg_sample) and (seg_sample.min() < 0 or seg_sample.max() >= len(lengths)):
        raise ValueError("segment_sample out of range")
    if packing.row_tokens().max(initial=0) > seq_len:
        raise ValueError(f"a row holds more than seq_len={seq_len} tokens")

    # The overlong policy's records.
    over = np.flatnonzero(lengths > seq_len)
    expected = {"truncated": over[:0], "split": over[:0], "dropped": over[pairs[over]]}
    name = {"truncate": "truncated", "split": "split", "drop": "dropped"}[overlong]
    expected[name] = np.union1d(expected[name], over[~pairs[over]])
    for name, want in expected.items():
        if not np.array_equal(getattr(packing, name), want):
            raise ValueError(f"{name} must list exactly the samples the {overlong!r} policy touched")

    # Coverage: sorted by (sample, start), each sample's segments must be back to back from 0.
    kept = lengths.copy()
    if overlong == "truncate":
        kept[over] = seq_len
    elif overlong == "drop":
        kept[over] = 0
    kept[over[pairs[over]]] = 0
    pair_segments = pairs[seg_sample]
    if ((seg_start != 0) | (seg_len != lengths[seg_sample]))[pair_segments].any():
        raise ValueError("a preference pair was cut: it must be one whole segment")
    order = np.lexsort((seg_start, seg_sample))
    s, st, ln = seg_sample[order], seg_start[order], seg_len[order]
    first_of_sample = np.ones(len(s), dtype=bool)
    first_of_sample[1:] = s[1:] != s[:-1]
    if (st[first_of_sample] != 0).any():
        raise ValueError("a sample's first segment does not start at token 0")
    cont = ~first_of_sample[1:]
    if (st[1:][cont] != (st[:-1] + ln[:-1])[cont]).any():
        raise ValueError("a sample's segments overlap or leave a gap")
    covered = np.bincount(s, weights=ln, minlength=len(lengths)).astype(np.int64)
    if not np.array_equal(covered, kept):
        bad = int(np.flatnonzero(covered != kept)[0])
        raise ValueError(f"sample {bad}: {covered[bad]} tokens packed, expected {kept[bad]}")

    if whole_samples:
        # Whole pieces: starts at multiples of seq_len, length min(seq_len, rest of sample).
        whole = (seg_start % seq_len == 0) & (seg_len == np.minimum(seq_len, kept[seg_sample] - seg_start))
        if not whole.all():
            raise ValueError(f"{strategy} cut a sample (or a split piece) across rows")
    elif strategy == "concat":
        row_tokens = packing.row_tokens()
        first = seg_sample[splits[1:-1]]  # the first sample of every row but the first
        early = (row_tokens[:-1] != seq_len) & ~(pairs[first] & (row_tokens[:-1] + lengths[first] > seq_len))
        if len(row_tokens) > 1 and early.any():
            raise ValueError("concat rows other than the last must be exactly full (or leave room no pair fit)")
        if len(order) and not np.array_equal(order, np.arange(len(order))):
            raise ValueError("concat must lay samples out in input order")


def reference_bfd_fills(lengths, seq_len: int) -> list[int]:
    """Plain best-fit decreasing, one item at a time; returns the sorted token count of every
    row. Items must be <= seq_len. Cost O(n * rows): small inputs only.

    The multiset of row fills does not depend on which of several rows with equal free space
    an item goes to, so it is the right thing to compare with a faster implementation.
    """
    free_rows: list[tuple[int, int]] = []  # (free space, row), sorted
    fills: list[int] = []
    for s in sorted((int(x) for x in lengths), reverse=True):
        if s > seq_len:
            raise ValueError(f"item of {s} tokens does not fit seq_len={seq_len}")
        i = bisect_left(free_rows, (s, -1))  # smallest free space >= s
        if i == len(free_rows):
            fills.append(s)
            insort(free_rows, (seq_len - s, len(fills) - 1))
        else:
            free, row = free_rows.pop(i)
            fills[row] += s
            insort(free_rows, (free - s, row))
    return sorted(fills)
