"""PackedIterableDataset: the packed stream as a ``torch.utils.data.IterableDataset``.

    dataset = PackedIterableDataset("127.0.0.1:50051", rank=rank, world_size=world, batch_rows=8)
    loader = DataLoader(dataset, batch_size=None)    # one packed batch per item; num_workers=0
    for inputs in loader:                            # to_model_inputs(batch.rows): block-causal kwargs
        loss = model(**inputs).loss                  # token mean over labels[:, 1:] != -100
        ...
        save({"model": ..., "data": dataset.state_dict()})
    # later: dataset.load_state_dict(saved["data"]) and iterate again; it resumes exactly there.

Each item is the dict of :func:`packfeed.client.to_model_inputs` for one step of this rank:
``input_ids``/``labels``/``position_ids`` int64 [B, L], ``cu_seq_lens_q/k``,
``max_length_q/k`` and ``use_cache=False``, nothing else, so ``model(**inputs)`` works as is.
What is not a model argument (sample ids, padding rows, step, cursor) is on
:attr:`PackedIterableDataset.last_batch`, the :class:`~packfeed.client.stream.Batch` of the
item last yielded.

``state_dict()`` is the position after the last item yielded (the stream's JSON-able state):
saving it with the model that trained on that item and resuming from it neither skips nor
repeats a row. Each ``iter()`` opens a new :class:`PackedStream` at the current position.

Use ``num_workers=0``: the stream already prefetches on a background thread, and a copy of the
dataset in a worker process would advance a position the main process never sees (and every
worker would read the same rows). A worker process raises RuntimeError.

This is the only module of ``packfeed.client`` that imports torch; ``packfeed.client`` exposes
it lazily.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import IterableDataset, get_worker_info

from packfeed.client.model_inputs import to_model_inputs
from packfeed.client.state import StreamState
from packfeed.client.stream import Batch, PackedStream, StreamInfo


class PackedIterableDataset(IterableDataset):
    """This rank's packed batches as model keyword arguments, resumable (see the module docstring).

    Arguments are those of :class:`PackedStream`, plus ``device``: where to put the tensors
    (default: leave them on the CPU; a DataLoader's ``pin_memory`` works either way).
    """

    def __init__(
        self, target: str, *, state: StreamState | dict | None = None, device: str | torch.device | None = None,
        **stream_args,
    ) -> None:
        super().__init__()
        # rank, world_size, batch_rows, token, tls_ca, prefetch, ...: PackedStream's keywords.
        self._stream_args = stream_args
        self.target, self.device = target, device
        # The state and the stream's arguments are checked now, not at the first iteration.
        self._state = StreamState.resume_from(state)
        self._open(self._state).close()
        self.last_batch: Batch | None = None

    def describe(self) -> StreamInfo:
        """The server's stream description: seq_len, vocab_size, pad_id, ... (one RPC)."""
        with self._open(self._state) as stream:
            return stream.describe()

    def state_dict(self) -> dict:
        """JSON-able position after the last item yielded (``StreamState.to_dict()``)."""
        return self._state.to_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (a ``state_dict()``) at the next ``iter()``; ValueError naming
        the field at fault when it is not one."""
        self._state = StreamState.from_dict(state)

    def __iter__(self) -> Iterator[dict]:
        worker = get_worker_info()
        if worker is not None:
            raise RuntimeError(
                "PackedIterableDataset runs in the main process: use DataLoader(dataset, batch_size=None, "
                f"num_workers=0), not num_workers={worker.num_workers}; the stream prefetches on its own thread"
            )
        with self._open(self._state) as stream:
            for batch in stream:
                inputs = to_model_inputs(batch.rows, device=self.device)
                # Before the yield: once the consumer holds this batch it counts as consumed.
                self._state, self.last_batch = stream.state, batch
                yield inputs

    def _open(self, state: StreamState) -> PackedStream:
        return PackedStream(self.target, state=state, **self._stream_args)
