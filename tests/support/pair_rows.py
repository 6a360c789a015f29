"""Packed rows of preference pairs built by hand (the row convention, client/rows.py), with each
pair kept unpacked beside them, and the DPO loss computed the plain way on the unpacked view:
what the DPO tests compare against."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from packfeed.client.rows import (
    IGNORE_INDEX,
    PAD_SAMPLE_ID,
    PAIR_CHOSEN,
    PAIR_NONE,
    PAIR_REJECTED,
    PackedRows,
    positions_from_seq_lens,
)
from packfeed.client.offsets import offsets_of
from packfeed.trainer.objective.dpo_loss import DpoLoss


@dataclass(frozen=True)
class Pair:
    prompt: np.ndarray
    chosen: np.ndarray
    rejected: np.ndarray

    def sides(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(tokens, labels) of prompt + chosen, then of prompt + rejected: labels masked on the prompt."""
        out = []
        for answer in (self.chosen, self.rejected):
            ids = np.concatenate([self.prompt, answer]).astype(np.int64)
            labels = ids.copy()
            labels[: len(self.prompt)] = IGNORE_INDEX
            out.append((ids, labels))
        return out


def random_pairs(seed: int, num_pairs: int, vocab: int, *, max_prompt: int = 6, max_answer: int = 9) -> list[Pair]:
    """Pairs of random tokens (ids >= 3): prompts of 1..max_prompt, answers of 1..max_answer tokens,
    chosen and rejected of different lengths most of the time."""
    rng = np.random.default_rng(seed)

    def tokens(n: int) -> np.ndarray:
        return rng.integers(3, vocab, size=n)

    return [Pair(tokens(int(rng.integers(1, max_prompt + 1))), tokens(int(rng.integers(1, max_answer + 1))),
                 tokens(int(rng.integers(1, max_answer + 1)))) for _ in range(num_pairs)]


def pack_pairs(pairs: list[Pair], seq_len: int, *, plain: list[np.ndarray] = (), pad_id: int = 0) -> PackedRows:
    """Pairs (sample ids 0..P-1) then plain samples (ids P..) packed first-fit in order into rows of
    ``seq_len``: a pair's two segments side by side in one row, a padding tail where a row is not full."""
    items = [(i, [(ids, labels, role) for (ids, labels), role in zip(p.sides(), (PAIR_CHOSEN, PAIR_REJECTED))])
             for i, p in enumerate(pairs)]
    for j, ids in enumerate(plain):
        labels = np.asarray(ids, dtype=np.int64).copy()
        labels[0] = IGNORE_INDEX
        items.append((len(pairs) + j, [(np.asarray(ids, dtype=np.int64), labels, PAIR_NONE)]))
    rows: list[list[tuple[int, np.ndarray, np.ndarray, int]]] = [[]]
    for sid, segments in items:
        size = sum(len(ids) for ids, _, _ in segments)
        if size > seq_len:
            raise ValueError(f"sample {sid} ({size} tokens) does not fit a row of {seq_len}")
        if sum(len(s[1]) for s in rows[-1]) + size > seq_len:
            rows.append([])
        rows[-1].extend((sid, ids, labels, role) for ids, labels, role in segments)
    ids_rows, label_rows, lens, sids, roles = [], [], [], [], []
    for row in rows:
        row_lens = [len(ids) for _, ids, _, _ in row]
        ids = np.concatenate([ids for _, ids, _, _ in row])
        labels = np.concatenate([labels for _, _, labels, _ in row])
        for start in offsets_of(row_lens)[:-1]:
            labels[start] = IGNORE_INDEX  # the first token of every segment predicts nothing before it
        row_sids, row_roles = [s for s, _, _, _ in row], [r for _, _, _, r in row]
        tail = seq_len - len(ids)
        if tail:
            ids = np.concatenate([ids, np.full(tail, pad_id)])
            labels = np.concatenate([labels, np.full(tail, IGNORE_INDEX)])
            row_lens.append(tail)
            row_sids.append(PAD_SAMPLE_ID)
            row_roles.append(PAIR_NONE)
        ids_rows.append(ids)
        label_rows.append(labels)
        lens.append(row_lens)
        sids.append(row_sids)
        roles.append(row_roles)
    return PackedRows(
        input_ids=np.stack(ids_rows).astype(np.int32),
        labels=np.stack(label_rows).astype(np.int32),
        position_ids=np.stack([positions_from_seq_lens(np.asarray(x)) for x in lens]),
        seq_lens=np.concatenate(lens).astype(np.int32),
        sample_ids=np.concatenate(sids).astype(np.int64),
        segment_splits=offsets_of([len(x) for x in lens]),
        row_index=np.arange(len(rows), dtype=np.int64),
        pair_roles=np.concatenate(roles).astype(np.int8),
    )


def alone_logps(model, ids: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, int]:
    """Sum of log p(labels[t] | ids[:t]) over the trained labels of one sequence run alone."""
    device = next(model.parameters()).device
    logits = model(input_ids=torch.as_tensor(ids, device=device)[None], use_cache=False).logits[0]
    total, count = torch.zeros((), device=device), 0
    for t in range(1, len(ids)):
        if labels[t] != IGNORE_INDEX:
            total = total + torch.log_softmax(logits[t - 1].float(), dim=-1)[int(labels[t])]
            count += 1
    return total, count


def unpacked_dpo_loss(policy, reference, pairs, loss: DpoLoss) -> torch.Tensor:
    """The pair mean of the loss, one pair at a time, from the formulas written out."""
    losses = []
    for pair in pairs:
        (c_ids, c_labels), (r_ids, r_labels) = pair.sides()
        chosen, n_chosen = alone_logps(policy, c_ids, c_labels)
        rejected, n_rejected = alone_logps(policy, r_ids, r_labels)
        with torch.no_grad():
            ref_chosen, _ = alone_logps(reference, c_ids, c_labels)
            ref_rejected, _ = alone_logps(reference, r_ids, r_labels)
        if loss.loss_type == "ipo":
            delta = (chosen - ref_chosen) / n_chosen - (rejected - ref_rejected) / n_rejected
            losses.append((delta - 1 / (2 * loss.beta)) ** 2)
        else:
            z = loss.beta * ((chosen - ref_chosen) - (rejected - ref_rejected))
            eps = loss.label_smoothing
            losses.append(-(1 - eps) * torch.log(torch.sigmoid(z)) - eps * torch.log(torch.sigmoid(-z)))
    return torch.stack(losses).mean()


def segments_of(rows: PackedRows):
    """(segment index, sample id, ids, labels) of every segment of ``rows``, padding included."""
    starts = np.concatenate([[0], np.cumsum(rows.seq_lens)])
    flat_ids, flat_labels = rows.input_ids.reshape(-1), rows.labels.reshape(-1)
    for s, sid in enumerate(rows.sample_ids):
        yield s, int(sid), flat_ids[starts[s]:starts[s + 1]], flat_labels[starts[s]:starts[s + 1]]
