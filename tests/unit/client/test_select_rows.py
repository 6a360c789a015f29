"""select_rows and renumber_rows: the rows at the given positions, each exactly as it was, segments included.

Checked against a per-row reference (row r of the result is row positions[r] of the source,
compared column by column, its segments through row_seq_lens/row_sample_ids) over random
packed rows with 1..L segments per row and every kind of position list: empty, one row,
repeated, reversed, strided, random.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packfeed.client.rows import (
    IGNORE_INDEX,
    PAD_SAMPLE_ID,
    PackedRows,
    check_rows,
    positions_from_seq_lens,
    renumber_rows,
    select_rows,
)


def _random_rows(rng: np.random.Generator, num_rows: int, seq_len: int) -> PackedRows:
    lens_per_row, sids_per_row = [], []
    for r in range(num_rows):
        k = int(rng.integers(1, seq_len + 1))
        cuts = np.sort(rng.choice(np.arange(1, seq_len), size=k - 1, replace=False)) if k > 1 else []
        lens = np.diff(np.concatenate([[0], cuts, [seq_len]])).astype(np.int32)
        sids = rng.integers(0, 10_000, size=k).astype(np.int64)
        if k > 1 and rng.random() < 0.3:
            sids[-1] = PAD_SAMPLE_ID
        lens_per_row.append(lens)
        sids_per_row.append(sids)
    ids = rng.integers(1, 500, size=(num_rows, seq_len)).astype(np.int32)
    labels = ids.copy()
    for r, (lens, sids) in enumerate(zip(lens_per_row, sids_per_row)):
        labels[r, np.cumsum(lens) - lens] = IGNORE_INDEX
        if sids[-1] == PAD_SAMPLE_ID:
            labels[r, seq_len - lens[-1]:] = IGNORE_INDEX
    return PackedRows.from_columns({
        "input_ids": ids,
        "labels": labels,
        "position_ids": np.stack([positions_from_seq_lens(x) for x in lens_per_row]) if num_rows else ids,
        "seq_lens": lens_per_row,
        "sample_ids": sids_per_row,
        "row_index": 1000 + 7 * np.arange(num_rows),
    })


def _assert_selected(got: PackedRows, source: PackedRows, positions) -> None:
    positions = [int(p) for p in positions]
    assert got.num_rows == len(positions)
    assert got.segment_splits[0] == 0 and got.segment_splits[-1] == len(got.seq_lens) == len(got.sample_ids)
    for r, p in enumerate(positions):
        for name in ("input_ids", "labels", "position_ids"):
            np.testing.assert_array_equal(getattr(got, name)[r], getattr(source, name)[p], err_msg=f"{name} row {r}")
        np.testing.assert_array_equal(got.row_seq_lens(r), source.row_seq_lens(p), err_msg=f"seq_lens row {r}")
        np.testing.assert_array_equal(got.row_sample_ids(r), source.row_sample_ids(p), err_msg=f"sample_ids row {r}")
        assert got.row_index[r] == source.row_index[p]
    assert got.seq_lens.dtype == np.int32 and got.sample_ids.dtype == np.int64
    assert got.segment_splits.dtype == np.int64 and got.row_index.dtype == np.int64


def test_golden_two_of_three_rows():
    # L=4. Row 0: segments [1, 3]; row 1: [4]; row 2: [2, 1, 1] (last one padding).
    source = PackedRows(
        input_ids=np.array([[1, 2, 2, 2], [3, 3, 3, 3], [4, 4, 5, 0]], np.int32),
        labels=np.array([[-100, -100, 2, 2], [-100, 3, 3, 3], [-100, 4, -100, -100]], np.int32),
        position_ids=np.array([[0, 0, 1, 2], [0, 1, 2, 3], [0, 1, 0, 0]], np.int32),
        seq_lens=np.array([1, 3, 4, 2, 1, 1], np.int32),
        sample_ids=np.array([10, 11, 12, 13, 14, -1], np.int64),
        segment_splits=np.array([0, 2, 3, 6], np.int64),
        row_index=np.array([40, 41, 42], np.int64),
    )
    got = select_rows(source, [2, 0])
    assert got.input_ids.tolist() == [[4, 4, 5, 0], [1, 2, 2, 2]]
    assert got.seq_lens.tolist() == [2, 1, 1, 1, 3]
    assert got.sample_ids.tolist() == [13, 14, -1, 10, 11]
    assert got.segment_splits.tolist() == [0, 3, 5]
    assert got.row_index.tolist() == [42, 40]
    check_rows(got, 4)


@pytest.mark.parametrize(
    "positions",
    [
        pytest.param([], id="empty"),
        pytest.param([0], id="first"),
        pytest.param([19], id="last"),
        pytest.param(range(20), id="all"),
        pytest.param(range(19, -1, -1), id="reversed"),
        pytest.param(range(1, 20, 3), id="strided"),
        pytest.param([5, 5, 5, 0, 5], id="repeated"),
        pytest.param(np.array([3, 17, 2], dtype=np.int32), id="int32-array"),
    ],
)
def test_selected_rows_equal_the_source_rows(positions):
    source = _random_rows(np.random.default_rng(0), 20, 16)
    check_rows(source, 16)
    assert len(set(np.diff(source.segment_splits).tolist())) > 3, "the source needs rows of many segment counts"
    got = select_rows(source, positions)
    _assert_selected(got, source, positions)
    if len(got.row_index):
        check_rows(got, 16)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    num_rows=st.integers(1, 12),
    seq_len=st.integers(1, 10),
    picks=st.lists(st.integers(0, 10**6), max_size=30),
)
def test_selected_rows_equal_the_source_rows_property(seed, num_rows, seq_len, picks):
    source = _random_rows(np.random.default_rng(seed), num_rows, seq_len)
    positions = [p % num_rows for p in picks]
    _assert_selected(select_rows(source, positions), source, positions)


def test_selection_does_not_alias_the_source():
    source = _random_rows(np.random.default_rng(1), 5, 8)
    before = source.input_ids.copy()
    got = select_rows(source, [1, 2])
    got.input_ids[:] = -1
    got.seq_lens[:] = -1
    np.testing.assert_array_equal(source.input_ids, before)
    assert (source.seq_lens > 0).all()


@pytest.mark.parametrize("positions", [[5], [-1], [0, 7]], ids=["past-the-end", "negative", "one-bad"])
def test_positions_outside_the_rows_raise(positions):
    source = _random_rows(np.random.default_rng(2), 5, 8)
    with pytest.raises(IndexError, match=r"\[0, 5\)"):
        select_rows(source, positions)


def test_empty_selection_of_no_rows():
    source = _random_rows(np.random.default_rng(3), 0, 8)
    got = select_rows(source, [])
    assert got.num_rows == 0 and got.segment_splits.tolist() == [0] and len(got.seq_lens) == 0


@pytest.mark.parametrize("num_rows", [0, 1, 7])
@pytest.mark.parametrize("first", [0, 5, 2**40])
def test_renumbered_rows_count_on_from_first_and_keep_every_column(num_rows, first):
    source = _random_rows(np.random.default_rng(num_rows), num_rows, 8)
    got = renumber_rows(source, first)
    assert got.row_index.tolist() == list(range(first, first + num_rows))
    assert got.row_index.dtype == np.int64
    assert source.row_index.tolist() == (1000 + 7 * np.arange(num_rows)).tolist()  # the source keeps its numbers
    for name in ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "segment_splits"):
        assert getattr(got, name) is getattr(source, name), name  # shared, not copied
