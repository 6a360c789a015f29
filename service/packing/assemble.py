"""Turn a ``Packing`` plus the samples' tokens into ``PackedRows`` (the row convention).

Everything is a few whole-array numpy passes, no Python loop over rows: each slot's source run
(a segment of a sample, or padding read from a block of pad tokens after the samples), one
``take_runs`` each for tokens and labels (whole segments copied as slices when they are long,
else one index gather), then a small scatter for the first label of every segment.

Worked example, seq_len 4, pad_id 0, samples [5], [6, 7], [8, 9, 4] (global ids g0, g1, g2)
packed by bfd as rows [sample 2, sample 0] and [sample 1], loss on every token::

    input_ids    = [[8, 9, 4, 5], [6, 7, 0, 0]]
    labels       = [[-100, 9, 4, -100], [-100, 7, -100, -100]]
    position_ids = [[0, 1, 2, 0], [0, 1, 0, 1]]
    seq_lens     = [3, 1 | 2, 2]         segment_splits = [0, 2, 4]
    sample_ids   = [g2, g0 | g1, -1]     (row 0 is full: no padding segment)

A preference pair is one sample (one item to the packer) whose tokens are its chosen segment
then its rejected one; ``pair_chosen_lens`` says where it divides. Each of its segments is
written as two, chosen first, with ``pair_roles`` [1, 0] (every other segment -1): sample
[5, 6, 7, 5, 8] with chosen length 3 becomes segments [5, 6, 7] and [5, 8], both with its id.

Cost: O(rows * seq_len), memory-bound: about 5 passes over the slots (index, two gathers,
positions). Measured here: 30k SFT samples (19M tokens) into 4.7k rows of 4096 in ~0.1 s.
"""

from __future__ import annotations

import numpy as np

from packfeed.client.offsets import concat_ranges, offsets_of, run_sums, starts_of, take_runs
from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, PAIR_CHOSEN, PAIR_NONE, PAIR_REJECTED, PackedRows

from .types import Packing


