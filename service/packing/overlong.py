"""What happens to samples longer than a row: truncate, split or drop, never silently.

``resolve_overlong`` turns sample lengths into the list of *pieces* a strategy packs and
records which samples the policy touched. Samples of at most ``seq_len`` tokens are always
one whole piece.

=========  ==============================================================================
policy     a sample of length n > L becomes
=========  ==============================================================================
truncate   one piece: its first L tokens (recorded in ``truncated``)
split      pieces of L tokens each and a last shorter one: starts 0, L, 2L, ...
           (recorded in ``split``); with ``whole_pieces=False`` (strategies that cut at row
           ends themselves, like concat) it stays one piece of n tokens
drop       nothing (recorded in ``dropped``)
=========  ==============================================================================

A preference pair (``pairs``) is never cut: an overlong pair is dropped under every policy
(recorded in ``dropped``). Truncating a pair means cutting its prompt from the left and its
answers from the right, token work done before packing (``pairs.fit_pairs``), so a pair that
still reaches here longer than L did not fit even so.

Worked example, L = 4, lengths [2, 9, 4], policy split: pieces (sample, start, length) are
(0, 0, 2), (1, 0, 4), (1, 4, 4), (1, 8, 1), (2, 0, 4); ``split == [1]``.

Cost: O(n) vectorised; when no sample is overlong it allocates nothing but the mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packfeed.client.offsets import concat_ranges

OVERLONG_POLICIES = ("truncate", "split", "drop")

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Pieces:
    """The units a strategy packs: piece i is tokens ``start[i]:start[i]+length[i]`` of
    sample ``sample[i]``. Pieces of one sample are consecutive and in token order.

    ``sample`` is None when piece i is sample i, ``start`` None when every piece starts at
    token 0: the common case allocates nothing and callers skip the index mapping.
    """

    sample: np.ndarray | None
    start: np.ndarray | None
    length: np.ndarray
    truncated: np.ndarray
    split: np.ndarray
    dropped: np.ndarray


def check_policy(policy: str) -> None:
    if policy not in OVERLONG_POLICIES:
        raise ValueError(
            f"unknown overlong policy {policy!r}: use one of {', '.join(OVERLONG_POLICIES)}"
        )


def resolve_overlong(
    lengths: np.ndarray, seq_len: int, policy: str, *, whole_pieces: bool = True, pairs: np.ndarray | None = None
) -> Pieces:
    """Pieces to pack for ``lengths`` (int64, all >= 1) under ``policy``.

    ``whole_pieces=False`` keeps an overlong sample as one piece under ``split`` (for
    strategies that cut pieces at row ends themselves); it changes nothing for the other
    policies. ``pairs``: optional bool [n], the preference pairs; an overlong one is dropped.
    """
    check_policy(policy)
    over = np.flatnonzero(lengths > seq_len)
    if len(over) == 0:
        return Pieces(None, None, lengths, _EMPTY, _EMPTY, _EMPTY)
    if pairs is not None and pairs[over].any():
        return _drop_overlong_pairs(lengths, seq_len, policy, whole_pieces, pairs, over)
    if policy == "truncate":
        return Pieces(None, None, np.minimum(lengths, seq_len), over, _EMPTY, _EMPTY)
    if policy == "drop":
        keep = np.flatnonzero(lengths <= seq_len)
        return Pieces(keep, None, lengths[keep], _EMPTY, _EMPTY, over)
    if not whole_pieces:
        return Pieces(None, None, lengths, _EMPTY, over, _EMPTY)

    # split: sample of length 9 with L = 4 -> 3 pieces, starts [0, 4, 8], lengths [4, 4, 1].
    num_pieces = (lengths + seq_len - 1) // seq_len
    sample = np.repeat(np.arange(len(lengths), dtype=np.int64), num_pieces)
    start = concat_ranges(np.zeros(len(lengths), dtype=np.int64), num_pieces) * seq_len
    length = np.minimum(lengths[sample] - start, seq_len)
    return Pieces(sample, start, length, _EMPTY, over, _EMPTY)


def _drop_overlong_pairs(lengths, seq_len, policy, whole_pieces, pairs, over) -> Pieces:
    """The other samples under ``policy``; the overlong pairs left out and listed as dropped."""
    bad = over[pairs[over]]
    keep = np.ones(len(lengths), dtype=bool)
    keep[bad] = False
    kept = np.flatnonzero(keep)
    rest = resolve_overlong(lengths[kept], seq_len, policy, whole_pieces=whole_pieces)
    sample = kept if rest.sample is None else kept[rest.sample]
    return Pieces(sample, rest.start, rest.length, kept[rest.truncated], kept[rest.split],
                  np.union1d(kept[rest.dropped], bad))
