"""The result of packing: which piece of which sample lands in which row.

``Packing`` is what every strategy returns through :func:`packfeed.service.packing.pack`.
It holds no tokens, only indices into the caller's ``lengths``; ``assemble_rows`` turns it
into token rows. ``Layout`` is the smaller, strategy-level form (indices into the list of
pieces a strategy was given), which ``pack`` maps back to samples.

Worked example, samples of lengths [1, 2, 3] and seq_len 4; bfd puts samples 2 and 0 in
row 0 (3 + 1 tokens) and sample 1 in row 1::

    segment_sample = [2, 0, 1]
    segment_start  = [0, 0, 0]      # nothing was cut
    segment_len    = [3, 1, 2]
    row_splits     = [0, 2, 3]      # row r holds segments row_splits[r]:row_splits[r+1]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packfeed.client.offsets import run_sums

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Layout:
    """Rows of pieces, as a strategy computes them (indices into the pieces it was given).

    Segment ``j`` covers tokens ``offset[j] : offset[j] + length[j]`` of piece ``piece[j]``;
    row ``r`` holds segments ``row_splits[r] : row_splits[r + 1]``. All arrays int64.
    """

    piece: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    row_splits: np.ndarray

    @classmethod
    def empty(cls) -> "Layout":
        return cls(_EMPTY, _EMPTY, _EMPTY, np.zeros(1, dtype=np.int64))


@dataclass(frozen=True)
class Packing:
    """Where every kept token goes. All arrays are int64.

    Segment ``j`` is tokens ``segment_start[j] : segment_start[j] + segment_len[j]`` of
    sample ``segment_sample[j]`` (an index into the ``lengths`` given to ``pack``). Row ``r``
    holds segments ``row_splits[r] : row_splits[r + 1]`` back to back, in that order.

    ``truncated``, ``split`` and ``dropped`` list (ascending) the samples longer than
    ``seq_len`` and what the overlong policy did to them (an overlong preference pair is always
    in ``dropped``); nothing else is ever cut or left out, except that the ``concat`` strategy
    cuts any sample but a pair at row ends by design.
    """

    segment_sample: np.ndarray
    segment_start: np.ndarray
    segment_len: np.ndarray
    row_splits: np.ndarray
    truncated: np.ndarray
    split: np.ndarray
    dropped: np.ndarray

    @property
    def num_rows(self) -> int:
        return int(len(self.row_splits) - 1)

    @property
    def num_segments(self) -> int:
        return int(len(self.segment_len))

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens in all rows."""
        return int(self.segment_len.sum())

    def row_tokens(self) -> np.ndarray:
        """Real tokens per row, int64 [num_rows]; ``seq_len - row_tokens()`` is the padding."""
        return run_sums(self.segment_len, self.row_splits)

    def efficiency(self, seq_len: int) -> float:
        """Real tokens / (rows * seq_len); 1.0 for no rows."""
        return self.num_tokens / (self.num_rows * seq_len) if self.num_rows else 1.0
