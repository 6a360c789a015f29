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


# The same columns as part files store them (packed/writer.py): not nullable, as no packed row
# has a null. Parquet then writes no definition levels for them (~8% of a part's write time).
PART_SCHEMA = pa.schema([
    pa.field(f.name, pa.list_(pa.field("element", f.type.value_type, nullable=False)), nullable=False)
    if pa.types.is_list(f.type) else pa.field(f.name, f.type, nullable=False)
    for f in ROW_SCHEMA
])  # fmt: skip


def rows_to_arrow(rows: PackedRows, schema: pa.Schema = ROW_SCHEMA) -> pa.Table:
    """The rows as one table of ``ROW_SCHEMA`` (or ``PART_SCHEMA``), over the rows' own buffers
    (no copy)."""
    num_rows, seq_len = rows.input_ids.shape
    offsets = {"tokens": _array(np.arange(num_rows + 1, dtype=np.int32) * seq_len, pa.int32()),
               "segments": _array(rows.segment_splits, pa.int32())}

    def column(name: str, values: np.ndarray, runs: str) -> pa.ListArray:
        type = schema.field(name).type
        return pa.ListArray.from_arrays(offsets[runs], _array(values.reshape(-1), type.value_type), type=type)

    return pa.Table.from_arrays(
        [
            column("input_ids", rows.input_ids, "tokens"),
            column("labels", rows.labels, "tokens"),
            column("position_ids", rows.position_ids, "tokens"),
            column("seq_lens", rows.seq_lens, "segments"),
            column("sample_ids", rows.sample_ids, "segments"),
            column("pair_roles", rows.pair_roles, "segments"),
            _array(rows.row_index, pa.int64()),
        ],
        schema=schema,
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
