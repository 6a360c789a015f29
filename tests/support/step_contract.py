"""The step contract's fixture: samples of very different lengths and prompt masks, packed by
the real packer into 2 ranks x 2 micro-batches of very different token counts, and the
reference (the token mean over the samples run one at a time, unpacked, in one process).
Used by tests/integration/train/test_train_ddp_loss.py (DDP) and test_fsdp.py (FSDP2,
checkpointing, the chunked loss)."""

from __future__ import annotations

import numpy as np
import torch

from packfeed.client.rows import IGNORE_INDEX, select_rows
from packfeed.service.delivery.assign import fill_batch, split_micro_batches, step_rows
from packfeed.service.packing import assemble_rows, pack
from packfeed.trainer.run_config import ModelConfig
from packfeed.trainer.model.builder import build_model
from packfeed.trainer.objective.step import token_loss_sum

VOCAB, SEQ_LEN, PAD_ID = 96, 32, 0
WORLD, ACCUM, MICRO_ROWS = 2, 2, 2
MODEL = ModelConfig(name="tiny-llama", attn="sdpa")


def samples() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Samples of 2..32 tokens; every third has its first half masked as a prompt."""
    rng = np.random.default_rng(7)
    lengths = np.concatenate([rng.integers(2, 12, size=10), rng.integers(20, SEQ_LEN + 1, size=6)])
    tokens, labels = [], []
    for i, n in enumerate(lengths):
        ids = rng.integers(3, VOCAB, size=n).astype(np.int32)
        lab = ids.copy()
        if i % 3 == 0:
            lab[: n // 2] = IGNORE_INDEX
        tokens.append(ids)
        labels.append(lab)
    return tokens, labels


def packed_micro_batches() -> list[list]:
    """[rank][micro] PackedRows, built with the real packer, padded to MICRO_ROWS rows."""
    tokens, labels = samples()
    lengths = np.array([len(t) for t in tokens])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    packing = pack(lengths, SEQ_LEN, strategy="bfd")
    rows = assemble_rows(
        packing, np.concatenate(tokens), np.concatenate(labels), offsets,
        np.arange(len(tokens)), seq_len=SEQ_LEN, pad_id=PAD_ID,
    )
    # The feeder's contract (service/delivery/assign.py): rank k gets the rows whose index is k mod N,
    # the last step filled with padding rows, split into ACCUM micro-batches.
    batch_rows = ACCUM * MICRO_ROWS
    assert rows.num_rows <= WORLD * batch_rows, "the samples must fit one step"
    out = []
    for rank in range(WORLD):
        wanted = step_rows(rank, WORLD, batch_rows, 0, 0, rows.num_rows)
        real = select_rows(rows, wanted.rows) if len(wanted.rows) else None
        out.append(split_micro_batches(fill_batch(real, wanted, SEQ_LEN, PAD_ID)[0], ACCUM))
    assert all(mb.num_real_tokens for per_rank in out for mb in per_rank), "every micro-batch should hold real rows"
    return out


def reference() -> tuple[dict, float, int]:
    """Mean token loss over the samples run one at a time, unpacked, in one process."""
    model = build_model(MODEL, vocab_size=VOCAB, seed=0)
    tokens, labels = samples()
    count = sum(int((lab[1:] != IGNORE_INDEX).sum()) for lab in labels)
    total = 0.0
    for ids, lab in zip(tokens, labels):
        inputs = {
            "input_ids": torch.from_numpy(ids.astype(np.int64))[None],
            "labels": torch.from_numpy(lab.astype(np.int64))[None],
            "use_cache": False,
        }
        loss = token_loss_sum(model, inputs)
        (loss / count).backward()
        total += float(loss.detach())
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return grads, total / count, count
