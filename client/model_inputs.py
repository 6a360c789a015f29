"""Packed rows -> keyword arguments for a Hugging Face causal LM, block-causal on every back-end.

``model(**to_model_inputs(batch))`` never lets two samples of a row see each other, whatever
``attn_implementation`` the model was loaded with (see docs/design.md, "Block-causal
attention"):

* flash back-ends (``flash_attention_2``/``_4``, or packfeed's registered ``varlen`` kernel)
  read ``cu_seq_lens_q``/``cu_seq_lens_k`` and ``max_length_q``/``max_length_k``: GLOBAL
  offsets over the B*L flattened tokens, with a boundary at every row start;
* SDPA / eager rebuild the same boundaries from the restarting ``position_ids``, which
  transformers only does when ``attention_mask`` is None and no KV cache exists: hence no
  ``attention_mask`` and ``use_cache=False``. SDPA and eager ignore the ``cu_seq_lens`` kwargs.

Worked example, B=2 rows of L=8, row 0 with seq_lens [3, 5] and row 1 with [8]::

    position_ids  = [[0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6, 7]]
    cu_seq_lens_q = [0, 3, 8, 16]         (int32; row 1 starts at the global offset 8)
    max_length_q  = 8

Cost: O(B*L) vectorised numpy work on the host, plus one host-to-device copy per column. The
segments are checked against ``position_ids`` (a segment restarts at 0 exactly where
``seq_lens`` says) so the flash path and the SDPA path cannot disagree about boundaries.

torch is imported inside the functions: ``packfeed.client`` stays importable without it.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from packfeed.client.offsets import offsets_of
from packfeed.client.rows import IGNORE_INDEX, PackedRows, positions_from_seq_lens

TOKEN_KEYS = ("input_ids", "labels", "position_ids")


def to_model_inputs(batch: PackedRows | Mapping[str, Any], *, device: Any = None) -> dict:
    """Model keyword arguments for a batch of B packed rows of length L.

    ``batch`` is a :class:`PackedRows`, or a mapping with ``input_ids``, ``labels`` and
    ``position_ids`` as [B, L] arrays (numpy or torch; Ray's object columns of per-row arrays
    work too) and optionally ``seq_lens``: per-row segment lengths as a list of arrays, an
    object ndarray (what Ray's ``iter_batches`` gives for list columns) or a [B, k] array whose
    zero entries are ignored. Without ``seq_lens`` the segments start where position_ids == 0.

    Returns ``input_ids``, ``labels``, ``position_ids`` (int64 [B, L]), ``cu_seq_lens_q`` and
    ``cu_seq_lens_k`` (int32 [num_segments + 1], the same tensor), ``max_length_q`` and
    ``max_length_k`` (python int) and ``use_cache=False``; never ``attention_mask``. Tensors
    are moved to ``device`` when given. Raises ValueError when the columns break the row
    convention (ragged rows, seq_lens not summing to L, positions not restarting at 0 at
    exactly the segment starts).
    """
    import torch

    if isinstance(batch, PackedRows):
        columns = {key: getattr(batch, key) for key in TOKEN_KEYS}
        lens = np.asarray(batch.seq_lens, dtype=np.int64)
        splits = np.asarray(batch.segment_splits, dtype=np.int64)
    else:
        missing = [key for key in TOKEN_KEYS if key not in batch]
        if missing:
            raise ValueError(f"batch lacks the column(s) {missing}; it needs {list(TOKEN_KEYS)}")
        columns = {key: batch[key] for key in TOKEN_KEYS}
        lens, splits = None, None
        if batch.get("seq_lens") is not None:
            lens, splits = _flat_seq_lens(batch["seq_lens"])

    tensors = {key: _as_long_tensor(torch, key, value) for key, value in columns.items()}
    shape = tensors["input_ids"].shape
    if len(shape) != 2 or shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty [B, L] array, got shape {tuple(shape)}")
    for key in ("labels", "position_ids"):
        if tensors[key].shape != shape:
            raise ValueError(f"{key} has shape {tuple(tensors[key].shape)}, input_ids {tuple(shape)}")
    num_rows, seq_len = int(shape[0]), int(shape[1])

    positions = tensors["position_ids"].cpu().numpy().reshape(-1)
    if lens is None:
        cu = _cu_from_positions(positions, num_rows, seq_len)
    else:
        cu = _cu_from_seq_lens(lens, splits, num_rows, seq_len)
        _check_positions(positions, cu)

    cu_seq_lens = torch.from_numpy(cu.astype(np.int32))
    max_length = int(np.diff(cu).max())
    if device is not None:
        tensors = {key: value.to(device) for key, value in tensors.items()}
        cu_seq_lens = cu_seq_lens.to(device)
    return {
        **tensors,
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": max_length,
        "max_length_k": max_length,
        "use_cache": False,
    }


def num_trained_tokens(inputs: Mapping[str, Any] | Any) -> int:
    """Tokens the causal-LM loss is computed on: ``labels[:, 1:] != IGNORE_INDEX``.

    Hugging Face's loss shifts labels left inside each row (token t predicts labels[t+1]), so
    the first label of a row is never a target. Sum this over all micro-batches and ranks of an
    optimizer step and divide the summed token losses by it (``num_items_in_batch``): the mean
    then does not depend on how samples were packed. Takes the dict from
    :func:`to_model_inputs` or a labels array/tensor of shape [B, L]; works without torch.
    """
    labels = inputs["labels"] if isinstance(inputs, Mapping) else inputs
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def _as_long_tensor(torch: Any, key: str, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.long()
    if (isinstance(value, np.ndarray) and value.dtype == object) or isinstance(value, (list, tuple)):
        rows = [np.asarray(row) for row in value]
        if len({row.shape for row in rows}) > 1:
            raise ValueError(f"{key}: rows have different lengths {sorted({len(r) for r in rows})}")
        value = np.stack(rows) if rows else np.zeros((0, 0), dtype=np.int64)
    return torch.from_numpy(np.asarray(value, dtype=np.int64))


def _flat_seq_lens(seq_lens: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-row segment lengths -> (flat lengths, CSR splits [B + 1]); zero entries dropped."""
    rows = [np.asarray(_to_numpy(row), dtype=np.int64).reshape(-1) for row in seq_lens]
    rows = [row[row != 0] for row in rows]
    splits = offsets_of([len(row) for row in rows])
    flat = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    return flat, splits


def _to_numpy(value: Any) -> Any:
    return value.cpu().numpy() if hasattr(value, "cpu") else value


def _cu_from_seq_lens(lens: np.ndarray, splits: np.ndarray, num_rows: int, seq_len: int) -> np.ndarray:
    """Global offsets: row r's segments shifted by r*L. Rows [3, 5] and [8], L=8 -> [0, 3, 8, 16].

    Every row sums to L, so the plain cumulative sum over all segments already lands on every
    row start; checking ``cu[splits] == r*L`` proves that for all rows at once.
    """
    if len(splits) != num_rows + 1:
        raise ValueError(f"seq_lens has {len(splits) - 1} rows, input_ids has {num_rows}")
    if (lens <= 0).any():
        raise ValueError("seq_lens must be positive")
    cu = offsets_of(lens)
    row_ends = cu[splits[1:]] - cu[splits[:-1]]
    bad = np.flatnonzero(row_ends != seq_len)
    if len(bad):
        r = int(bad[0])
        raise ValueError(f"row {r}: seq_lens sum to {int(row_ends[r])}, expected seq_len={seq_len}")
    return cu


def _cu_from_positions(positions: np.ndarray, num_rows: int, seq_len: int) -> np.ndarray:
    """Segments start where the position is 0. For positions [0,1,2,0,1 | 0,1,2,3,4]: [0,3,5,10]."""
    row_starts = np.arange(num_rows, dtype=np.int64) * seq_len
    if (positions[row_starts] != 0).any():
        r = int(np.flatnonzero(positions[row_starts] != 0)[0])
        raise ValueError(f"row {r}: a packed row must start a segment at slot 0 (position_ids[0] == 0)")
    cu = np.append(np.flatnonzero(positions == 0), num_rows * seq_len)
    _check_positions(positions, cu)
    return cu


def _check_positions(positions: np.ndarray, cu: np.ndarray) -> None:
    """Positions must count 0, 1, 2, ... inside every segment: for cu [0, 3, 5], [0,1,2,0,1]."""
    expected = positions_from_seq_lens(np.diff(cu))
    if not np.array_equal(positions, expected):
        bad = int(np.flatnonzero(positions != expected)[0])
        raise ValueError(
            f"position_ids disagree with the segments at flat token {bad}: positions must be "
            "0, 1, 2, ... restarting at 0 exactly at every segment start"
        )
