"""packfeed.client: the packed-row contract and how to consume it.

Light dependencies (numpy; grpcio for the stream). Imports nothing else of packfeed.
``PackedIterableDataset`` needs torch and is imported on first use, so ``import
packfeed.client`` works without torch.
"""

from packfeed.client.cost import (
    DEFAULT_RATIO,
    attention_ratio,
    balance_of,
    micro_batch_cost,
    row_costs,
    step_balance,
)
from packfeed.client.model_inputs import num_trained_tokens, to_model_inputs
from packfeed.client.pair_logps import pair_logps, pair_segments, segment_logps, segment_sums
from packfeed.client.rows import (
    COLUMN_DTYPES,
    IGNORE_INDEX,
    PAD_SAMPLE_ID,
    PAIR_CHOSEN,
    PAIR_NONE,
    PAIR_REJECTED,
    ROW_COLUMNS,
    PackedRows,
    check_rows,
    concat_rows,
    cu_seqlens,
    padding_rows,
    positions_from_seq_lens,
    select_rows,
    seq_lens_from_positions,
)
from packfeed.client.sources import first_sample_ids, per_source_sums, source_index
from packfeed.client.state import STATE_VERSION, StreamState
from packfeed.client.stream import Batch, PackedStream, SourceInfo, StreamError, StreamInfo

__all__ = [
    "DEFAULT_RATIO",
    "attention_ratio",
    "balance_of",
    "micro_batch_cost",
    "row_costs",
    "step_balance",
    "COLUMN_DTYPES",
    "IGNORE_INDEX",
    "PAD_SAMPLE_ID",
    "PAIR_CHOSEN",
    "PAIR_NONE",
    "PAIR_REJECTED",
    "ROW_COLUMNS",
    "PackedRows",
    "check_rows",
    "concat_rows",
    "cu_seqlens",
    "padding_rows",
    "positions_from_seq_lens",
    "select_rows",
    "seq_lens_from_positions",
    "num_trained_tokens",
    "to_model_inputs",
    "pair_logps",
    "pair_segments",
    "segment_logps",
    "segment_sums",
    "Batch",
    "PackedStream",
    "SourceInfo",
    "StreamError",
    "StreamInfo",
    "STATE_VERSION",
    "StreamState",
    "first_sample_ids",
    "per_source_sums",
    "source_index",
    # PackedIterableDataset is left out so that `from packfeed.client import *` needs no torch.
]


def __getattr__(name: str):
    """``PackedIterableDataset`` is imported on first access: it is the module that needs torch."""
    if name == "PackedIterableDataset":
        from packfeed.client.torch_data import PackedIterableDataset

        return PackedIterableDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
