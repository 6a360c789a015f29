"""Overlong preference pairs under the ``truncate`` policy: cut the prompt from the left, then
both answers equally from the right, until the pair fits a row. Pure numpy, before packing.

A pair is one sample laid out as ``prompt + chosen`` then ``prompt + rejected`` (P prompt
tokens at the start of both segments, answers of C and R tokens; 2P + C + R tokens). When that
exceeds ``seq_len`` (L):

1. The prompt loses its first tokens, as many as the pair needs but never down to fewer than
   ``min(P, max_prompt_tokens)``: P' = max(min(P, M), min(P, (L - C - R) // 2)). Left, as TRL
   does, because the end of the prompt is what the answers follow.
2. If 2P' + C + R still exceeds L, both answers are cut from the right to the same cap m (an
   answer shorter than m is kept whole), the largest m with 2P' + min(C, m) + min(R, m) <= L.
   An appended EOS is cut like any answer token (as TRL's truncation does).
3. A pair where not even one token of each answer fits (L - 2P' < 2) is left as it is: the
   packer drops it and counts it (never a lone chosen or rejected segment).

Worked example, L = 10, M = 2, prompt [1, 2, 3, 4], chosen [5, 6, 7], rejected [8, 9]
(14 tokens): P' = max(2, (10 - 5) // 2) = 2, prompt [3, 4]; 2*2 + 3 + 2 = 9 <= 10, so the
answers stay: chosen segment [3, 4, 5, 6, 7], rejected segment [3, 4, 8, 9].

Cost: O(n) numpy plus one gather of the kept tokens when any pair is cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packfeed.client.offsets import concat_ranges, offsets_of

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class FittedPairs:
    """The samples after truncation (same order, same count) and which pairs were cut."""

    tokens: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray  # int64 [n + 1]
    chosen_lens: np.ndarray  # int64 [n]: tokens of each pair's chosen segment, 0 for other samples
    prompt_lens: np.ndarray  # int64 [n]: prompt tokens at the start of both segments
    truncated: np.ndarray  # int64, ascending: the pairs that were cut


def fit_pairs(
    tokens: np.ndarray,
    labels: np.ndarray,
    offsets: np.ndarray,
    chosen_lens: np.ndarray,
    prompt_lens: np.ndarray,
    *,
    seq_len: int,
    max_prompt_tokens: int,
) -> FittedPairs:
    """Truncate every overlong pair (``chosen_lens > 0``) as the module docstring says; other
    samples are untouched. Returns the inputs themselves when no pair is cut."""
    offsets = np.asarray(offsets, dtype=np.int64)
    chosen_lens = np.asarray(chosen_lens, dtype=np.int64)
    prompt_lens = np.asarray(prompt_lens, dtype=np.int64)
    lengths = np.diff(offsets)
    answer_c = chosen_lens - prompt_lens
    answer_r = lengths - chosen_lens - prompt_lens
    keep_p = np.maximum(np.minimum(prompt_lens, max_prompt_tokens),
                        np.clip((seq_len - answer_c - answer_r) // 2, 0, prompt_lens))
    budget = seq_len - 2 * keep_p  # tokens left for the two answers
    cap = _equal_cap(answer_c, answer_r, budget)
    cut = (chosen_lens > 0) & (lengths > seq_len) & (budget >= 2)
    if not cut.any():
        return FittedPairs(tokens, labels, offsets, chosen_lens, prompt_lens, _EMPTY)

    keep_p = np.where(cut, keep_p, prompt_lens)
    keep_c = np.where(cut, np.minimum(answer_c, cap), answer_c)
    keep_r = np.where(cut, np.minimum(answer_r, cap), answer_r)
    drop_p = prompt_lens - keep_p
    # Two ranges per sample: the chosen segment's kept tokens, then the rejected one's; a sample
    # that is no pair is its first range, whole, and an empty second one.
    pair = chosen_lens > 0
    first_start = offsets[:-1] + np.where(pair, drop_p, 0)
    first_len = np.where(pair, keep_p + keep_c, lengths)
    second_start = offsets[:-1] + chosen_lens + drop_p
    second_len = np.where(pair, keep_p + keep_r, 0)
    starts = np.stack([first_start, second_start], axis=1).reshape(-1)
    lens = np.stack([first_len, second_len], axis=1).reshape(-1)
    index = concat_ranges(starts, lens)
    new_lengths = first_len + second_len
    return FittedPairs(
        tokens=np.asarray(tokens)[index],
        labels=np.asarray(labels)[index],
        offsets=offsets_of(new_lengths),
        chosen_lens=np.where(pair, keep_p + keep_c, 0),
        prompt_lens=np.where(pair, keep_p, prompt_lens),
        truncated=np.flatnonzero(cut),
    )


def _equal_cap(a: np.ndarray, b: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """The largest m with min(a, m) + min(b, m) <= budget: when the shorter answer fits in half
    the budget it stays whole and the longer gets the rest, else both get half."""
    short = np.minimum(a, b)
    half = budget // 2
    return np.where(short <= half, budget - short, half)
