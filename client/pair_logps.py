"""Packed logits -> per-segment log-probabilities, and the preference pairs among the segments.

Beside ``to_model_inputs``: any loop that trains on packed rows computes DPO, IPO, SimPO or ORPO
from these sums, one forward of the packed batch, no unpacking.

* ``segment_logps(logits, labels, cu_seq_lens)``: for every segment of the batch, the sum of
  ``log p(labels[t] | tokens before t)`` over its trained labels, and how many there are. One
  vectorised pass: the logits that predict a trained label gathered, a per-token cross
  entropy on them, then ``segment_sums``; no Python loop over segments.
* ``segment_sums(token_logps, slots, cu_seq_lens)``: the same sums from per-token log-probs
  computed elsewhere (a chunked loss head that never holds the full logits, e.g.
  ``packfeed.trainer.objective.loss_head``), one ``index_add`` into the segments.
* ``pair_segments(pair_roles, sample_ids)``: the segment index of each pair's chosen and
  rejected sides, checked against the row convention (client/rows.py).
* ``pair_logps(sums, counts, chosen, rejected)``: those sums gathered per pair.

The shift is Hugging Face's (and ``trainer/objective/step.py``'s): the logits at token t predict
``labels[t + 1]`` inside each row. The first label of every segment is IGNORE_INDEX, so no
segment's sum takes a term from the segment before it. Worked example, one row, L=6, segments
[3, 3] (a pair: prompt [5], chosen [7, 8] then prompt [5], rejected [9, 4])::

    labels        = [-100, 7, 8, -100, 9, 4]
    token t=0 predicts 7, t=1 predicts 8      -> segment 0: 2 terms
    token t=3 predicts 9, t=4 predicts 4      -> segment 1: 2 terms (t=2 predicts nothing)

Cost: one cross entropy over the trained tokens (at most what the SFT loss costs; a float32 copy
of their logits only) plus O(B*L) index work.
torch is imported inside the functions: ``packfeed.client`` stays importable without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, PAIR_CHOSEN, PAIR_REJECTED

_FIRST_LABEL_MESSAGE = (f"the first label of every segment must be {IGNORE_INDEX} (client/rows.py): else the "
                        "previous segment's last token would be trained to predict it")


def segment_logps(logits: Any, labels: Any, cu_seq_lens: Any) -> tuple[Any, Any]:
    """(sums, counts) over the segments of a packed batch: float32 and int64 tensors [S].

    ``logits``: [B, L, V] (any float dtype; the log-softmax runs in float32). ``labels``: [B, L]
    (IGNORE_INDEX where not trained). ``cu_seq_lens``: the S + 1 global segment offsets over the
    B*L flattened tokens, a boundary at every row start (``to_model_inputs``'s
    ``cu_seq_lens_q``). Gradients flow to ``logits`` through ``sums``. A segment with no
    trained label (padding, a prompt alone) sums to 0 with count 0. Only the logits that
    predict a trained label are gathered and cast (prompts, twice in every pair, cost nothing).
    """
    import torch
    import torch.nn.functional as F

    num_rows, seq_len, vocab = logits.shape
    if tuple(labels.shape) != (num_rows, seq_len):
        raise ValueError(f"labels must be [B, L] = [{num_rows}, {seq_len}], got {tuple(labels.shape)}")
    device = logits.device
    cu = torch.as_tensor(cu_seq_lens, device=device).long()
    if cu.ndim != 1 or len(cu) < 2 or int(cu[0]) != 0 or int(cu[-1]) != num_rows * seq_len:
        raise ValueError(f"cu_seq_lens must run from 0 to B*L = {num_rows * seq_len}")
    labels = labels.to(device).long()
    if (labels.reshape(-1)[cu[:-1]] != IGNORE_INDEX).any():
        raise ValueError(_FIRST_LABEL_MESSAGE)
    # Flat slot b*L + t + 1 holds a trained label; the logits at slot b*L + t predict it.
    row, t = torch.nonzero(labels[:, 1:] != IGNORE_INDEX, as_tuple=True)
    predicting = row * seq_len + t
    targets = labels.reshape(-1)[predicting + 1]
    token_logps = -F.cross_entropy(logits.reshape(-1, vocab)[predicting].float(), targets, reduction="none")
    return segment_sums(token_logps, predicting, cu)


def segment_sums(token_logps: Any, slots: Any, cu_seq_lens: Any) -> tuple[Any, Any]:
    """(sums, counts) over the segments of a packed batch: float32 and int64 tensors [S].

    ``token_logps`` [N]: the log-probability of the label at flat slot ``slots[i] + 1``,
    predicted at flat slot ``slots[i]`` (int64 [N], ``row * L + t``: Hugging Face's shift, as
    ``segment_logps`` computes them). ``cu_seq_lens``: the S + 1 global segment offsets over
    the B*L flattened tokens. A term goes to the segment of its label; gradients flow to
    ``token_logps`` through ``sums``. ValueError when a slot predicts the first label of the
    next segment (a label the row convention masks). For cu [0, 3, 6] and slots [0, 1, 3]:
    buckets [0, 0, 1]. Cost: O(B*L + N) index work.
    """
    import torch

    device = token_logps.device
    slots = torch.as_tensor(slots, device=device).long()
    cu = torch.as_tensor(cu_seq_lens, device=device).long()
    if cu.ndim != 1 or len(cu) < 2 or int(cu[0]) != 0:
        raise ValueError("cu_seq_lens must be the S + 1 segment offsets over the B*L slots, from 0")
    if slots.ndim != 1 or slots.shape != token_logps.shape:
        raise ValueError(f"token_logps {tuple(token_logps.shape)} and slots {tuple(slots.shape)} must be [N] each")
    if len(slots) and (int(slots.min()) < 0 or int(slots.max()) + 1 >= int(cu[-1])):
        raise ValueError(f"slots must predict a label inside the {int(cu[-1])} slots of cu_seq_lens")
    num_segments = len(cu) - 1
    segment_of_slot = torch.repeat_interleave(torch.arange(num_segments, device=device), cu.diff())
    bucket = segment_of_slot[slots + 1]
    if (segment_of_slot[slots] != bucket).any():
        raise ValueError(_FIRST_LABEL_MESSAGE)
    sums = torch.zeros(num_segments, dtype=torch.float32, device=device).index_add(0, bucket, token_logps.float())
    return sums, torch.bincount(bucket, minlength=num_segments)



def pair_segments(pair_roles: np.ndarray, sample_ids: np.ndarray, segment_splits: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(chosen, rejected): int64 segment indices [P] of the P pairs, in segment order.

    Per the row convention a pair is a PAIR_CHOSEN segment followed at once by a PAIR_REJECTED
    segment of the same sample id, in the same row (``segment_splits``, when given, says where
    rows start). Raises ValueError on anything else (a lone side, two sides of different
    samples, a pair across rows): its loss would compare unrelated answers. For roles
    [1, 0, -1, 1, 0]: chosen [0, 3], rejected [1, 4].
    """
    roles = np.asarray(pair_roles)
    ids = np.asarray(sample_ids)
    if roles.shape != ids.shape:
        raise ValueError(f"pair_roles has {roles.shape} entries, sample_ids {ids.shape}: one each per segment")
    chosen = np.flatnonzero(roles == PAIR_CHOSEN)
    rejected = np.flatnonzero(roles == PAIR_REJECTED)
    if len(chosen) != len(rejected) or not np.array_equal(rejected, chosen + 1):
        raise ValueError("every PAIR_CHOSEN segment must be followed at once by its PAIR_REJECTED segment "
                         f"(chosen at {chosen[:8].tolist()}, rejected at {rejected[:8].tolist()})")
    if (ids[chosen] != ids[rejected]).any() or (ids[chosen] == PAD_SAMPLE_ID).any():
        raise ValueError("the two segments of a pair must carry the same (real) sample id")
    if segment_splits is not None:
        row_starts = np.asarray(segment_splits)[1:-1]
        if np.isin(rejected, row_starts).any():
            raise ValueError("a pair's two segments must be in the same row")
    return chosen.astype(np.int64), rejected.astype(np.int64)


def pair_logps(sums: Any, counts: Any, chosen: Any, rejected: Any) -> dict[str, Any]:
    """The per-segment sums gathered per pair: ``chosen_logps``, ``rejected_logps`` (float
    [P], differentiable) and ``chosen_tokens``, ``rejected_tokens`` (int64 [P]). ``chosen`` and
    ``rejected`` are the indices from ``pair_segments`` (numpy or tensors)."""
    import torch

    chosen = torch.as_tensor(chosen, device=sums.device).long()
    rejected = torch.as_tensor(rejected, device=sums.device).long()
    return {
        "chosen_logps": sums[chosen],
        "rejected_logps": sums[rejected],
        "chosen_tokens": counts[chosen],
        "rejected_tokens": counts[rejected],
    }
