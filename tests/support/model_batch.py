"""Helpers shared by the test suites: per-sample views of packed rows, a golden packed batch."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, PackedRows, positions_from_seq_lens


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

# ---- a packed batch for the block-causal tests (CPU and GPU) ------------------------------
VOCAB = 128
PAD_ID = 0
# B=4 rows of L=48: samples of length 1, a sample filling a whole row, and padding tails
# (the last segment of rows 2 and 3 is padding: pad ids, labels ignored, positions restarting).
SEQ_LENS = [[1, 7, 16, 9, 15], [48], [20, 1, 11, 16], [5, 5, 5, 30, 3]]
PADDED_ROWS = (2, 3)


def packed_batch(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    seq_len = sum(SEQ_LENS[0])
    ids = rng.integers(3, VOCAB, size=(len(SEQ_LENS), seq_len))
    labels = ids.copy()
    for r, lens in enumerate(SEQ_LENS):
        starts = np.cumsum(lens) - lens
        labels[r, starts] = IGNORE_INDEX
        if r in PADDED_ROWS:
            ids[r, starts[-1] :] = PAD_ID
            labels[r, starts[-1] :] = IGNORE_INDEX
    return {
        "input_ids": ids,
        "labels": labels,
        "position_ids": np.stack([positions_from_seq_lens(lens) for lens in SEQ_LENS]),
        "seq_lens": [np.asarray(lens) for lens in SEQ_LENS],
    }


def segments() -> list[tuple[int, int, int]]:
    """(row, start, length) of every segment, padding tails included."""
    return [
        (r, int(start), int(length))
        for r, lens in enumerate(SEQ_LENS)
        for start, length in zip(np.cumsum(lens) - lens, lens)
    ]
