"""The packed row: one convention, defined once (see docs/design.md).

A row has ``seq_len`` (L) slots holding whole samples (or pieces of samples) back to back,
then padding. Columns:

==============  ===========  ==============================================================
column          dtype        meaning
==============  ===========  ==============================================================
input_ids       int32[L]     tokens; the pad id after the last segment
labels          int32[L]     the token where trained, IGNORE_INDEX (-100) where not: prompts
                             (loss on completions only), padding, and the first token of
                             every segment, so no sample is trained to predict the next one
position_ids    int32[L]     0, 1, 2, ... restarting at 0 at every segment start; the padding
                             tail is one more segment
seq_lens        int32[k]     lengths of the k segments, padding segment included; sum is L
sample_ids      int64[k]     global source index of each segment's sample; PAD_SAMPLE_ID (-1)
                             for the padding segment
pair_roles      int8[k]      the segment's side of a preference pair: PAIR_CHOSEN (1),
                             PAIR_REJECTED (0), PAIR_NONE (-1) for every other segment and
                             padding
row_index       int64        position of the row in the deterministic stream
==============  ===========  ==============================================================

Worked example, L=8, samples 7 ([5,6,7]) and 9 ([8,9]), loss on every token::

    input_ids    = [5, 6, 7, 8, 9, 0, 0, 0]
    labels       = [-100, 6, 7, -100, 9, -100, -100, -100]
    position_ids = [0, 1, 2, 0, 1, 0, 1, 2]
    seq_lens     = [3, 2, 3]
    sample_ids   = [7, 9, -1]
    pair_roles   = [-1, -1, -1]

A preference pair (DPO) is one sample, one global id, with two segments: prompt + chosen
answer, then prompt + rejected answer, adjacent in the same row, the chosen first. Labels
are IGNORE_INDEX on the prompt tokens of both. L=10, pair 4 (prompt [5, 6], chosen [7],
rejected [8, 9]) then sample 9 ([3, 2])::

    input_ids    = [5, 6, 7, 5, 6, 8, 9, 3, 2, 0]
    labels       = [-100, -100, 7, -100, -100, 8, 9, -100, 2, -100]
    position_ids = [0, 1, 2, 0, 1, 2, 3, 0, 1, 0]
    seq_lens     = [3, 4, 2, 1]
    sample_ids   = [4, 4, 9, -1]
    pair_roles   = [1, 0, -1, -1]

Rows written before ``pair_roles`` existed read as PAIR_NONE everywhere.

This module imports only numpy: the service writes rows with it, the client and the trainer
read them with it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from packfeed.client.offsets import concat_ranges, offsets_of, starts_of

IGNORE_INDEX = -100
PAD_SAMPLE_ID = -1
PAIR_CHOSEN = 1
PAIR_REJECTED = 0
PAIR_NONE = -1

# Fixed-length columns ([L] per row) and variable-length ones ([k] per row).
TOKEN_COLUMNS = ("input_ids", "labels", "position_ids")
SEGMENT_COLUMNS = ("seq_lens", "sample_ids", "pair_roles")
ROW_COLUMNS = TOKEN_COLUMNS + SEGMENT_COLUMNS + ("row_index",)
COLUMN_DTYPES = {
    "input_ids": np.int32,
    "labels": np.int32,
    "position_ids": np.int32,
    "seq_lens": np.int32,
    "sample_ids": np.int64,
    "pair_roles": np.int8,
    "row_index": np.int64,
}


def positions_from_seq_lens(seq_lens: np.ndarray) -> np.ndarray:
    """Position ids restarting at 0 for every segment: seq_lens [3, 2] -> [0, 1, 2, 0, 1].

    Cost: O(sum(seq_lens)), vectorised.
    """
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    total = int(seq_lens.sum())
    starts = np.repeat(starts_of(seq_lens), seq_lens)
    return (np.arange(total, dtype=np.int64) - starts).astype(np.int32)


def seq_lens_from_positions(position_ids: np.ndarray) -> np.ndarray:
    """Segment lengths of one row from its positions: [0, 1, 2, 0, 1] -> [3, 2].

    Segments start where the position is 0, so the two views of a row agree by construction.
    """
    position_ids = np.asarray(position_ids)
    starts = np.flatnonzero(position_ids == 0)
    if len(starts) == 0 or starts[0] != 0:
        raise ValueError("a packed row must start a segment at slot 0 (position_ids[0] == 0)")
    return np.diff(np.append(starts, len(position_ids))).astype(np.int32)


def cu_seqlens(seq_lens_per_row: list[np.ndarray] | np.ndarray, seq_len: int) -> np.ndarray:
    """Global cumulative segment offsets over B rows flattened to B*L tokens.

    Every row start is a boundary. For rows with seq_lens [3, 5] and [8], L=8:
    [0, 3, 8, 16]. int32, as flash-attention kernels expect.
    """
    rows = [np.asarray(lens, dtype=np.int64) for lens in seq_lens_per_row]
    for r, lens in enumerate(rows):
        if int(lens.sum()) != seq_len:
            raise ValueError(f"row {r}: seq_lens sum to {int(lens.sum())}, expected seq_len={seq_len}")
    # Every row sums to L, so the offsets over all segments land on every row start r*L.
    return offsets_of(np.concatenate(rows) if rows else []).astype(np.int32)


@dataclass(frozen=True)
class PackedRows:
    """B packed rows, column-wise.

    Token columns are [B, L] arrays. The per-row segment columns are stored flat, CSR style:
    row r's segments are ``seq_lens[segment_splits[r]:segment_splits[r+1]]`` (same for
    ``sample_ids``). That layout is an Arrow list array and the wire format without copies.
    """

    input_ids: np.ndarray  # int32 [B, L]
    labels: np.ndarray  # int32 [B, L]
    position_ids: np.ndarray  # int32 [B, L]
    seq_lens: np.ndarray  # int32 [total segments]
    sample_ids: np.ndarray  # int64 [total segments]
    segment_splits: np.ndarray  # int64 [B + 1]
    row_index: np.ndarray  # int64 [B]
    pair_roles: np.ndarray | None = None  # int8 [total segments]; None -> all PAIR_NONE

    def __post_init__(self) -> None:
        if self.pair_roles is None:
            object.__setattr__(self, "pair_roles", no_pair_roles(len(self.seq_lens)))

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def num_real_tokens(self) -> int:
        """Tokens of real samples, padding segments excluded."""
        return int(self.seq_lens[self.sample_ids != PAD_SAMPLE_ID].sum())

    def row_seq_lens(self, r: int) -> np.ndarray:
        return self.seq_lens[self.segment_splits[r] : self.segment_splits[r + 1]]

    def row_sample_ids(self, r: int) -> np.ndarray:
        return self.sample_ids[self.segment_splits[r] : self.segment_splits[r + 1]]

    def row_pair_roles(self, r: int) -> np.ndarray:
        return self.pair_roles[self.segment_splits[r] : self.segment_splits[r + 1]]

    @classmethod
    def from_columns(cls, columns: Mapping[str, object]) -> "PackedRows":
        """Build from per-row columns as read from Parquet or a Ray batch (lists per row).
        Without a ``pair_roles`` column, or with None for a row (data written before it
        existed, read with today's schema), those segments are PAIR_NONE."""
        seq_lens = [np.asarray(x, dtype=np.int32) for x in columns["seq_lens"]]
        sample_ids = [np.asarray(x, dtype=np.int64) for x in columns["sample_ids"]]
        splits = offsets_of([len(x) for x in seq_lens])
        roles = columns.get("pair_roles")
        ids = np.asarray(_stack(columns["input_ids"]), dtype=np.int32)
        row_index = columns.get("row_index")
        return cls(
            input_ids=ids,
            labels=np.asarray(_stack(columns["labels"]), dtype=np.int32),
            position_ids=np.asarray(_stack(columns["position_ids"]), dtype=np.int32),
            seq_lens=np.concatenate(seq_lens) if seq_lens else np.zeros(0, np.int32),
            sample_ids=np.concatenate(sample_ids) if sample_ids else np.zeros(0, np.int64),
            segment_splits=splits,
            row_index=(
                np.asarray(row_index, dtype=np.int64)
                if row_index is not None
                else np.arange(ids.shape[0], dtype=np.int64)
            ),
            pair_roles=(
                np.concatenate([no_pair_roles(len(lens)) if x is None else np.asarray(x, dtype=np.int8)
                                for x, lens in zip(roles, seq_lens)] or [np.zeros(0, np.int8)])
                if roles is not None
                else None
            ),
        )


def no_pair_roles(num_segments: int) -> np.ndarray:
    """``pair_roles`` of segments that belong to no preference pair: PAIR_NONE each, int8."""
    return np.full(num_segments, PAIR_NONE, dtype=np.int8)


def padding_rows(
    num_rows: int, seq_len: int, pad_id: int, row_index: Sequence[int] | np.ndarray | None = None
) -> PackedRows:
    """``num_rows`` all-padding rows: ids pad_id, labels IGNORE_INDEX, positions 0..L-1, one
    segment of length L with sample id PAD_SAMPLE_ID. They pass ``check_rows`` and train nothing.
    ``row_index`` defaults to -1 for every row.
    """
    if seq_len < 1 or num_rows < 0:
        raise ValueError(f"need seq_len >= 1 and num_rows >= 0, got {seq_len}, {num_rows}")
    shape = (num_rows, seq_len)
    index = np.full(num_rows, -1, np.int64) if row_index is None else np.asarray(row_index, dtype=np.int64)
    if index.shape != (num_rows,):
        raise ValueError(f"row_index must have {num_rows} entries, got {index.shape}")
    return PackedRows(
        input_ids=np.full(shape, pad_id, dtype=np.int32),
        labels=np.full(shape, IGNORE_INDEX, dtype=np.int32),
        position_ids=np.broadcast_to(np.arange(seq_len, dtype=np.int32), shape).copy(),
        seq_lens=np.full(num_rows, seq_len, dtype=np.int32),
        sample_ids=np.full(num_rows, PAD_SAMPLE_ID, dtype=np.int64),
        segment_splits=np.arange(num_rows + 1, dtype=np.int64),
        row_index=index,
        pair_roles=no_pair_roles(num_rows),
    )


def concat_rows(parts: Sequence[PackedRows]) -> PackedRows:
    """Rows of ``parts`` one after the other (same seq_len). Cost: one copy of every column."""
    if not parts:
        raise ValueError("concat_rows needs at least one PackedRows")
    if len({p.seq_len for p in parts}) != 1:
        raise ValueError(f"all parts must have the same seq_len, got {[p.seq_len for p in parts]}")
    offsets = starts_of([len(p.seq_lens) for p in parts])
    splits = [parts[0].segment_splits[:1]] + [p.segment_splits[1:] + off for p, off in zip(parts, offsets)]
    return PackedRows(
        input_ids=np.concatenate([p.input_ids for p in parts]),
        labels=np.concatenate([p.labels for p in parts]),
        position_ids=np.concatenate([p.position_ids for p in parts]),
        seq_lens=np.concatenate([p.seq_lens for p in parts]),
        sample_ids=np.concatenate([p.sample_ids for p in parts]),
        segment_splits=np.concatenate(splits).astype(np.int64),
        row_index=np.concatenate([p.row_index for p in parts]),
        pair_roles=np.concatenate([p.pair_roles for p in parts]),
    )


def select_rows(rows: PackedRows, positions: Sequence[int] | np.ndarray | range) -> PackedRows:
    """The rows at ``positions`` (0-based, in that order) as a new PackedRows.

    Cost: one gather of each token column (O(len(positions) * L)) and of the segments.
    """
    pos = np.asarray(positions, dtype=np.int64).reshape(-1)
    if len(pos) and (pos.min() < 0 or pos.max() >= rows.num_rows):
        raise IndexError(f"row positions must be in [0, {rows.num_rows}), got {pos.min()}..{pos.max()}")
    first, last = rows.segment_splits[pos], rows.segment_splits[pos + 1]
    counts = last - first
    splits = offsets_of(counts)
    segments = concat_ranges(first, counts)  # the source segments of each selected row
    return PackedRows(
        input_ids=rows.input_ids[pos],
        labels=rows.labels[pos],
        position_ids=rows.position_ids[pos],
        seq_lens=rows.seq_lens[segments],
        sample_ids=rows.sample_ids[segments],
        segment_splits=splits,
        row_index=rows.row_index[pos],
        pair_roles=rows.pair_roles[segments],
    )


def renumber_rows(rows: PackedRows, first: int) -> PackedRows:
    """``rows`` with ``row_index`` first, first + 1, ...: where they fall in the stream that
    delivers them (a window read back from disk, a reader restarted at a row). No column is
    copied; rows [a, b] renumbered from 7 have row_index [7, 8]."""
    return replace(rows, row_index=np.arange(first, first + rows.num_rows, dtype=np.int64))


def _stack(column: object) -> np.ndarray:
    if isinstance(column, np.ndarray) and column.dtype != object:
        return column
    return np.stack([np.asarray(x) for x in column]) if len(column) else np.zeros((0, 0))


def check_rows(rows: PackedRows, seq_len: int) -> None:
    """Raise ValueError unless ``rows`` follow the convention exactly.

    Checks every invariant a consumer relies on: fixed row length, segment lengths summing to
    L, positions restarting at every segment and only there, the first label of every segment
    masked, trained labels equal to their tokens, padding masked, last and tagged
    PAD_SAMPLE_ID, and whole preference pairs: a PAIR_CHOSEN segment right before a
    PAIR_REJECTED one of the same sample id in the same row, each only in such a pair, padding
    PAIR_NONE. Used by tests and by ``packfeed pack --validate``.
    """
    ids, labels, positions = rows.input_ids, rows.labels, rows.position_ids
    if ids.ndim != 2 or ids.shape[1] != seq_len:
        raise ValueError(f"input_ids must be [B, {seq_len}], got {ids.shape}")
    if labels.shape != ids.shape or positions.shape != ids.shape:
        raise ValueError("input_ids, labels and position_ids must have the same shape")
    if (len(rows.seq_lens) != len(rows.sample_ids) or len(rows.pair_roles) != len(rows.seq_lens)
            or rows.segment_splits[-1] != len(rows.seq_lens)):
        raise ValueError("seq_lens, sample_ids and pair_roles must have one entry per segment")
    if not np.isin(rows.pair_roles, (PAIR_NONE, PAIR_REJECTED, PAIR_CHOSEN)).all():
        raise ValueError(f"pair_roles must hold {PAIR_CHOSEN}, {PAIR_REJECTED} or {PAIR_NONE} only")
    for r in range(ids.shape[0]):
        lens = rows.row_seq_lens(r).astype(np.int64)
        sids = rows.row_sample_ids(r)
        if len(lens) == 0 or (lens <= 0).any() or int(lens.sum()) != seq_len:
            raise ValueError(f"row {r}: seq_lens {lens.tolist()} must be positive and sum to {seq_len}")
        if not np.array_equal(positions[r], positions_from_seq_lens(lens)):
            raise ValueError(f"row {r}: position_ids do not restart exactly at segment starts")
        starts = starts_of(lens)
        if (labels[r, starts] != IGNORE_INDEX).any():
            raise ValueError(f"row {r}: the first label of every segment must be {IGNORE_INDEX}")
        trained = labels[r] != IGNORE_INDEX
        if (labels[r][trained] != ids[r][trained]).any():
            raise ValueError(f"row {r}: a trained label differs from its input token")
        is_pad = np.repeat(sids == PAD_SAMPLE_ID, lens)
        if trained[is_pad].any():
            raise ValueError(f"row {r}: padding tokens must not be trained")
        if (sids[:-1] == PAD_SAMPLE_ID).any():
            raise ValueError(f"row {r}: only the last segment of a row may be padding")
        _check_pairs(r, sids, rows.row_pair_roles(r))


def _check_pairs(r: int, sids: np.ndarray, roles: np.ndarray) -> None:
    """Every chosen segment is followed by a rejected one of the same sample, and every
    rejected one follows such a chosen one: roles [1, 0, -1] pass, [1, -1], [0, 1] fail."""
    chosen = np.flatnonzero(roles == PAIR_CHOSEN)
    rejected = np.flatnonzero(roles == PAIR_REJECTED)
    if (roles[sids == PAD_SAMPLE_ID] != PAIR_NONE).any():
        raise ValueError(f"row {r}: padding segments must have pair role {PAIR_NONE}")
    if not np.array_equal(chosen + 1, rejected) or (sids[chosen] != sids[rejected]).any():
        raise ValueError(
            f"row {r}: pair_roles {roles.tolist()}: every chosen segment ({PAIR_CHOSEN}) must be followed "
            f"by the rejected one ({PAIR_REJECTED}) of the same sample, and no segment of a pair stand alone"
        )
