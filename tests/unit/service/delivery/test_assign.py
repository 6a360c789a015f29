"""Row assignment: disjoint ranks, every row exactly once, equal steps, exact resume."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, check_rows
from packfeed.service.delivery.assign import (
    CursorOutOfRange,
    check_request,
    concat_rows,
    fill_batch,
    num_steps,
    padding_row,
    padding_rows,
    rows_for,
    step_rows,
)


def _deliver(world_size, batch_rows, cursor, total_rows, stop_after=None):
    """{rank: [steps]} for a run from cursor; stop_after steps (a crash) or to the end."""
    steps = {
        k: list(itertools.islice(rows_for(k, world_size, batch_rows, cursor, total_rows), stop_after))
        for k in range(world_size)
    }
    return steps


def _real_rows(steps):
    return [i for per_rank in steps.values() for s in per_rank for i in s.rows]


@pytest.mark.parametrize(
    "rank, expected_rows, expected_padding",
    [
        pytest.param(0, [[0, 2, 4], [6, 8]], [0, 1], id="rank0"),
        pytest.param(1, [[1, 3, 5], [7]], [0, 2], id="rank1"),
    ],
)
def test_golden_two_ranks_nine_rows(rank, expected_rows, expected_padding):
    steps = list(rows_for(rank, 2, 3, 0, 9))
    assert [list(s.rows) for s in steps] == expected_rows
    assert [s.num_padding for s in steps] == expected_padding
    assert [s.cursor for s in steps] == [6, 9]
    assert steps[-1].indices.tolist() == (expected_rows[-1] + ([10] if rank == 0 else [9, 11]))
    assert steps[-1].padding_mask.tolist() == [False] * len(expected_rows[-1]) + [True] * expected_padding[-1]


def test_golden_resume_two_to_three_ranks():
    # After step 0 of (N=2, B=3) the cursor is 6; rows 6, 7, 8 are left.
    assert [list(step_rows(k, 3, 1, 6, 0, 9).rows) for k in range(3)] == [[6], [7], [8]]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("batch_rows", [1, 2, 5])
@pytest.mark.parametrize("total_rows", [0, 1, 6, 13, 40])
@pytest.mark.parametrize("cursor", [0, 3])
def test_exactly_once_disjoint_equal_steps(world_size, batch_rows, total_rows, cursor):
    if cursor > total_rows:
        with pytest.raises(CursorOutOfRange):
            list(rows_for(0, world_size, batch_rows, cursor, total_rows))
        return
    steps = _deliver(world_size, batch_rows, cursor, total_rows)
    counts = {len(v) for v in steps.values()}
    assert counts == {num_steps(world_size, batch_rows, cursor, total_rows)}  # equal steps
    for rank, per_rank in steps.items():
        for s in per_rank:
            assert len(s.rows) + s.num_padding == batch_rows
            assert all(i % world_size == rank for i in s.indices)
            assert s.padding_mask.sum() == s.num_padding
            assert (s.indices[s.padding_mask] >= total_rows).all()
    delivered = _real_rows(steps)
    assert sorted(delivered) == list(range(cursor, total_rows))  # disjoint and complete
    if total_rows - cursor >= world_size * batch_rows:
        assert max(len(s.rows) for v in steps.values() for s in v) == batch_rows  # not vacuous
    all_indices = np.concatenate([s.indices for v in steps.values() for s in v] or [np.zeros(0, np.int64)])
    assert len(np.unique(all_indices)) == len(all_indices)  # padding indices unique too


@pytest.mark.parametrize("total_rows", [1, 11, 30, 37])
@pytest.mark.parametrize(
    "first, second", [((2, 3), (3, 2)), ((2, 4), (3, 1)), ((3, 1), (2, 5)), ((1, 4), (4, 4))]
)
def test_resume_from_every_step_boundary_other_world_size(total_rows, first, second):
    (n1, b1), (n2, b2) = first, second
    for crash_after in range(num_steps(n1, b1, 0, total_rows) + 1):
        before = _deliver(n1, b1, 0, total_rows, stop_after=crash_after)
        cursors = {s[-1].cursor if s else 0 for s in before.values()}
        assert len(cursors) == 1  # every rank stops at the same boundary
        cursor = cursors.pop()
        after = _deliver(n2, b2, cursor, total_rows)
        delivered = _real_rows(before) + _real_rows(after)
        assert sorted(delivered) == list(range(total_rows)), f"crash after {crash_after} steps"
        final = [s[-1].cursor for s in after.values() if s]
        assert all(c == total_rows for c in final)


def test_cursor_at_end_gives_no_steps():
    assert list(rows_for(1, 2, 4, 10, 10)) == []
    assert num_steps(2, 4, 10, 10) == 0


def test_unknown_length_streams_without_padding():
    steps = list(itertools.islice(rows_for(1, 3, 2, 5, None), 3))
    assert [list(s.rows) for s in steps] == [[7, 10], [13, 16], [19, 22]]
    assert [s.cursor for s in steps] == [11, 17, 23]
    assert all(s.num_padding == 0 for s in steps)


@pytest.mark.parametrize(
    "args, match",
    [
        pytest.param((2, 2, 1, 0), "rank", id="rank-eq-world"),
        pytest.param((0, 0, 1, 0), "world_size", id="world-zero"),
        pytest.param((0, 1, 0, 0), "batch_rows", id="batch-zero"),
        pytest.param((0, 1, 1, -1), "cursor", id="cursor-negative"),
    ],
)
def test_bad_requests(args, match):
    with pytest.raises(ValueError, match=match):
        check_request(*args, total_rows=10)


def test_cursor_past_end_is_out_of_range():
    with pytest.raises(CursorOutOfRange, match="past the end"):
        check_request(0, 1, 1, 11, total_rows=10)


def test_padding_row_golden():
    row = padding_row(4, pad_id=0, row_index=17)
    assert row.input_ids.tolist() == [[0, 0, 0, 0]]
    assert row.labels.tolist() == [[IGNORE_INDEX] * 4]
    assert row.position_ids.tolist() == [[0, 1, 2, 3]]
    assert row.seq_lens.tolist() == [4] and row.sample_ids.tolist() == [PAD_SAMPLE_ID]
    assert row.segment_splits.tolist() == [0, 1] and row.row_index.tolist() == [17]
    check_rows(padding_rows(3, 5, pad_id=2), 5)


def test_fill_batch_appends_flagged_padding():
    # Stand-in real rows (only shapes and ids matter here): sample 42 in rows 6 and 8.
    real = dataclasses.replace(padding_row(4, 9, row_index=6), sample_ids=np.array([42], np.int64))
    assignment = step_rows(0, 2, 3, 0, 1, total_rows=9)  # rows [6, 8] + one padding
    two = concat_rows([real, dataclasses.replace(real, row_index=np.array([8], np.int64))])
    rows, mask = fill_batch(two, assignment, seq_len=4, pad_id=0)
    assert mask.tolist() == [False, False, True]
    assert rows.row_index.tolist() == [6, 8, 10]
    assert rows.segment_splits.tolist() == [0, 1, 2, 3]
    assert rows.sample_ids.tolist() == [42, 42, PAD_SAMPLE_ID]
    assert rows.input_ids[2].tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="real rows"):
        fill_batch(real, assignment, seq_len=4, pad_id=0)
    empty = step_rows(1, 4, 1, 0, 0, total_rows=1)  # rank 1 of 4, one row in all: padding only
    rows, mask = fill_batch(None, empty, seq_len=4, pad_id=0)
    assert mask.tolist() == [True] and rows.row_index.tolist() == [1]
