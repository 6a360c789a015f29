"""``concat_ranges``: many ``arange``s glued together, in one cumulative sum.

Packing keeps turning "runs" (a start and a length) into explicit indices: the rows a group
of events covers, the output slots of a block of items, the source tokens of a segment. The
loop-free way: fill ones, write at the head of each run the jump from the previous run's
last value, and take the running sum. Worked example, starts [5, 2] and lengths [2, 3]::

    steps   = [5, 1, -4, 1, 1]     # head of run 0: 5; head of run 1: 2 - (5 + 2 - 1)
    cumsum  = [5, 6, 2, 3, 4]

One pass to fill and one to sum, and a single output array (np.repeat + np.arange + add
needs three). Cost: O(total) time and memory.
"""

from __future__ import annotations

import numpy as np


def concat_ranges(starts: np.ndarray, lengths: np.ndarray, dtype=np.int64) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])`` without the loop.

    Every length must be >= 1 (a zero-length run would share its head with the next one).
    ``dtype`` must hold every value and every jump between runs.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    out = np.ones(total, dtype=dtype)
    if total:
        starts = np.asarray(starts, dtype=np.int64)
        heads = np.cumsum(lengths) - lengths
        out[heads[1:]] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
        out[0] = starts[0]
        np.cumsum(out, out=out)
    return out
