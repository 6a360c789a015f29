"""The mixture arithmetic (service/data/mixture.py): per-epoch counts, windows that hold every
source in proportion, and each source's seeded sequence of passes. Pure numpy, no files."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packfeed.service.data.mixture import SourceOrder, epoch_counts, window_bounds


# ---- per-epoch counts ------------------------------------------------------------------------
@pytest.mark.parametrize("rows, repeats, expected", [
    pytest.param([10, 4], [1.0, 1.0], [10, 4], id="plain"),
    pytest.param([10, 4], [2.0, 0.5], [20, 2], id="up-and-down"),
    pytest.param([3, 5], [0.5, 0.3], [2, 2], id="half-rounds-up"),  # 1.5 -> 2, 1.5 -> 2
    pytest.param([7], [2.5], [18], id="two-and-a-half-passes"),  # 17.5 -> 18
])
def test_repeat_counts_golden(rows, repeats, expected):
    assert epoch_counts(rows, repeats=repeats).tolist() == expected


@pytest.mark.parametrize("weights, per_epoch, expected", [
    pytest.param([1, 1], 7, [4, 3], id="tie-to-the-earlier-source"),
    pytest.param([3, 1], 10, [8, 2], id="largest-remainder"),  # 7.5, 2.5 -> 8, 2
    pytest.param([1, 1, 1], 10, [4, 3, 3], id="three-thirds"),
    pytest.param([0.2, 0.3, 0.5], 9, [2, 3, 4], id="fractions"),  # 1.8 2.7 4.5 -> 2 3 4
])
def test_weight_counts_golden(weights, per_epoch, expected):
    got = epoch_counts([100] * len(weights), weights=weights, samples_per_epoch=per_epoch)
    assert got.tolist() == expected and got.sum() == per_epoch


@settings(max_examples=200, deadline=None)
@given(weights=st.lists(st.floats(0.01, 100), min_size=1, max_size=8), per_epoch=st.integers(1, 10**6))
def test_weight_counts_add_up_and_stay_within_one_of_the_exact_share(weights, per_epoch):
    got = epoch_counts([1] * len(weights), weights=weights, samples_per_epoch=per_epoch)
    exact = per_epoch * np.asarray(weights) / sum(weights)
    assert got.sum() == per_epoch and np.all(np.abs(got - exact) < 1)


# ---- windows ---------------------------------------------------------------------------------
@pytest.mark.parametrize("counts, window, windows", [
    # exact shares per window (2.0, 1.2, 0.8); boundaries round (4, 2.4, 1.6) -> (4, 2, 2)
    pytest.param([5, 3, 2], 4, [[2, 1, 1], [2, 1, 1], [1, 1, 0]], id="three-sources"),
    pytest.param([6, 3], 3, [[2, 1], [2, 1], [2, 1]], id="exact-shares"),
    # shares (0.67, 0.67, 0.67) each round up to 1: the first window takes all, no empty last one
    pytest.param([1, 1, 1], 2, [[1, 1, 1]], id="thirds-of-two"),
    pytest.param([7], 3, [[3], [3], [1]], id="one-source-short-last"),
])
def test_window_bounds_golden(counts, window, windows):
    assert np.diff(window_bounds(counts, window), axis=0).tolist() == windows


@settings(max_examples=400, deadline=None)
@given(counts=st.lists(st.integers(0, 5000), min_size=1, max_size=7), window=st.integers(1, 3000))
def test_every_window_holds_each_source_within_one_of_its_share(counts, window):
    total = sum(counts)
    bounds = window_bounds(counts, window)
    assert bounds[0].tolist() == [0] * len(counts) and bounds[-1].tolist() == counts
    per_window = np.diff(bounds, axis=0)
    assert (per_window >= 0).all(), "no window takes back a sample: the last one's remainder is >= 0"
    assert (per_window.sum(axis=1) > 0).all(), "no empty window"
    if window >= len(counts):  # only the last window can come out empty (then dropped)
        assert len(bounds) - 1 in (-(-total // window), -(-total // window) - 1)
    nonzero = sum(1 for c in counts if c)
    for k in range(len(per_window) - 1):  # every window but the last
        if window < len(counts):
            break  # windows below the number of sources: only the counts matter
        assert abs(int(per_window[k].sum()) - window) < max(nonzero, 1), "about W samples per window"
        for s, c in enumerate(counts):
            assert abs(per_window[k, s] - Fraction(window * c, total)) < 1, (k, s)
            assert abs(bounds[k + 1, s] - Fraction((k + 1) * window * c, total)) <= Fraction(1, 2)


def test_window_bounds_is_deterministic_and_integer_exact():
    a = window_bounds([10**9 + 7, 3, 123456], 8192)
    b = window_bounds([10**9 + 7, 3, 123456], 8192)
    assert np.array_equal(a, b) and a.dtype == np.int64


# ---- a source's sequence of passes -----------------------------------------------------------
def test_source_order_golden_blocks():
    order = SourceOrder(10, block=4, seed=0, source=0)
    blocks = order.pass_blocks(0).tolist()
    assert sorted(blocks) == [0, 1, 2]  # rows [0:4] [4:8] [8:10]
    spans = {0: (0, 4), 1: (4, 8), 2: (8, 10)}
    expected_rows = [r for b in blocks for r in range(*spans[b])]
    assert [r for lo, hi in order.ranges(0, 10) for r in range(lo, hi)] == expected_rows


@pytest.mark.parametrize("rows, block", [(10, 4), (100, 7), (64, 64), (33, 1), (50, 0)])
def test_every_pass_visits_every_row_once_and_passes_differ(rows, block):
    order = SourceOrder(rows, block=block, seed=5, source=2)
    passes = [[r for lo, hi in order.ranges(p * rows, (p + 1) * rows) for r in range(lo, hi)] for p in range(4)]
    for visited in passes:
        assert sorted(visited) == list(range(rows))
    if 0 < block < rows and rows // max(block, 1) >= 3:
        assert len({tuple(v) for v in passes}) > 1, "passes are shuffled anew"
    if block == 0:
        assert all(v == list(range(rows)) for v in passes), "block 0 keeps file order"


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(1, 300), block=st.integers(0, 40), cuts=st.lists(st.integers(0, 1200), max_size=8))
def test_ranges_of_consecutive_cuts_concatenate_to_the_whole_sequence(rows, block, cuts):
    order = SourceOrder(rows, block=block, seed=1, source=0)
    points = sorted({0, 1200, *cuts})
    pieces = [r for a, b in zip(points, points[1:]) for lo, hi in order.ranges(a, b) for r in range(lo, hi)]
    whole = [r for lo, hi in order.ranges(0, 1200) for r in range(lo, hi)]
    assert pieces == whole and len(whole) == 1200
    counts = Counter(whole)
    assert set(counts.values()) <= {1200 // rows, 1200 // rows + 1}, "passes one after the other"


def test_source_order_depends_on_seed_and_source_only():
    a = SourceOrder(1000, block=16, seed=3, source=1).ranges(0, 3000)
    assert a == SourceOrder(1000, block=16, seed=3, source=1).ranges(0, 3000)
    assert a != SourceOrder(1000, block=16, seed=4, source=1).ranges(0, 3000)
    assert a != SourceOrder(1000, block=16, seed=3, source=2).ranges(0, 3000)


# ---- the numpy forms equal the plain arithmetic they replaced (rows byte-identical) -----------
def reference_bounds(counts, window):
    """window_bounds as a Python loop over exact integers (before issue 26)."""
    total, num_windows = sum(counts), -(-sum(counts) // window)
    rows = [[0] * len(counts)]
    rows += [[(2 * k * window * c + total) // (2 * total) for c in counts] for k in range(1, num_windows)]
    rows += [list(counts)] if num_windows else []
    return [r for i, r in enumerate(rows) if i == 0 or r != rows[i - 1]]


@settings(max_examples=300, deadline=None)
@given(counts=st.lists(st.integers(0, 2**40 // 8), min_size=1, max_size=6).filter(any), data=st.data())
def test_window_bounds_equals_the_exact_integer_loop(counts, data):
    window = data.draw(st.integers(max(1, sum(counts) // 3000), sum(counts)))
    assert window_bounds(counts, window).tolist() == reference_bounds(counts, window)


def reference_ranges(rows, block, seed, source, start, stop):
    """SourceOrder.ranges with a permutation and an offsets array per pass (before issue 26)."""
    block = block if 0 < block < rows else rows
    num_blocks = -(-rows // block)
    out, pos = [], start
    while pos < stop:
        p, offset = divmod(pos, rows)
        end = min(stop - p * rows, rows)
        order = np.random.default_rng([seed, source, p]).permutation(num_blocks) if num_blocks > 1 else [0]
        lengths = [block] * num_blocks
        lengths[-1] = rows - block * (num_blocks - 1)
        starts = np.concatenate(([0], np.cumsum([lengths[b] for b in order])))
        i = int(np.searchsorted(starts, offset, side="right")) - 1
        while offset < end:
            take = min(int(starts[i + 1]), end) - offset
            lo = int(order[i]) * block + offset - int(starts[i])
            if out and out[-1][1] == lo:
                out[-1] = (out[-1][0], lo + take)
            else:
                out.append((lo, lo + take))
            offset, i = offset + take, i + 1
        pos = p * rows + end
    return out


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 400), block=st.integers(0, 70), seed=st.integers(0, 3),
       cuts=st.lists(st.integers(0, 1600), min_size=1, max_size=6))
def test_source_order_equals_the_permutation_with_offsets(rows, block, seed, cuts):
    order = SourceOrder(rows, block=block, seed=seed, source=1)
    points = sorted({0, *cuts})
    for a, b in zip(points, points[1:]):
        assert order.ranges(a, b) == reference_ranges(rows, block, seed, 1, a, b)
