"""packfeed.client: the packed-row contract and how to consume it.

Light dependencies (numpy; grpcio for the stream). Imports nothing else of packfeed.
"""

from packfeed.client.model_inputs import num_trained_tokens, to_model_inputs
from packfeed.client.rows import (
    COLUMN_DTYPES,
    IGNORE_INDEX,
    PAD_SAMPLE_ID,
    ROW_COLUMNS,
    PackedRows,
    check_rows,
    concat_rows,
    cu_seqlens,
    padding_rows,
    positions_from_seq_lens,
    seq_lens_from_positions,
)

__all__ = [
    "COLUMN_DTYPES",
    "IGNORE_INDEX",
    "PAD_SAMPLE_ID",
    "ROW_COLUMNS",
    "PackedRows",
    "check_rows",
    "concat_rows",
    "cu_seqlens",
    "padding_rows",
    "positions_from_seq_lens",
    "seq_lens_from_positions",
    "num_trained_tokens",
    "to_model_inputs",
]
