"""The DPO loss is the pair mean over the whole optimizer step, across micro-batches and ranks.

One step of 2 DDP workers (gloo, CPU, spawned processes) with gradient accumulation 2 on packed
pairs, the ranks' micro-batches holding very different numbers of pairs (one of them none: a
padding row), must give the gradients (1e-5 relative) of one process computing the mean pair
loss over the same pairs unpacked, one at a time, with the formulas written out. Averaging per
micro-batch or per rank would fail it (checked as a negative control).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from support.compare import relative_error  # noqa: E402
from support.pair_rows import pack_pairs, random_pairs, unpacked_dpo_loss  # noqa: E402
from support.torch_ranks import gloo_rank, one_torch_thread  # noqa: E402

from packfeed.client.rows import padding_rows, select_rows  # noqa: E402
from packfeed.trainer.run_config import ModelConfig  # noqa: E402
from packfeed.trainer.objective.dpo import accumulate_dpo_gradients, dpo_micro_batch  # noqa: E402
from packfeed.trainer.objective.dpo_loss import DpoLoss  # noqa: E402
from packfeed.trainer.model.builder import build_model  # noqa: E402

pytestmark = pytest.mark.integration

VOCAB, SEQ_LEN, WORLD = 96, 40, 2
MODEL = ModelConfig(name="tiny-llama", attn="sdpa")
LOSS = DpoLoss(beta=0.2)
PAIRS = random_pairs(11, 12, VOCAB)


def micro_batches() -> list[list]:
    """[rank][micro] PackedRows: rank 0 gets 1 row then the rest but one, rank 1 the last row then a
    padding row (no pair at all)."""
    rows = pack_pairs(PAIRS, SEQ_LEN)
    n = rows.num_rows
    assert n >= 4
    return [[select_rows(rows, [0]), select_rows(rows, range(1, n - 1))],
            [select_rows(rows, [n - 1]), padding_rows(1, SEQ_LEN, 0)]]


def models():
    policy = build_model(MODEL, vocab_size=VOCAB, seed=0)
    reference = build_model(MODEL, vocab_size=VOCAB, seed=1).eval().requires_grad_(False)
    return policy, reference


def _ddp_worker(rank: int, init_file: str, out_file: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    with gloo_rank(rank, init_file, WORLD):
        policy, reference = models()
        ddp = DistributedDataParallel(policy)
        micro = [dpo_micro_batch(rows) for rows in micro_batches()[rank]]
        result = accumulate_dpo_gradients(ddp, micro, reference=reference, loss=LOSS)
        if rank == 0:
            grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters()}
            torch.save({"grads": grads, "loss": result.loss, "pairs": result.pairs}, out_file)


def test_ddp_grad_accum_dpo_step_equals_unpacked_pair_mean(tmp_path):
    import torch.multiprocessing as mp

    with one_torch_thread():
        out = tmp_path / "ddp.pt"
        mp.spawn(_ddp_worker, args=(str(tmp_path / "init"), str(out)), nprocs=WORLD, join=True)
        ddp = torch.load(out)
        policy, reference = models()
        expected = unpacked_dpo_loss(policy, reference, PAIRS, LOSS)
        expected.backward()
        expected_grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters()}

        assert ddp["pairs"] == len(PAIRS)
        assert ddp["loss"] == pytest.approx(float(expected.detach()), rel=1e-5)
        assert relative_error(ddp["grads"], expected_grads) < 1e-5

        # Negative control: the mean over ranks of each rank's own pair mean is another gradient.
        policy.zero_grad()
        per_rank = [[dpo_micro_batch(rows) for rows in mbs] for mbs in micro_batches()]
        for micro in per_rank:
            accumulate_dpo_gradients(policy, micro, reference=reference, loss=LOSS)
        naive = {n: p.grad.detach() / WORLD for n, p in policy.named_parameters()}
        assert relative_error(naive, expected_grads) > 1e-3
