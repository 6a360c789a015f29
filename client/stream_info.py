"""What a ``packfeed serve`` server streams, as its Describe answer tells it: ``StreamInfo`` and
its ``SourceInfo`` per source, read from the wire message by ``stream_info``. Imports protobuf's
generated messages only where converted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packfeed.client.mixture_record import change_record


@dataclass(frozen=True)
class SourceInfo:
    """One source of the server's mixture."""

    name: str
    rows: int
    samples_per_epoch: int
    planned_share: float
    first_sample_id: int = 0  # its rows are sample ids [first_sample_id, first_sample_id + rows)


@dataclass(frozen=True)
class StreamInfo:
    """What the server streams (its Describe answer).

    ``total_rows``: rows of the whole stream (all epochs), None until the server's pipeline
    reached the end. ``epoch_rows``: rows of each epoch whose end it reached, in order.
    ``mixture_changes``: the online mixture changes made so far (client/mixture_record.py records).
    """

    seq_len: int
    tokenizer_name: str
    vocab_size: int
    pad_id: int
    config_hash: str
    total_rows: int | None
    ignore_index: int
    epochs: int = 1
    epoch_rows: tuple[int, ...] = ()
    sources: tuple[SourceInfo, ...] = ()
    samples_per_epoch: int = 0
    max_batch_rows: int = 0
    mixture_changes: tuple[dict, ...] = ()


def stream_info(info: Any) -> StreamInfo:
    """The StreamInfo of a ``packfeed.v1.StreamInfo`` message."""
    return StreamInfo(
        seq_len=info.seq_len,
        tokenizer_name=info.tokenizer_name,
        vocab_size=info.vocab_size,
        pad_id=info.pad_id,
        config_hash=info.config_hash,
        total_rows=info.total_rows if info.HasField("total_rows") else None,
        ignore_index=info.ignore_index,
        epochs=info.epochs or 1,
        epoch_rows=tuple(info.epoch_rows),
        sources=tuple(SourceInfo(s.name, s.rows, s.samples_per_epoch, s.planned_share,
                                 s.first_sample_id) for s in info.sources),
        samples_per_epoch=info.samples_per_epoch,
        max_batch_rows=info.max_batch_rows,
        mixture_changes=tuple(change_record(c) for c in info.mixture_changes),
    )
