"""The cost model of a packed row (client/cost.py): golden figures a reader checks by eye, the
worked example of the docstring, and the invariants: the padding tail costs as a segment of
its own, a row's cost grows with how its tokens are split into documents, and the balance of
perfectly even ranks is 1."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packfeed.client.cost import (
    DEFAULT_RATIO,
    attention_ratio,
    attention_work,
    balance_of,
    micro_batch_cost,
    row_costs,
    step_balance,
)
from packfeed.client.rows import PackedRows, padding_rows


def rows(*segments: list[int]) -> PackedRows:
    """Rows of the given segment lengths (each summing to the same L); tokens are zeros."""
    seq_len = sum(segments[0])
    lens = np.array([x for row in segments for x in row], dtype=np.int32)
    positions = np.stack([np.concatenate([np.arange(x) for x in row]) for row in segments]).astype(np.int32)
    zeros = np.zeros((len(segments), seq_len), np.int32)
    return PackedRows(input_ids=zeros, labels=zeros, position_ids=positions, seq_lens=lens,
                      sample_ids=np.arange(len(lens), dtype=np.int64),
                      segment_splits=np.concatenate([[0], np.cumsum([len(r) for r in segments])]).astype(np.int64),
                      row_index=np.arange(len(segments), dtype=np.int64))


def test_golden_work_and_cost():
    r = rows([3, 1], [4])
    assert attention_work(r).tolist() == [10.0, 16.0]
    assert row_costs(r, ratio=0.5).tolist() == [4 + 5.0, 4 + 8.0]


def test_the_docstring_worked_example():
    ratio = attention_ratio(28, 3584, 7.6e9)
    assert ratio == pytest.approx(1.32e-5, rel=1e-3) and DEFAULT_RATIO == ratio
    one, split = row_costs(rows([65536], [4096] * 16), ratio)
    assert one == pytest.approx(122_248, abs=1) and split == pytest.approx(69_080, abs=1)
    assert one / split == pytest.approx(1.77, abs=0.01)


def test_a_padding_row_is_one_segment_of_the_whole_row():
    pad = padding_rows(2, 8, 0, [10, 11])
    assert attention_work(pad).tolist() == [64.0, 64.0]
    assert row_costs(pad, 1.0).tolist() == [72.0, 72.0]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=12), st.floats(1e-6, 1.0))
def test_splitting_a_segment_never_costs_more(lengths, ratio):
    whole = sum(lengths)
    split, joined = row_costs(rows(lengths, [whole]), ratio)
    assert split <= joined and (split < joined) == (len(lengths) > 1)


def test_balance_golden():
    assert balance_of([[4, 1], [2, 1]]) == pytest.approx(1.25)  # (4 + 1) / (3 + 1)
    assert balance_of([3, 3, 3]) == 1.0
    assert balance_of([[0.0], [0.0]]) == 1.0


def test_step_balance_of_rows_per_rank():
    heavy, light = rows([8]), rows([4, 4])  # work 64 and 32; ratio 1: costs 72 and 40
    assert micro_batch_cost(heavy, 1.0) == 72.0
    assert step_balance([[heavy], [light]], 1.0) == pytest.approx(72 / 56)
    assert step_balance([[heavy, light], [light, heavy]], 1.0) == pytest.approx((72 + 72) / (56 + 56))


@pytest.mark.parametrize("shape", [(0, 10, 1e9), (2, 0, 1e9), (2, 10, 0)])
def test_a_bad_model_shape_is_refused(shape):
    with pytest.raises(ValueError, match="a model shape needs"):
        attention_ratio(*shape)
