"""Helpers of the preference-pair tests: in-memory windows of records and a pair's two segments."""

from __future__ import annotations

import numpy as np

from packfeed.service.inputs.read import Piece, RawWindow, WindowSpec


def memory_window(records, first_id: int = 0) -> RawWindow:
    """An in-memory RawWindow holding ``records`` as samples first_id, first_id + 1, ..."""
    n = len(records)
    spec = WindowSpec(0, 0, (Piece("mem.jsonl", "jsonl", "auto", 0, 0, n, first_id),))
    return RawWindow(spec, np.arange(first_id, first_id + n, dtype=np.int64), list(records), [], np.zeros(n, np.int64))


def pair_segments(tokenized, i: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((tokens, labels) of the chosen segment, the same of the rejected one) of pair sample i
    of a TokenizedSamples."""
    lo, hi = tokenized.offsets[i], tokenized.offsets[i + 1]
    cut = lo + int(tokenized.pair_chosen_lens[i])
    return (tokenized.tokens[lo:cut], tokenized.labels[lo:cut]), (tokenized.tokens[cut:hi], tokenized.labels[cut:hi])
