"""Helpers shared by the test suites: read packed rows back into per-sample views."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from packfeed.client.rows import PAD_SAMPLE_ID, PackedRows


def segments_by_sample(rows: PackedRows) -> dict[int, list[tuple[np.ndarray, np.ndarray]]]:
    """sample id -> [(tokens, labels) of each segment it appears in], in row order."""
    out: dict[int, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
    for r in range(rows.num_rows):
        start = 0
        for length, sid in zip(rows.row_seq_lens(r), rows.row_sample_ids(r)):
            if sid != PAD_SAMPLE_ID:
                out[int(sid)].append((rows.input_ids[r, start : start + length], rows.labels[r, start : start + length]))
            start += int(length)
    return dict(out)
