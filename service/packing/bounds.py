"""Lower bounds on the number of rows any whole-sample packing needs (Martello-Toth L1 and L2).

``lower_bound(lengths, seq_len)`` is max(L1, L2), computed over the length histogram:

* L1 = ceil(sum / L): the tokens have to fit somewhere.
* L2 (Martello and Toth, 1990) adds what L1 misses when items are long. For a threshold K
  in 0..L/2, call an item *big* if it is > L - K (nothing of size >= K fits beside it),
  *large* if it is in (L/2, L - K] (one per row, the rest of its row is free), and *medium*
  if it is in [K, L/2]. Big and large items each need their own row; the medium ones fit
  at best into the free space left by the large ones, and what does not fit needs new
  rows::

      L2(K) = big + large + max(0, ceil((sum(medium) - (large * L - sum(large))) / L))

  and L2 = max over K. Items below K are ignored, so L2(K) is a valid bound for every K.

Worked example, L = 10. Lengths [6, 6, 6, 4, 4, 4]: L1 = ceil(30 / 10) = 3; with K = 4 the
6s are large (4 free slots each) and the 4s medium, and they fit there: L2(4) = 3 + 0 = 3,
and 3 rows (6 + 4) are optimal. Lengths [7, 7, 7, 4, 4, 4]: L1 = ceil(33 / 10) = 4, but
with K = 4 the 7s are big (no 4 fits beside a 7) and the 4s need rows of their own:
L2(4) = 3 + ceil(12 / 10) = 5, which is the optimum (three 7s alone, 4 + 4 and 4).

Cost: one bincount and a few O(seq_len) numpy passes; ~0.1 ms at seq_len 2048 plus the
bincount (O(n)).
"""

from __future__ import annotations

import numpy as np

from packfeed.client.offsets import offsets_of


def lower_bound(lengths, seq_len: int) -> int:
    """max(L1, L2) for items of ``lengths`` (each 1..seq_len) in rows of ``seq_len``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        return 0
    return lower_bound_of_counts(np.bincount(lengths, minlength=seq_len + 1), seq_len)


def lower_bound_of_counts(counts: np.ndarray, seq_len: int) -> int:
    """The same bound from a histogram: ``counts[s]`` items of length s, s = 0..seq_len."""
    counts = np.asarray(counts, dtype=np.int64)[: seq_len + 1]
    if len(counts) < seq_len + 1:
        counts = np.pad(counts, (0, seq_len + 1 - len(counts)))
    sizes = np.arange(seq_len + 1, dtype=np.int64)
    # below_n[x], below_sum[x]: number and total length of the items shorter than x.
    below_n, below_sum = offsets_of(counts), offsets_of(counts * sizes)
    n, total = int(below_n[-1]), int(below_sum[-1])
    l1 = -(-total // seq_len)

    half = seq_len // 2  # medium items are <= half, large ones > half
    k = np.arange(half + 1, dtype=np.int64)
    cut = seq_len - k + 1  # big items are >= cut
    big = n - below_n[cut]
    large = below_n[cut] - below_n[half + 1]
    large_sum = below_sum[cut] - below_sum[half + 1]
    medium_sum = below_sum[half + 1] - below_sum[k]
    overflow = medium_sum - (large * seq_len - large_sum)
    l2 = big + large + np.maximum(0, -(-overflow // seq_len))
    return max(l1, int(l2.max()))