def assemble_rows(
    packing: Packing,
    tokens: np.ndarray,
    labels: np.ndarray,
    sample_offsets: np.ndarray,
    sample_ids: np.ndarray,
    *,
    seq_len: int,
    pad_id: int,
    row_order: np.ndarray | None = None,
    first_row_index: int = 0,
    pair_chosen_lens: np.ndarray | None = None,
) -> PackedRows:
    """Write the rows of ``packing``.

    Args:
      packing: from ``pack(lengths, seq_len, ...)`` with ``lengths[i] ==
        sample_offsets[i+1] - sample_offsets[i]``.
      tokens: int32 [total tokens], all samples' tokens concatenated.
      labels: int32, same shape: the token where trained, IGNORE_INDEX where not (prompts).
      sample_offsets: int64 [n + 1]; sample i is ``tokens[sample_offsets[i]:sample_offsets[i+1]]``.
      sample_ids: int64 [n], global provenance ids, written per segment.
      seq_len, pad_id: row length and the token id of padding.
      row_order: optional permutation of ``range(num_rows)``; output row i is packed row
        ``row_order[i]``.
      first_row_index: ``row_index`` of the first output row (rows are numbered on from it).
      pair_chosen_lens: optional int64 [n]: for a preference pair, the tokens of its chosen
        segment (its first ``pair_chosen_lens[i]`` tokens; the rest is the rejected one); 0 for
        every other sample. A pair must have been packed whole (ValueError otherwise).

    On top of the caller's labels, the first token of every segment (split pieces included)
    and all padding get IGNORE_INDEX. A padding segment (sample id PAD_SAMPLE_ID) ends every
    row that is not full.
    """
    tokens = np.asarray(tokens)
    labels = np.asarray(labels)
    sample_offsets = np.asarray(sample_offsets, dtype=np.int64)
    sample_ids = np.asarray(sample_ids, dtype=np.int64)
    _check_inputs(packing, tokens, labels, sample_offsets, sample_ids, seq_len)

    num_rows = packing.num_rows
    seg_sample, seg_start, seg_len, seg_counts = _segments_in_order(packing, row_order)
    seg_sample, seg_start, seg_len, seg_counts, seg_roles = _split_pairs(
        seg_sample, seg_start, seg_len, seg_counts, sample_offsets, pair_chosen_lens
    )
    num_segments = len(seg_len)

    row_fill = run_sums(seg_len, offsets_of(seg_counts))  # tokens per output row
    if num_rows and int(row_fill.max()) > seq_len:
        bad = int(np.argmax(row_fill))
        raise ValueError(f"row {bad} holds {int(row_fill[bad])} tokens, more than seq_len={seq_len}")

    # Segment columns, with a padding segment appended to every row that is not full.
    seg_row = np.repeat(np.arange(num_rows, dtype=np.int64), seg_counts)
    has_pad = (row_fill < seq_len).astype(np.int64)
    out_splits = offsets_of(seg_counts + has_pad)
    pads_before = starts_of(has_pad)
    real_dest = np.arange(num_segments, dtype=np.int64) + pads_before[seg_row]
    pad_rows = np.flatnonzero(has_pad)
    pad_dest = out_splits[pad_rows + 1] - 1
    num_out = int(out_splits[-1])
    out_seq_lens = np.empty(num_out, dtype=np.int32)
    out_sample_ids = np.empty(num_out, dtype=np.int64)
    out_roles = np.full(num_out, PAIR_NONE, dtype=np.int8)
    out_roles[real_dest] = seg_roles
    out_seq_lens[real_dest] = seg_len
    out_sample_ids[real_dest] = sample_ids[seg_sample]
    out_seq_lens[pad_dest] = seq_len - row_fill[pad_rows]
    out_sample_ids[pad_dest] = PAD_SAMPLE_ID

    # Every slot's token: the source tokens of each segment, one segment after the other (rows
    # are full once padding is counted), padding read from a block of pad tokens placed after
    # the sources. take_runs copies whole segments as slices.
    src_start = np.full(num_out, len(tokens), dtype=np.int64)
    src_start[real_dest] = sample_offsets[seg_sample] + seg_start
    slot_start = starts_of(out_seq_lens)
    pad = int(out_seq_lens[pad_dest].max()) if len(pad_dest) else 0
    input_ids = take_runs(_then(tokens, pad, pad_id), src_start, out_seq_lens)
    out_labels = take_runs(_then(labels, pad, IGNORE_INDEX), src_start, out_seq_lens)
    out_labels[slot_start[real_dest]] = IGNORE_INDEX  # the first token of every segment
    # Positions restart at every segment: seq_lens [3, 2] -> [0, 1, 2, 0, 1].
    positions = take_runs(np.arange(seq_len, dtype=np.int32), np.zeros(num_out, np.int64), out_seq_lens)

    shape = (num_rows, seq_len)
    return PackedRows(
        input_ids=input_ids.reshape(shape),
        labels=out_labels.reshape(shape),
        position_ids=positions.reshape(shape),
        seq_lens=out_seq_lens,
        sample_ids=out_sample_ids,
        segment_splits=out_splits,
        row_index=first_row_index + np.arange(num_rows, dtype=np.int64),
        pair_roles=out_roles,
    )


def _then(values: np.ndarray, n: int, fill: int) -> np.ndarray:
    """``values`` as int32, then ``n`` copies of ``fill``."""
    out = np.empty(len(values) + n, dtype=np.int32)
    out[: len(values)] = values
    out[len(values):] = fill
    return out


