"""client/offsets.py: offsets, starts, run sums and index runs against plain per-run loops,
over sweeps of run lengths (empty input, empty runs, one long run) and of input dtypes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packfeed.client.offsets import SLICED_RUN, concat_ranges, offsets_of, run_sums, starts_of, take_runs

LENGTHS = [
    pytest.param([], id="empty"),
    pytest.param([0], id="one-empty-run"),
    pytest.param([5], id="one-run"),
    pytest.param([3, 0, 2], id="empty-run-inside"),
    pytest.param([0, 0, 4, 0], id="empty-runs-at-both-ends"),
    pytest.param([1] * 7, id="unit-runs"),
    pytest.param([2**20, 2**20, 1], id="long-runs"),
]
INPUT_DTYPES = [np.int8, np.int32, np.int64, np.uint16, np.intp, list]


def as_input(lengths: list[int], dtype) -> object:
    if dtype is list:
        return list(lengths)
    if dtype is np.int8 or dtype is np.uint16:
        lengths = [min(x, np.iinfo(dtype).max) for x in lengths]
    return np.asarray(lengths, dtype=dtype)


def reference_offsets(lengths) -> list[int]:
    out = [0]
    for n in np.asarray(lengths).tolist():
        out.append(out[-1] + n)
    return out


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=lambda d: getattr(d, "__name__", str(d)))
@pytest.mark.parametrize("lengths", LENGTHS)
def test_offsets_and_starts_equal_a_running_total(lengths, dtype):
    given = as_input(lengths, dtype)
    expected = reference_offsets(given)
    offsets, starts = offsets_of(given), starts_of(given)
    assert offsets.tolist() == expected
    assert starts.tolist() == expected[:-1]
    assert offsets.dtype == np.int64 and starts.dtype == np.int64  # whatever the input's dtype
    assert len(offsets) == len(expected) and len(starts) == len(expected) - 1


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_the_dtype_asked_for_is_the_dtype_returned(dtype):
    lengths = np.asarray([3, 0, 2], dtype=np.int32)
    assert offsets_of(lengths, dtype).dtype == dtype
    assert starts_of(lengths, dtype).dtype == dtype
    assert offsets_of(lengths, dtype).tolist() == [0, 3, 3, 5]


def test_sums_do_not_wrap_at_int32():
    lengths = np.full(3, 2**31 - 1, dtype=np.int32)  # a plain int32 cumsum would wrap
    assert offsets_of(lengths)[-1] == 3 * (2**31 - 1)
    assert starts_of(lengths).tolist() == [0, 2**31 - 1, 2 * (2**31 - 1)]


def test_a_bool_mask_counts_its_true_entries():
    mask = np.asarray([True, False, True, True])
    assert offsets_of(mask).tolist() == [0, 1, 1, 2, 3]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(-50, 50), max_size=6), max_size=8), st.integers(0, 3), st.integers(0, 3))
def test_run_sums_equal_per_run_sums(runs, before, after):
    """Also where the runs cover only part of ``values`` (``before`` values ahead of the first,
    ``after`` past the last): those are in no run."""
    values = np.asarray([7] * before + [v for run in runs for v in run] + [9] * after, dtype=np.int64)
    splits = before + offsets_of([len(run) for run in runs])
    got = run_sums(values, splits)
    assert got.tolist() == [sum(run) for run in runs]  # empty runs sum to 0
    assert got.dtype == np.int64 and len(got) == len(runs)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.booleans(), max_size=300), max_size=8), st.integers(0, 3))
def test_run_sums_of_bool_masks_count_each_run(runs, before):
    """A mask is counted through int8 (runs far longer than int8 holds, and past it)."""
    mask = np.asarray([True] * before + [v for run in runs for v in run] + [True], dtype=bool)
    got = run_sums(mask, before + offsets_of([len(run) for run in runs]))
    assert got.tolist() == [sum(run) for run in runs] and got.dtype == np.int64


def test_run_sums_of_a_bool_mask_and_of_int32_values():
    assert run_sums(np.asarray([True, False, True]), [0, 2, 2, 3]).tolist() == [1, 0, 1]
    assert run_sums(np.ones(70_000, bool), [0, 1, 70_000]).tolist() == [1, 69_999]  # beyond int8 and int16
    big = np.full(4, 2**30, dtype=np.int32)
    assert run_sums(big, [0, 4]).tolist() == [2**32]


@pytest.mark.parametrize(
    "starts, lengths, expected",
    [
        pytest.param([5, 2], [2, 3], [5, 6, 2, 3, 4], id="jump-back"),
        pytest.param([0, 0, 0], [1, 2, 3], [0, 0, 1, 0, 1, 2], id="restart-at-zero"),
        pytest.param([7], [1], [7], id="single"),
        pytest.param([], [], [], id="empty"),
        pytest.param([7, 9, 0], [3, 0, 2], [7, 8, 9, 0, 1], id="empty-run-inside"),
        pytest.param([4, 1], [0, 0], [], id="only-empty-runs"),
        pytest.param([3, 8], [0, 2], [8, 9], id="empty-first-run"),
    ],
)
def test_concat_ranges_golden(starts, lengths, expected):
    assert concat_ranges(np.array(starts, np.int64), np.array(lengths, np.int64)).tolist() == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-1000, 1000), st.integers(0, 6)), max_size=10))
def test_concat_ranges_equals_concatenated_aranges(runs):
    starts = np.asarray([s for s, _ in runs], dtype=np.int64)
    lengths = np.asarray([n for _, n in runs], dtype=np.int64)
    expected = [x for s, n in runs for x in range(s, s + n)]
    for dtype in (np.int64, np.int32, np.intp):
        got = concat_ranges(starts, lengths, dtype=dtype)
        assert got.tolist() == expected
        assert got.dtype == dtype


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 200)), max_size=12), st.integers(0, 5))
def test_take_runs_equals_the_index_gather(runs, spare):
    """Short and long runs alike (the two ways take_runs copies: SLICED_RUN), in any order."""
    size = max([s + n for s, n in runs], default=0) + spare
    values = np.arange(size, dtype=np.int32) * 3 + 1
    starts = [s for s, _ in runs]
    lengths = [n for _, n in runs]
    got = take_runs(values, starts, lengths)
    assert got.dtype == values.dtype
    assert got.tolist() == values[concat_ranges(starts, lengths)].tolist()


@pytest.mark.parametrize("length", [1, SLICED_RUN * 3], ids=["gathered", "sliced"])
@pytest.mark.parametrize("second_start", [4, -1], ids=["past-the-end", "before-0"])
def test_take_runs_refuses_a_run_outside_the_values(length, second_start):
    values = np.zeros(length + 3, dtype=np.int32)
    with pytest.raises(IndexError):
        take_runs(values, [0, second_start], [length, length])
    assert take_runs(values, [0, 99], [length, 0]).tolist() == [0] * length  # an empty run reads nothing


def test_run_sums_refuses_runs_past_the_values():
    with pytest.raises(IndexError):
        run_sums(np.ones(4, np.int64), [0, 2, 5])
