"""``pack``: sample lengths in, a ``Packing`` out. Validation and glue, no algorithm.

``pack`` checks its inputs, applies the overlong policy (``overlong.py``), runs the named
strategy (``registry.py``) on the resulting pieces and maps the pieces back to samples.
"""

from __future__ import annotations

import numpy as np

from .overlong import check_policy, resolve_overlong
from .registry import get_strategy
from .types import Packing


def pack(
    lengths, seq_len: int, *, strategy: str = "exactfit", overlong: str = "truncate", pairs=None
) -> Packing:
    """Pack samples of the given token counts into rows of ``seq_len`` slots.

    Args:
      lengths: 1-D integer array-like, one entry per sample, each >= 1.
      seq_len: tokens per row, >= 1.
      strategy: ``"exactfit"`` (whole samples, rows closed exactly where the lengths allow;
        the default for SFT), ``"bfd"`` (whole samples, plain best-fit decreasing) or
        ``"concat"`` (concatenate and cut at row ends; pretraining). See ``STRATEGIES``.
      overlong: what to do with a sample longer than ``seq_len``; every such sample is listed
        in ``Packing.truncated``, ``.split`` or ``.dropped``:

        ========  ==================================  ====================================
        policy    bfd, exactfit                       concat
        ========  ==================================  ====================================
        truncate  keep its first seq_len tokens       the same (that piece may still be cut
                                                      at a row end, like any sample)
        split     pieces of seq_len tokens (starts    the sample flows over row ends like
                  0, L, 2L, ...) and a last shorter   any other: cut only where rows end,
                  one, each packed as its own sample  each piece its own segment
        drop      left out                            left out
        ========  ==================================  ====================================

        Under concat, samples of at most seq_len tokens are cut at row ends too: that is
        what concat does, and it is not recorded (``segment_start > 0`` shows it).
      pairs: optional bool [n], True for preference pairs: each is packed whole, as one
        segment, by every strategy (concat moves one that would cross a row end to the next
        row), and an overlong one is dropped under every policy (its pair-aware truncation
        happens before packing: ``pairs.fit_pairs``).

    Returns a ``Packing``; the same inputs always give identical arrays.

    Cost: O(n) numpy plus, for bfd, a Python loop over distinct lengths and row groups:
    20-60 ms for 1M samples here, 1.4-4.2x ``np.sort`` of 1M int64. exactfit runs bfd and,
    when bfd is above the lower bound, a row search: 10-70 ms per 8k-sample window of long
    samples, up to ~1 s for 1M samples (bench/bench_packing.py).
    """
    lengths = _check_lengths(lengths)
    seq_len = _check_seq_len(seq_len)
    chosen = get_strategy(strategy)
    check_policy(overlong)

    pairs = _check_pairs(pairs, len(lengths))
    pieces = resolve_overlong(lengths, seq_len, overlong, whole_pieces=not chosen.cuts_at_row_ends, pairs=pairs)
    whole = None if pairs is None else (pairs if pieces.sample is None else pairs[pieces.sample])
    layout = chosen(pieces.length, seq_len, whole)
    segment_sample = layout.piece if pieces.sample is None else pieces.sample[layout.piece]
    segment_start = layout.offset if pieces.start is None else pieces.start[layout.piece] + layout.offset
    return Packing(
        segment_sample=segment_sample,
        segment_start=segment_start,
        segment_len=layout.length,
        row_splits=layout.row_splits,
        truncated=pieces.truncated,
        split=pieces.split,
        dropped=pieces.dropped,
    )


def _check_pairs(pairs, n: int) -> np.ndarray | None:
    if pairs is None:
        return None
    pairs = np.asarray(pairs)
    if pairs.shape != (n,) or pairs.dtype != bool:
        raise ValueError(f"pairs must be a bool mask with one entry per sample ({n}), got {pairs.dtype} {pairs.shape}")
    return pairs if pairs.any() else None


def _check_seq_len(seq_len) -> int:
    if isinstance(seq_len, (bool, np.bool_)) or not isinstance(seq_len, (int, np.integer)):
        raise ValueError(f"seq_len must be an integer, got {seq_len!r}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    return int(seq_len)


def _check_lengths(lengths) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(
            f"lengths must be a 1-D array with one token count per sample, got shape {arr.shape}"
        )
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise ValueError(
            f"lengths must be integers (token counts), got dtype {arr.dtype}; "
            "convert with np.asarray(lengths, dtype=np.int64) if the values are whole numbers"
        )
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError("lengths do not fit in int64")
    arr = arr.astype(np.int64, copy=False)
    if int(arr.min()) < 1:
        bad = int(np.flatnonzero(arr < 1)[0])
        raise ValueError(
            f"every sample must have at least 1 token: lengths[{bad}] = {int(arr[bad])}; "
            "filter out empty samples before packing"
        )
    return arr
