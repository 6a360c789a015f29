"""assemble_rows(): golden rows by eye, the row convention (check_rows) over sweeps, and exact
recovery of every sample's tokens from the rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, check_rows
from packfeed.service.packing import OVERLONG_POLICIES, STRATEGIES, assemble_rows, pack
from packfeed.service.packing.synthetic import synthetic_lengths

N = IGNORE_INDEX


def flat(samples: list[list[int]]):
    """tokens and offsets for a list of token lists."""
    offsets = np.zeros(len(samples) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in samples], out=offsets[1:])
    tokens = np.array([t for s in samples for t in s], dtype=np.int32)
    return tokens, offsets


# ---------------------------------------------------------------------------------------
# Golden cases.


def test_golden_worked_example_from_rows_convention():
    # client/rows.py: L=8, samples 7 ([5, 6, 7]) and 9 ([8, 9]), loss on every token.
    tokens, offsets = flat([[5, 6, 7], [8, 9]])
    p = pack([3, 2], 8)
    rows = assemble_rows(p, tokens, tokens.copy(), offsets, np.array([7, 9]), seq_len=8, pad_id=0)
    assert rows.input_ids.tolist() == [[5, 6, 7, 8, 9, 0, 0, 0]]
    assert rows.labels.tolist() == [[N, 6, 7, N, 9, N, N, N]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert rows.seq_lens.tolist() == [3, 2, 3]
    assert rows.sample_ids.tolist() == [7, 9, PAD_SAMPLE_ID]
    assert rows.segment_splits.tolist() == [0, 3]
    assert rows.row_index.tolist() == [0]
    check_rows(rows, 8)


def test_golden_full_row_has_no_padding_segment():
    tokens, offsets = flat([[5], [6, 7], [8, 9, 4]])
    p = pack([1, 2, 3], 4)  # bfd: [sample 2, sample 0], [sample 1]
    rows = assemble_rows(p, tokens, tokens.copy(), offsets, np.array([100, 101, 102]), seq_len=4, pad_id=0)
    assert rows.input_ids.tolist() == [[8, 9, 4, 5], [6, 7, 0, 0]]
    assert rows.labels.tolist() == [[N, 9, 4, N], [N, 7, N, N]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 0], [0, 1, 0, 1]]
    assert rows.seq_lens.tolist() == [3, 1, 2, 2]
    assert rows.sample_ids.tolist() == [102, 100, 101, PAD_SAMPLE_ID]
    assert rows.segment_splits.tolist() == [0, 2, 4]
    check_rows(rows, 4)


def test_golden_prompt_tokens_stay_masked():
    # Sample 0: prompt [1, 2], answer [3, 4]; sample 1: prompt [5], answer [6].
    tokens, offsets = flat([[1, 2, 3, 4], [5, 6]])
    labels = np.array([N, N, 3, 4, N, 6], dtype=np.int32)
    rows = assemble_rows(pack([4, 2], 8), tokens, labels, offsets, np.array([0, 1]), seq_len=8, pad_id=99)
    assert rows.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 99, 99]]
    assert rows.labels.tolist() == [[N, N, 3, 4, N, 6, N, N]]
    check_rows(rows, 8)


def test_golden_split_pieces_each_start_masked():
    tokens, offsets = flat([[10, 11, 12, 13, 14, 15, 16, 17, 18, 19]])
    p = pack([10], 4, overlong="split")  # pieces of 4, 4, 2 tokens, one row each
    rows = assemble_rows(p, tokens, tokens.copy(), offsets, np.array([5]), seq_len=4, pad_id=0)
    assert rows.input_ids.tolist() == [[10, 11, 12, 13], [14, 15, 16, 17], [18, 19, 0, 0]]
    assert rows.labels.tolist() == [[N, 11, 12, 13], [N, 15, 16, 17], [N, 19, N, N]]
    assert rows.sample_ids.tolist() == [5, 5, 5, PAD_SAMPLE_ID]
    assert rows.seq_lens.tolist() == [4, 4, 2, 2]
    check_rows(rows, 4)


def test_golden_concat_rows_are_full():
    tokens, offsets = flat([[1, 2, 3], [4, 5, 6], [7, 8]])
    p = pack([3, 3, 2], 4, strategy="concat")
    rows = assemble_rows(p, tokens, tokens.copy(), offsets, np.array([0, 1, 2]), seq_len=4, pad_id=0)
    assert rows.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert rows.labels.tolist() == [[N, 2, 3, N], [N, 6, N, 8]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 0], [0, 1, 0, 1]]
    assert rows.seq_lens.tolist() == [3, 1, 2, 2]
    assert rows.sample_ids.tolist() == [0, 1, 1, 2]
    check_rows(rows, 4)


def test_golden_row_order_and_first_row_index():
    tokens, offsets = flat([[5], [6, 7], [8, 9, 4]])
    p = pack([1, 2, 3], 4)
    rows = assemble_rows(
        p, tokens, tokens.copy(), offsets, np.array([0, 1, 2]), seq_len=4, pad_id=0,
        row_order=np.array([1, 0]), first_row_index=40,
    )
    assert rows.input_ids.tolist() == [[6, 7, 0, 0], [8, 9, 4, 5]]
    assert rows.sample_ids.tolist() == [1, PAD_SAMPLE_ID, 2, 0]
    assert rows.segment_splits.tolist() == [0, 2, 4]
    assert rows.row_index.tolist() == [40, 41]
    check_rows(rows, 4)


def test_no_rows():
    tokens, offsets = flat([])
    rows = assemble_rows(pack([], 4), tokens, tokens, offsets, np.zeros(0, np.int64), seq_len=4, pad_id=0)
    assert rows.input_ids.shape == (0, 4) and rows.segment_splits.tolist() == [0]
    check_rows(rows, 4)


@pytest.mark.parametrize(
    "change, message",
    [
        pytest.param(dict(row_order=np.array([0, 0])), "permutation", id="row-order-not-permutation"),
        pytest.param(dict(row_order=np.array([0])), "permutation", id="row-order-too-short"),
        pytest.param(dict(seq_len=2), "more than seq_len", id="packing-for-other-seq-len"),
        pytest.param(dict(sample_offsets=np.array([0, 1, 2, 3])), "past the end", id="lengths-do-not-match"),
        pytest.param(dict(labels=np.zeros(2, np.int32)), "equal length", id="labels-wrong-length"),
    ],
)
def test_assemble_rejects_inconsistent_input(change, message):
    tokens, offsets = flat([[5], [6, 7], [8, 9, 4]])
    kwargs = dict(
        packing=pack([1, 2, 3], 4), tokens=tokens, labels=tokens.copy(), sample_offsets=offsets,
        sample_ids=np.array([0, 1, 2]), seq_len=4, pad_id=0,
    )
    kwargs.update(change)
    with pytest.raises(ValueError, match=message):
        assemble_rows(**kwargs)


# ---------------------------------------------------------------------------------------
# Invariants: the row convention holds and every sample comes back exactly.


def random_samples(lengths: np.ndarray, seed: int):
    """Random tokens (>= 1, so pad_id 0 is distinguishable) and labels with a masked prompt."""
    rng = np.random.default_rng(seed)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(1, 50_000, size=int(offsets[-1]), dtype=np.int32)
    labels = tokens.copy()
    prompt = rng.integers(0, lengths)  # tokens of the prompt per sample
    in_prompt = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], lengths) < np.repeat(prompt, lengths)
    labels[in_prompt] = IGNORE_INDEX
    return tokens, labels, offsets


def assert_samples_recovered(rows, p, tokens, labels, offsets, ids, lengths, seq_len, row_order):
    """Every packed segment's tokens equal its source slice, and the slices rebuild each
    sample's kept tokens exactly (the packing's coverage is checked by check_packing)."""
    real = rows.sample_ids != PAD_SAMPLE_ID
    seg_order = np.concatenate(
        [np.arange(p.row_splits[r], p.row_splits[r + 1]) for r in row_order] + [np.zeros(0, np.int64)]
    ).astype(np.int64)
    src_sample = p.segment_sample[seg_order]
    assert np.array_equal(rows.sample_ids[real], ids[src_sample])
    assert np.array_equal(rows.seq_lens[real], p.segment_len[seg_order])

    # Every row sums to seq_len, so a segment's slot in the flattened rows is the sum of the
    # segment lengths before it.
    slots = np.concatenate([[0], np.cumsum(rows.seq_lens)])[:-1]
    flat_ids = rows.input_ids.reshape(-1)
    flat_labels = rows.labels.reshape(-1)
    rebuilt = {}
    for j, k in enumerate(np.flatnonzero(real)):
        s, start, n = int(src_sample[j]), int(p.segment_start[seg_order][j]), int(rows.seq_lens[k])
        got = flat_ids[slots[k] : slots[k] + n]
        src = slice(int(offsets[s]) + start, int(offsets[s]) + start + n)
        assert np.array_equal(got, tokens[src])
        want_labels = labels[src].copy()
        want_labels[0] = IGNORE_INDEX
        assert np.array_equal(flat_labels[slots[k] : slots[k] + n], want_labels)
        buf = rebuilt.setdefault(s, {})
        buf[start] = got
    for s, pieces in rebuilt.items():
        joined = np.concatenate([pieces[k] for k in sorted(pieces)])
        kept = min(int(lengths[s]), seq_len) if s in set(p.truncated.tolist()) else int(lengths[s])
        assert np.array_equal(joined, tokens[offsets[s] : offsets[s] + kept])
    dropped = set(p.dropped.tolist())
    assert set(rebuilt) == set(range(len(lengths))) - dropped


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("overlong", OVERLONG_POLICIES)
def test_rows_follow_convention_and_recover_samples(strategy, overlong):
    interior = 0
    for dist, seq_len in (("chat", 256), ("sft", 512), ("code", 300)):
        lengths = synthetic_lengths(dist, 400, seed=seq_len)
        tokens, labels, offsets = random_samples(lengths, seed=seq_len)
        ids = 1_000_000 + np.arange(len(lengths), dtype=np.int64)
        p = pack(lengths, seq_len, strategy=strategy, overlong=overlong)
        order = np.random.default_rng(seq_len).permutation(p.num_rows)
        rows = assemble_rows(p, tokens, labels, offsets, ids, seq_len=seq_len, pad_id=0,
                             row_order=order, first_row_index=7)
        check_rows(rows, seq_len)
        assert rows.row_index.tolist() == list(range(7, 7 + p.num_rows))
        assert_samples_recovered(rows, p, tokens, labels, offsets, ids, lengths, seq_len, order)
        interior += int((np.diff(rows.segment_splits) > 2).sum())
    assert interior > 10  # rows really held several samples


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=0, max_size=40),
    seq_len=st.integers(1, 24),
    strategy=st.sampled_from(sorted(STRATEGIES)),
    overlong=st.sampled_from(OVERLONG_POLICIES),
    shuffle=st.booleans(),
)
def test_property_rows_recover_samples(lengths, seq_len, strategy, overlong, shuffle):
    lengths = np.array(lengths, dtype=np.int64)
    tokens, labels, offsets = random_samples(lengths, seed=len(lengths))
    ids = np.arange(len(lengths), dtype=np.int64) * 3
    p = pack(lengths, seq_len, strategy=strategy, overlong=overlong)
    order = np.arange(p.num_rows)[::-1].copy() if shuffle else np.arange(p.num_rows)
    rows = assemble_rows(p, tokens, labels, offsets, ids, seq_len=seq_len, pad_id=0,
                         row_order=order if shuffle else None)
    check_rows(rows, seq_len)
    assert_samples_recovered(rows, p, tokens, labels, offsets, ids, lengths, seq_len, order)
