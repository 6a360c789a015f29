"""The loss is the token mean over the whole optimizer step, across micro-batches and ranks.

One optimizer step of 2 DDP workers (gloo, CPU, spawned processes) with gradient accumulation
2 on rows built by the real packer must give the same gradients (1e-5 relative) as one process
computing the mean token loss over the same samples unpacked, one at a time. The samples have
very different lengths and prompt masks, and the micro-batches very different token counts,
so averaging per micro-batch or per rank would fail this test (checked as a negative control).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from support.compare import relative_error  # noqa: E402
from support.step_contract import (  # noqa: E402
    MODEL,
    VOCAB,
    WORLD,
    packed_micro_batches,
    reference,
)
from support.torch_ranks import gloo_rank, one_torch_thread  # noqa: E402

from packfeed.client.model_inputs import to_model_inputs  # noqa: E402
from packfeed.client.rows import IGNORE_INDEX  # noqa: E402
from packfeed.trainer.model.builder import build_model  # noqa: E402
from packfeed.trainer.objective.step import accumulate_gradients, token_loss_sum  # noqa: E402

pytestmark = pytest.mark.integration


def _ddp_worker(rank: int, init_file: str, out_file: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    with gloo_rank(rank, init_file, WORLD):
        model = DistributedDataParallel(build_model(MODEL, vocab_size=VOCAB, seed=0))
        micro = [to_model_inputs(rows) for rows in packed_micro_batches()[rank]]
        result = accumulate_gradients(model, micro)
        if rank == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.module.named_parameters()}
            torch.save({"grads": grads, "loss": result.loss, "tokens": result.trained_tokens}, out_file)


@pytest.fixture
def one_thread():
    with one_torch_thread():
        yield


def test_ddp_grad_accum_step_equals_unpacked_token_mean(tmp_path, one_thread):
    import torch.multiprocessing as mp

    out = tmp_path / "ddp.pt"
    mp.spawn(_ddp_worker, args=(str(tmp_path / "init"), str(out)), nprocs=WORLD, join=True)
    ddp = torch.load(out)
    ref_grads, ref_loss, ref_tokens = reference()

    assert ddp["tokens"] == ref_tokens > 0
    assert ddp["loss"] == pytest.approx(ref_loss, rel=1e-6)
    assert relative_error(ddp["grads"], ref_grads) < 1e-5

    # Negative control: the mean of per-micro-batch means differs by far more than the tolerance.
    model = build_model(MODEL, vocab_size=VOCAB, seed=0)
    micro = [to_model_inputs(rows) for per_rank in packed_micro_batches() for rows in per_rank]
    counts = [int((m["labels"][:, 1:] != IGNORE_INDEX).sum()) for m in micro]
    assert len(set(counts)) > 1, "micro-batches must differ in trained tokens for the control to bite"
    for m, n in zip(micro, counts):
        (token_loss_sum(model, m) / max(n, 1) / len(micro)).backward()
    naive = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    assert relative_error(naive, ref_grads) > 1e-3
