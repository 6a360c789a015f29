"""Helpers shared by the test suites: per-sample views of packed rows, a golden packed batch."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, PackedRows, positions_from_seq_lens
from packfeed.service.packing import assemble_rows, pack


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


def packed_prompt_rows(seed: int, *, samples: int, max_len: int, seq_len: int, vocab: int) -> PackedRows:
    """Rows from the real packer (bfd) of ``samples`` random samples of 2..``max_len`` tokens,
    sample ids 0..samples-1 in order, every third with its first half masked as a prompt,
    padding at the rows' ends."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, max_len + 1, size=samples)
    tokens = rng.integers(3, vocab, size=int(lengths.sum())).astype(np.int32)
    labels = tokens.copy()
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for i in range(0, len(lengths), 3):
        labels[offsets[i]:offsets[i] + lengths[i] // 2] = IGNORE_INDEX
    return assemble_rows(pack(lengths, seq_len, strategy="bfd"), tokens, labels, offsets, np.arange(len(lengths)),
                         seq_len=seq_len, pad_id=0)
