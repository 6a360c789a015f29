"""Per-segment log-probabilities from packed logits, and the pairs among the segments."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packfeed.client.offsets import offsets_of  # noqa: E402
from packfeed.client.pair_logps import pair_logps, pair_segments, segment_logps  # noqa: E402
from packfeed.client.rows import IGNORE_INDEX  # noqa: E402

X = IGNORE_INDEX


def test_golden_uniform_logits_give_minus_log_vocab_per_trained_label():
    # One row, L=6: a pair (prompt [5], chosen [7, 8]; prompt [5], rejected [9, 4]) as in the docstring.
    labels = torch.tensor([[X, 7, 8, X, 9, 4]])
    logits = torch.zeros(1, 6, 10)
    sums, counts = segment_logps(logits, labels, torch.tensor([0, 3, 6]))
    assert counts.tolist() == [2, 2]
    torch.testing.assert_close(sums, torch.full((2,), -2 * math.log(10)))


def test_golden_the_last_token_of_a_segment_predicts_nothing_across_the_boundary():
    # Logits at t=2 (the chosen side's last token) put all mass on 3; labels[3] is the next
    # segment's first token, masked: nothing of it reaches either sum.
    labels = torch.tensor([[X, 1, 2, X, 1, 2]])
    logits = torch.full((1, 6, 4), -30.0)
    logits[0, [0, 1, 3, 4], [1, 2, 1, 2]] = 30.0  # every trained label predicted with certainty
    logits[0, 2, 3] = 30.0
    sums, counts = segment_logps(logits, labels, torch.tensor([0, 3, 6]))
    assert counts.tolist() == [2, 2] and sums.abs().max() < 1e-6


def loop_logps(logits: np.ndarray, labels: np.ndarray, seq_lens: list[list[int]]) -> tuple[list, list]:
    """The sums the slow way: a segment at a time, a token at a time."""
    sums, counts = [], []
    for r, lens in enumerate(seq_lens):
        for start, end in zip(offsets_of(lens)[:-1], offsets_of(lens)[1:]):
            total, n = 0.0, 0
            for t in range(start + 1, end):
                if labels[r, t] != IGNORE_INDEX:
                    row = logits[r, t - 1].astype(np.float64)
                    total += row[labels[r, t]] - (np.log(np.exp(row - row.max()).sum()) + row.max())
                    n += 1
            sums.append(total)
            counts.append(n)
    return sums, counts


@pytest.mark.parametrize("seed", range(6))
def test_segment_logps_equal_a_loop_over_segments(seed):
    rng = np.random.default_rng(seed)
    num_rows, seq_len, vocab = int(rng.integers(1, 4)), int(rng.integers(3, 24)), 11
    seq_lens = []
    for _ in range(num_rows):  # at least one boundary inside every row; segments of 1 token too
        cuts = np.sort(rng.choice(np.arange(1, seq_len), size=int(rng.integers(1, seq_len - 1)), replace=False))
        seq_lens.append(np.diff(np.concatenate([[0], cuts, [seq_len]])).tolist())
    labels = rng.integers(0, vocab, size=(num_rows, seq_len))
    labels[rng.random(labels.shape) < 0.3] = IGNORE_INDEX
    for r, lens in enumerate(seq_lens):
        labels[r, offsets_of(lens)[:-1]] = IGNORE_INDEX  # the row convention
    logits = rng.normal(size=(num_rows, seq_len, vocab)).astype(np.float32) * 3
    cu = offsets_of([n for lens in seq_lens for n in lens])
    sums, counts = segment_logps(torch.from_numpy(logits), torch.from_numpy(labels), torch.from_numpy(cu))
    want_sums, want_counts = loop_logps(logits, labels, seq_lens)
    assert counts.tolist() == want_counts
    np.testing.assert_allclose(sums.numpy(), want_sums, atol=1e-4)


def test_gradients_reach_only_the_logits_that_predict_a_trained_label():
    labels = torch.tensor([[X, 7, X, X, 9, 4]])
    logits = torch.randn(1, 6, 10, requires_grad=True)
    sums, _ = segment_logps(logits, labels, torch.tensor([0, 2, 6]))
    sums.sum().backward()
    assert (logits.grad[0].abs().sum(-1) > 0).tolist() == [True, False, False, True, True, False]


def test_segment_logps_refuses_what_breaks_the_row_convention():
    with pytest.raises(ValueError, match="cu_seq_lens must run from 0 to B\\*L = 6"):
        segment_logps(torch.zeros(1, 6, 3), torch.zeros(1, 6, dtype=torch.long), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="labels must be"):
        segment_logps(torch.zeros(1, 6, 3), torch.zeros(1, 5, dtype=torch.long), torch.tensor([0, 6]))
    with pytest.raises(ValueError, match="the first label of every segment must be -100"):
        segment_logps(torch.zeros(1, 6, 3), torch.tensor([[X, 1, 2, 1, 1, 2]]), torch.tensor([0, 3, 6]))


@pytest.mark.parametrize("roles, sample_ids, splits, chosen, rejected", [
    pytest.param([1, 0, -1, 1, 0], [4, 4, 9, 5, 5], None, [0, 3], [1, 4], id="two-pairs-and-a-plain-sample"),
    pytest.param([-1, -1], [3, -1], None, [], [], id="no-pairs"),
    pytest.param([1, 0, -1, 1, 0, -1], [4, 4, -1, 5, 5, -1], [0, 3, 6], [0, 3], [1, 4], id="two-rows"),
])
def test_pair_segments(roles, sample_ids, splits, chosen, rejected):
    got = pair_segments(np.array(roles, np.int8), np.array(sample_ids), None if splits is None else np.array(splits))
    assert [g.tolist() for g in got] == [chosen, rejected]


@pytest.mark.parametrize("roles, sample_ids, splits, match", [
    pytest.param([1, -1, 0], [4, 9, 4], None, "followed at once", id="sides-not-adjacent"),
    pytest.param([0, 1], [4, 4], None, "followed at once", id="rejected-first"),
    pytest.param([1, -1], [4, 9], None, "followed at once", id="lone-chosen"),
    pytest.param([1, 0], [4, 5], None, "same \\(real\\) sample id", id="two-samples"),
    pytest.param([1, 0], [4, 4], [0, 1, 2], "same row", id="across-rows"),
])
def test_pair_segments_refuses_what_is_not_a_pair(roles, sample_ids, splits, match):
    with pytest.raises(ValueError, match=match):
        pair_segments(np.array(roles, np.int8), np.array(sample_ids), None if splits is None else np.array(splits))


def test_pair_logps_gathers_each_side():
    sums, counts = torch.tensor([-1.0, -2.0, -3.0, -4.0, -5.0]), torch.tensor([1, 2, 3, 4, 5])
    got = pair_logps(sums, counts, np.array([0, 3]), np.array([1, 4]))
    assert got["chosen_logps"].tolist() == [-1.0, -4.0] and got["rejected_logps"].tolist() == [-2.0, -5.0]
    assert got["chosen_tokens"].tolist() == [1, 4] and got["rejected_tokens"].tolist() == [2, 5]