def _split_pairs(seg_sample, seg_start, seg_len, seg_counts, sample_offsets, pair_chosen_lens):
    """Every whole-pair segment as two (chosen, rejected), and each segment's pair role.

    Segments of samples [a, pair p, b] with p's chosen length 3 of 5 -> (a), (p, 0, 3),
    (p, 3, 2), (b); roles [-1, 1, 0, -1]; the row's segment count grows by one per pair.
    """
    if pair_chosen_lens is None or not len(seg_len):
        return seg_sample, seg_start, seg_len, seg_counts, np.full(len(seg_len), PAIR_NONE, np.int8)
    chosen = np.asarray(pair_chosen_lens, dtype=np.int64)[seg_sample]
    is_pair = chosen > 0
    if not is_pair.any():
        return seg_sample, seg_start, seg_len, seg_counts, np.full(len(seg_len), PAIR_NONE, np.int8)
    whole = np.diff(sample_offsets)[seg_sample]
    if ((seg_start != 0) | (seg_len != whole))[is_pair].any() or (chosen >= whole)[is_pair].any():
        raise ValueError("a preference pair was cut or has no rejected segment: pairs must be packed whole")
    copies = 1 + is_pair.astype(np.int64)
    second = np.arange(int(copies.sum())) - np.repeat(starts_of(copies), copies)  # 1 on a rejected half
    sample, start, length, pair = (np.repeat(a, copies) for a in (seg_sample, seg_start, seg_len, is_pair))
    cut = np.repeat(chosen, copies)
    start = np.where(pair & (second == 1), cut, start)
    length = np.where(pair, np.where(second == 1, length - cut, cut), length)
    roles = np.where(pair, np.where(second == 1, PAIR_REJECTED, PAIR_CHOSEN), PAIR_NONE).astype(np.int8)
    counts = run_sums(copies, offsets_of(seg_counts))
    return sample, start, length, counts, roles


def _segments_in_order(packing: Packing, row_order: np.ndarray | None):
    """(sample, start, len) per segment in output row order, and segments per output row."""
    counts = np.diff(packing.row_splits)
    if row_order is None:
        return packing.segment_sample, packing.segment_start, packing.segment_len, counts
    row_order = np.asarray(row_order, dtype=np.int64)
    num_rows = packing.num_rows
    if row_order.shape != (num_rows,) or (
        num_rows
        and (
            int(row_order.min()) < 0
            or int(row_order.max()) >= num_rows
            or not (np.bincount(row_order, minlength=num_rows) == 1).all()
        )
    ):
        raise ValueError(f"row_order must be a permutation of range({num_rows})")
    # Rows [2, 0] with splits [0, 2, 3, 5]: segments [3, 4, 0, 1].
    out_counts = counts[row_order]
    idx = concat_ranges(packing.row_splits[:-1][row_order], out_counts)
    return packing.segment_sample[idx], packing.segment_start[idx], packing.segment_len[idx], out_counts


def _check_inputs(packing, tokens, labels, sample_offsets, sample_ids, seq_len) -> None:
    if tokens.ndim != 1 or labels.shape != tokens.shape:
        raise ValueError(
            f"tokens and labels must be 1-D and of equal length, got {tokens.shape} and {labels.shape}"
        )
    if sample_offsets.ndim != 1 or len(sample_offsets) < 1 or len(sample_ids) != len(sample_offsets) - 1:
        raise ValueError("sample_offsets must be [n + 1] and sample_ids [n] for n samples")
    if int(sample_offsets[-1]) > len(tokens):
        raise ValueError(f"sample_offsets end at {int(sample_offsets[-1])}, beyond {len(tokens)} tokens")
    if packing.num_segments:
        if int(packing.segment_sample.max()) >= len(sample_ids):
            raise ValueError("the packing refers to more samples than sample_offsets describes")
        sample_len = np.diff(sample_offsets)[packing.segment_sample]
        if (packing.segment_start + packing.segment_len > sample_len).any():
            raise ValueError(
                "a segment reaches past the end of its sample: was the packing computed from "
                "these samples' lengths?"
            )
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
