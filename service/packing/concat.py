"""Concatenate-with-boundaries (pretraining): every row exactly full except the last.

Pieces are laid end to end in input order as one token stream and the stream is cut every
``seq_len`` tokens. A piece crossing a cut becomes two (or more) segments, each restarting
its positions at 0. Worked example, seq_len 4, pieces of lengths [3, 3, 1]::

    stream     a a a | b b b | c          cut every 4 tokens
    row 0      a a a b        segments (piece 0, offset 0, len 3), (piece 1, offset 0, len 1)
    row 1      b b c          segments (piece 1, offset 1, len 2), (piece 2, offset 0, len 1)

Pieces marked ``whole`` (preference pairs, at most seq_len each) are never cut: one that
would cross a row end starts the next row instead, and the row it left ends in padding. With
pieces [3, 2 whole, 1] and seq_len 4: row 0 ``a a a _``, row 1 ``b b c _``.

Efficiency is 100% except for the last row (and rows a whole piece left early). Overlong samples need no special case: under
the ``split`` policy a sample longer than a row simply spans several rows (see api.pack).
Cost: O(pieces + segments), vectorised, plus a Python step per whole piece (~1 us each).
"""

from __future__ import annotations

import numpy as np

from packfeed.client.offsets import concat_ranges, offsets_of, starts_of

from .types import Layout


def pack_concat(lengths: np.ndarray, seq_len: int, whole: np.ndarray | None = None) -> Layout:
    """Cut the concatenation of pieces (int64 lengths >= 1, any size) into rows of seq_len;
    ``whole`` (bool [n], optional): pieces never cut, each at most seq_len."""
    n = len(lengths)
    if n == 0:
        return Layout.empty()
    starts = starts_of(lengths)
    if whole is not None and whole.any():
        starts = _move_whole_pieces(starts, lengths, seq_len, np.flatnonzero(whole))
    ends = starts + lengths
    num_rows = int(-(-int(ends[-1]) // seq_len))
    first_row = starts // seq_len
    num_segments = (ends - 1) // seq_len - first_row + 1  # rows each piece touches

    piece = np.repeat(np.arange(n, dtype=np.int64), num_segments)
    row = concat_ranges(first_row, num_segments)  # the rows each piece's segments fall in
    piece_start = starts[piece]
    seg_start = np.maximum(piece_start, row * seq_len)  # stream position of the segment
    seg_end = np.minimum(ends[piece], (row + 1) * seq_len)

    row_splits = offsets_of(np.bincount(row, minlength=num_rows))
    return Layout(piece, seg_start - piece_start, seg_end - seg_start, row_splits)


def _move_whole_pieces(starts: np.ndarray, lengths: np.ndarray, seq_len: int, whole: np.ndarray) -> np.ndarray:
    """Stream starts with every whole piece that would cross a row end moved to the next row:
    the gap it leaves shifts every later piece. Pieces [3, 2], L=4, piece 1 whole: starts
    [0, 3] -> [0, 4]."""
    if (lengths[whole] > seq_len).any():
        raise ValueError(f"a piece that must stay whole is longer than seq_len={seq_len}")
    gaps = np.zeros(len(starts), dtype=np.int64)
    shift = 0
    for i, start, length in zip(whole.tolist(), starts[whole].tolist(), lengths[whole].tolist()):
        at = start + shift
        if at // seq_len != (at + length - 1) // seq_len:
            gap = seq_len - at % seq_len
            gaps[i] = gap
            shift += gap
    return starts + np.cumsum(gaps)
