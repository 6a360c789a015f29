"""The optimum number of rows for a small window, by exhaustive search (a test oracle).

``optimal_rows(lengths, seq_len, max_nodes)`` returns the least number of rows that holds
every item whole, or None when the search ran out of nodes (then the optimum is unknown).
Not product code: exponential in the worst case, meant for <= ~60 items.

Method: one below the lower bound (Martello-Toth, ``bounds.py``; at least ceil(sum / L)) and
plain bfd's rows bracket the optimum; for m = start, start + 1, ... below bfd's rows, a
depth-first search asks "do the items fit in m rows?". It places items longest first; an item tries
each row it fits in, but only one row of each fill level (rows with equal fill are
interchangeable), and a branch is cut when the free space that the remaining items could
still use (rows with room for at least the shortest of them) is less than their total.

Worked example, L = 10, items [6, 5, 4, 4, 3, 3, 3, 2]: the bound is 3; bfd needs 4 rows;
the search finds 6 + 4, 5 + 3 + 2, 4 + 3 + 3, so the optimum is 3.
"""

from __future__ import annotations

import numpy as np

from packfeed.service.packing import pack
from packfeed.service.packing.bounds import lower_bound


def optimal_rows(lengths, seq_len: int, max_nodes: int = 200_000) -> int | None:
    """Least number of rows for items ``lengths`` (each 1..seq_len), or None if unproven."""
    items = sorted((int(x) for x in lengths), reverse=True)
    if not items:
        return 0
    if items[0] > seq_len:
        raise ValueError("every item must fit in a row")
    # Independent of what it judges: the search starts one below the product's bound (so a
    # bound that overestimates shows as an optimum below it) and stops at plain bfd's rows (so
    # exactfit's rows are checked against it, not part of it).
    start = max(-(-sum(items) // seq_len), lower_bound(items, seq_len) - 1)
    high = pack(items, seq_len, strategy="bfd").num_rows
    budget = [max_nodes]
    for m in range(start, high):
        found = _fits(items, seq_len, m, budget)
        if found is None:
            return None
        if found:
            return m
    return high


def _fits(items: list[int], seq_len: int, m: int, budget: list[int]) -> bool | None:
    """Whether items (longest first) fit in m rows; None when the node budget ran out."""
    fill = [0] * m
    suffix = np.cumsum(items[::-1])[::-1].tolist() + [0]  # suffix[i] = sum(items[i:])

    def place(i: int) -> bool | None:
        if i == len(items):
            return True
        budget[0] -= 1
        if budget[0] < 0:
            return None
        s = items[i]
        smallest = items[-1]
        usable = sum(seq_len - f for f in fill if seq_len - f >= smallest)
        if usable < suffix[i]:
            return False
        seen = set()
        for r in range(m):
            f = fill[r]
            if f + s > seq_len or f in seen:
                continue
            seen.add(f)
            fill[r] = f + s
            result = place(i + 1)
            fill[r] = f
            if result is None or result:
                return result
        return False

    return place(0)
