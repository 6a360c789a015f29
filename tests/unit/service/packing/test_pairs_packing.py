"""Preference pairs in the packer: a pair is one item, never cut, written as two adjacent
segments (chosen first) in one row; overlong pairs truncated (prompt from the left, answers
equally) or dropped, never split. Goldens by eye, then sweeps over every strategy and policy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, PAIR_CHOSEN, PAIR_REJECTED, check_rows
from packfeed.service.packing import OVERLONG_POLICIES, STRATEGIES, assemble_rows, check_packing, pack
from packfeed.service.packing.truncate_pairs import fit_pairs

N = IGNORE_INDEX


def flat(samples: list[list[int]]):
    offsets = np.zeros(len(samples) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in samples], out=offsets[1:])
    return np.array([t for s in samples for t in s], dtype=np.int32), offsets


def test_golden_pair_written_as_two_adjacent_segments():
    # sample 0 = [9, 9]; pair 1 = prompt [5, 6] + chosen [7] then prompt [5, 6] + rejected [8, 4]
    tokens, offsets = flat([[9, 9], [5, 6, 7, 5, 6, 8, 4]])
    labels = np.array([9, 9, N, N, 7, N, N, 8, 4], np.int32)
    pairs = np.array([False, True])
    p = pack(np.diff(offsets), 10, strategy="bfd", pairs=pairs)
    rows = assemble_rows(p, tokens, labels, offsets, np.array([40, 41]), seq_len=10, pad_id=0,
                         pair_chosen_lens=np.array([0, 3]))
    check_rows(rows, 10)
    assert rows.input_ids.tolist() == [[5, 6, 7, 5, 6, 8, 4, 9, 9, 0]]
    assert rows.labels.tolist() == [[N, N, 7, N, N, 8, 4, N, 9, N]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 1, 0]]
    assert rows.seq_lens.tolist() == [3, 4, 2, 1]
    assert rows.sample_ids.tolist() == [41, 41, 40, -1]
    assert rows.pair_roles.tolist() == [1, 0, -1, -1]


def test_golden_concat_moves_a_pair_to_the_next_row():
    # lengths [3, 2 (pair), 1], L = 4: the pair would cross the row end, so row 0 ends in padding
    p = pack([3, 2, 1], 4, strategy="concat", pairs=np.array([False, True, False]))
    assert p.segment_sample.tolist() == [0, 1, 2] and p.row_splits.tolist() == [0, 1, 3]
    check_packing(p, [3, 2, 1], 4, strategy="concat", pairs=np.array([False, True, False]))
    plain = pack([3, 2, 1], 4, strategy="concat")  # without the mark it is cut, as concat does
    assert plain.segment_sample.tolist() == [0, 1, 1, 2]


@pytest.mark.parametrize("overlong", OVERLONG_POLICIES)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_overlong_pair_is_dropped_by_pack_under_every_policy(strategy, overlong):
    lengths = np.array([3, 9, 9, 2])
    pairs = np.array([False, True, False, True])
    p = pack(lengths, 4, strategy=strategy, overlong=overlong, pairs=pairs)
    check_packing(p, lengths, 4, strategy=strategy, overlong=overlong, pairs=pairs)
    assert 1 in p.dropped.tolist() and 1 not in p.segment_sample.tolist()
    assert (2 in p.dropped.tolist()) == (overlong == "drop")  # the plain sample follows the policy


# ---- fit_pairs ---------------------------------------------------------------------------------
def pair_sample(prompt: list[int], chosen: list[int], rejected: list[int]):
    tokens = prompt + chosen + prompt + rejected
    labels = [N] * len(prompt) + chosen + [N] * len(prompt) + rejected
    return tokens, labels, len(prompt) + len(chosen), len(prompt)


FIT = [
    pytest.param([1, 2, 3, 4], [5, 6, 7], [8, 9], 10, 2, [3, 4, 5, 6, 7], [3, 4, 8, 9], id="prompt-cut-answers-fit"),
    pytest.param([1, 2], [5, 6, 7, 7, 7], [8, 9, 9, 9], 10, 2, [1, 2, 5, 6, 7], [1, 2, 8, 9, 9], id="answers-equal-cap"),
    pytest.param([1, 2], [5, 6, 7, 7, 7, 7], [8], 10, 2, [1, 2, 5, 6, 7, 7, 7], [1, 2, 8], id="short-answer-kept-whole"),
    pytest.param([1, 2, 3, 4, 5, 6], [7], [8], 10, 1, [3, 4, 5, 6, 7], [3, 4, 5, 6, 8], id="prompt-cut-only-as-needed"),
    pytest.param([1, 2, 3, 4, 5, 6], [7] * 4, [8, 8], 10, 1, [5, 6, 7, 7, 7, 7], [5, 6, 8, 8], id="prompt-fits-answers"),
    pytest.param([1, 2, 3, 4, 5, 6], [7] * 5, [8] * 5, 10, 1, [6, 7, 7, 7, 7], [6, 8, 8, 8, 8], id="prompt-to-its-floor"),
]


@pytest.mark.parametrize("prompt, chosen, rejected, seq_len, floor, want_chosen, want_rejected", FIT)
def test_golden_fit_pairs(prompt, chosen, rejected, seq_len, floor, want_chosen, want_rejected):
    tokens, labels, c, pl = pair_sample(prompt, chosen, rejected)
    plain = [40, 41]
    offsets = np.array([0, 2, 2 + len(tokens)])
    fitted = fit_pairs(np.array(plain + tokens, np.int32), np.array(plain + labels, np.int32), offsets,
                       np.array([0, c]), np.array([0, pl]), seq_len=seq_len, max_prompt_tokens=floor)
    assert fitted.truncated.tolist() == [1]
    got = fitted.tokens[2:].tolist()
    cut = int(fitted.chosen_lens[1])
    assert got[:cut] == want_chosen and got[cut:] == want_rejected
    assert fitted.tokens[:2].tolist() == plain and fitted.chosen_lens[0] == 0
    kept_p = int(fitted.prompt_lens[1])
    assert kept_p == len(want_chosen) - len([t for t in want_chosen if t in chosen])
    labels_out = fitted.labels[2:].tolist()
    assert labels_out[:kept_p] == [N] * kept_p and labels_out[kept_p:cut] == want_chosen[kept_p:]


def test_fit_pairs_leaves_pairs_that_fit_or_cannot_fit():
    fits = pair_sample([1], [2], [3])
    hopeless = pair_sample([1, 2, 3, 4], [5], [6])  # floor 4 keeps 8 prompt tokens of a 9-token row
    tokens = np.array(fits[0] + hopeless[0], np.int32)
    labels = np.array(fits[1] + hopeless[1], np.int32)
    offsets = np.array([0, 4, 14])
    out = fit_pairs(tokens, labels, offsets, np.array([2, 5]), np.array([1, 4]), seq_len=9, max_prompt_tokens=4)
    assert out.truncated.tolist() == [] and out.tokens is tokens
    p = pack(np.diff(out.offsets), 9, pairs=np.array([True, True]))
    assert p.dropped.tolist() == [1]  # then dropped by the packer, never cut into a lone segment


# ---- sweeps ------------------------------------------------------------------------------------
def random_pairs(rng, n: int, max_len: int, share: float):
    """n samples, about ``share`` of them pairs; tokens >= 1, prompts masked."""
    samples, labels, chosen, prompt = [], [], [], []
    for _ in range(n):
        if rng.random() < share:
            p, c, r = (int(x) for x in rng.integers([0, 1, 1], [max_len // 2, max_len, max_len]))
            toks, labs, cl, pl = pair_sample(*(rng.integers(1, 1000, k).tolist() for k in (p, c, r)))
            if p:  # a shared prompt: the same tokens in both segments
                toks[cl:cl + p] = toks[:p]
            samples.append(toks), labels.append(labs), chosen.append(cl), prompt.append(pl)
        else:
            k = int(rng.integers(1, max_len))
            samples.append(rng.integers(1, 1000, k).tolist()), labels.append(samples[-1]), chosen.append(0)
            prompt.append(0)
    tokens, offsets = flat(samples)
    return tokens, np.array([t for s in labels for t in s], np.int32), offsets, np.array(chosen), np.array(prompt)


def assert_pairs_whole_and_adjacent(rows, offsets, tokens, chosen_lens, ids):
    """Every pair's two segments: in one row, adjacent, chosen then rejected, each its own tokens."""
    slots = np.concatenate([[0], np.cumsum(rows.seq_lens)])[:-1]
    flat_ids = rows.input_ids.reshape(-1)
    seen = 0
    for r in range(rows.num_rows):
        roles, sids = rows.row_pair_roles(r), rows.row_sample_ids(r)
        base = rows.segment_splits[r]
        for j in np.flatnonzero(roles == PAIR_CHOSEN):
            assert roles[j + 1] == PAIR_REJECTED and sids[j] == sids[j + 1]
            s = int(np.flatnonzero(ids == sids[j])[0])
            k = base + j
            whole = flat_ids[slots[k]: slots[k] + rows.seq_lens[k] + rows.seq_lens[k + 1]]
            assert rows.seq_lens[k] == chosen_lens[s]
            assert whole.tolist() == tokens[offsets[s]:offsets[s + 1]].tolist()
            seen += 1
    assert (rows.pair_roles[rows.sample_ids == PAD_SAMPLE_ID] == -1).all()
    return seen


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("overlong", OVERLONG_POLICIES)
def test_sweep_pairs_never_split(strategy, overlong):
    seen = dropped = truncated = moved = 0
    for seed, seq_len in enumerate((16, 40, 64, 128)):
        rng = np.random.default_rng(seed)
        tokens, labels, offsets, chosen, prompt = random_pairs(rng, 120, seq_len // 2 + 4, share=0.5)
        if overlong == "truncate":
            fitted = fit_pairs(tokens, labels, offsets, chosen, prompt, seq_len=seq_len, max_prompt_tokens=seq_len // 4)
            tokens, labels, offsets, chosen = fitted.tokens, fitted.labels, fitted.offsets, fitted.chosen_lens
            truncated += len(fitted.truncated)
        lengths, pairs = np.diff(offsets), chosen > 0
        p = pack(lengths, seq_len, strategy=strategy, overlong=overlong, pairs=pairs)
        check_packing(p, lengths, seq_len, strategy=strategy, overlong=overlong, pairs=pairs)
        ids = 1000 + np.arange(len(lengths))
        rows = assemble_rows(p, tokens, labels, offsets, ids, seq_len=seq_len, pad_id=0,
                             row_order=rng.permutation(p.num_rows), pair_chosen_lens=chosen)
        check_rows(rows, seq_len)
        kept_pairs = int(pairs.sum()) - int(pairs[p.dropped].sum())
        assert assert_pairs_whole_and_adjacent(rows, offsets, tokens, chosen, ids) == kept_pairs
        seen += kept_pairs
        dropped += int(pairs[p.dropped].sum())
        moved += int((p.row_tokens()[:-1] < seq_len).sum())  # concat rows a pair left early
    # pairs were packed; some were too long: cut under truncate (a quarter-row floor always fits), else dropped
    assert seen > 100 and (dropped > 0) == (overlong != "truncate")
    assert (truncated > 0) == (overlong == "truncate")
    assert strategy != "concat" or moved > 10


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    prompt=st.integers(0, 30), answer_c=st.integers(1, 30), answer_r=st.integers(1, 30),
    seq_len=st.integers(2, 64), floor=st.integers(0, 40),
)
def test_property_fit_pairs(prompt, answer_c, answer_r, seq_len, floor):
    toks, labs, cl, pl = pair_sample(list(range(100, 100 + prompt)), [1] * answer_c, [2] * answer_r)
    offsets = np.array([0, len(toks)])
    out = fit_pairs(np.array(toks, np.int32), np.array(labs, np.int32), offsets, np.array([cl]), np.array([pl]),
                    seq_len=seq_len, max_prompt_tokens=floor)
    n = int(out.offsets[-1])
    if len(toks) <= seq_len:
        assert out.truncated.tolist() == [] and n == len(toks)
        return
    kept_p, cut = int(out.prompt_lens[0]), int(out.chosen_lens[0])
    if not len(out.truncated):  # could not fit: left for the packer to drop
        assert 2 * min(prompt, floor) + 2 > seq_len
        return
    assert n <= seq_len and kept_p >= min(prompt, floor)
    chosen, rejected = out.tokens[:cut].tolist(), out.tokens[cut:].tolist()
    assert chosen[:kept_p] == rejected[:kept_p] == list(range(100 + prompt - kept_p, 100 + prompt))  # its end
    c, r = len(chosen) - kept_p, len(rejected) - kept_p
    assert c >= 1 and r >= 1
    cap = max(c, r)
    assert c == min(answer_c, cap) and r == min(answer_r, cap)  # both cut to one cap
    # maximal: one more prompt token (while above the floor would be needed) or a larger cap would not fit
    assert 2 * kept_p + min(answer_c, cap + 1) + min(answer_r, cap + 1) > seq_len or (c, r) == (answer_c, answer_r)
