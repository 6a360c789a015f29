"""Packed rows <-> Arrow tables: the layout of the Ray stream and of the Parquet output.

Every column of the packed row (docs/design.md) is a list column (``input_ids``, ``labels``, ``position_ids``:
int32 lists of length L; ``seq_lens`` int32, ``sample_ids`` int64 and ``pair_roles`` int8 lists
of the row's segments) plus ``row_index`` int64. A table without ``pair_roles`` (written before
it existed) reads as rows without preference pairs (PAIR_NONE). Converting back to numpy copies nothing for a table of
one chunk: the flat list values are reshaped to [B, L].
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from packfeed.client.rows import PackedRows

ROW_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int32())),
        ("position_ids", pa.list_(pa.int32())),
        ("seq_lens", pa.list_(pa.int32())),
        ("sample_ids", pa.list_(pa.int64())),
        ("pair_roles", pa.list_(pa.int8())),
        ("row_index", pa.int64()),
    ]
)


def rows_to_arrow(rows: PackedRows) -> pa.Table:
    """The rows as one table of ``ROW_SCHEMA``, over the rows' own buffers (no copy)."""
    num_rows, seq_len = rows.input_ids.shape
    token_offsets = _array(np.arange(num_rows + 1, dtype=np.int32) * seq_len, pa.int32())
    segment_offsets = _array(rows.segment_splits, pa.int32())

    def tokens(a: np.ndarray) -> pa.ListArray:
        return pa.ListArray.from_arrays(token_offsets, _array(a.reshape(-1), pa.int32()))

    return pa.Table.from_arrays(
        [
            tokens(rows.input_ids),
            tokens(rows.labels),
            tokens(rows.position_ids),
            pa.ListArray.from_arrays(segment_offsets, _array(rows.seq_lens, pa.int32())),
            pa.ListArray.from_arrays(segment_offsets, _array(rows.sample_ids, pa.int64())),
            pa.ListArray.from_arrays(segment_offsets, _array(rows.pair_roles, pa.int8())),
            _array(rows.row_index, pa.int64()),
        ],
        schema=ROW_SCHEMA,
    )


def _array(values: np.ndarray, type: pa.DataType) -> pa.Array:
    """An Arrow array over ``values`` (cast to ``type``'s width if need be), built from its
    buffer: ``pa.array`` imports pandas on its first call (~0.15 s of a packing process's
    start-up) to look for a DataFrame."""
    values = np.ascontiguousarray(values, dtype=type.to_pandas_dtype())
    return pa.Array.from_buffers(type, len(values), [None, pa.py_buffer(values)])


def rows_from_arrow(table: pa.Table | pa.RecordBatch) -> PackedRows:
    """Inverse of ``rows_to_arrow``; accepts any table with the row columns (``pair_roles``
    optional)."""
    num_rows = table.num_rows

    def column(name: str) -> pa.Array:
        col = table.column(name)
        return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col

    def tokens(name: str, dtype) -> np.ndarray:
        flat = column(name).flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)
        return flat.reshape(num_rows, -1) if num_rows else flat.reshape(0, 0)

    seq_lens_col = column("seq_lens")
    offsets = seq_lens_col.offsets.to_numpy().astype(np.int64)
    splits = offsets - offsets[0]
    return PackedRows(
        input_ids=tokens("input_ids", np.int32),
        labels=tokens("labels", np.int32),
        position_ids=tokens("position_ids", np.int32),
        seq_lens=seq_lens_col.flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False),
        sample_ids=column("sample_ids").flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False),
        segment_splits=splits,
        row_index=column("row_index").to_numpy(zero_copy_only=False).astype(np.int64, copy=False),
        pair_roles=(
            column("pair_roles").flatten().to_numpy(zero_copy_only=False).astype(np.int8, copy=False)
            if "pair_roles" in table.schema.names and (column("pair_roles").null_count < num_rows or not num_rows)
            else None  # written before the column (absent, or all null when read with ROW_SCHEMA)
        ),
    )
