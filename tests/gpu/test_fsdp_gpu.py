"""FSDP2 + activation checkpointing + the chunked loss head on CUDA, through each flash back-end.

One process, an NCCL group of one (FSDP2's code path: sharded parameters, bf16 gathers, fp32
reduce-scatter, the root kept gathered for the loss head). The step's gradients over the packed
micro-batches of support/step_contract.py must equal those of the samples run one at a time,
unpacked, in fp32 on the CPU (the token mean over the step): relative L2 error under bf16's
rounding (GRAD_RTOL, as test_block_causal_gpu.py measures it), far under a leak's.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.gpu import CUDA_BACKENDS, DEVICE, backend_or_skip  # noqa: E402
from support.step_contract import VOCAB, packed_micro_batches  # noqa: E402

from packfeed.client.model_inputs import to_model_inputs  # noqa: E402
from packfeed.client.rows import IGNORE_INDEX  # noqa: E402
from packfeed.trainer.run_config import ModelConfig  # noqa: E402
from packfeed.trainer.model.builder import build_model  # noqa: E402
from packfeed.trainer.model.parallelize import apply_activation_checkpointing, apply_fsdp  # noqa: E402
from packfeed.trainer.objective.step import accumulate_gradients, token_loss_sum  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SIZE = {"hidden_size": 256, "intermediate_size": 512}  # head_dim 64: every flash kernel takes it
GRAD_RTOL = 5e-2  # relative L2 over every gradient; bf16 rounding: 0.2-0.9% measured; a leak: 18-92%


@pytest.fixture(scope="module")
def one_rank_group():
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def reference_grads(config: ModelConfig) -> dict:
    """The token mean over the step's samples run one at a time, unpacked, fp32 SDPA on CPU."""
    model = build_model(ModelConfig(name=config.name, attn="sdpa", overrides=config.overrides), vocab_size=VOCAB,
                        seed=0)
    micro = [to_model_inputs(rows) for per_rank in packed_micro_batches() for rows in per_rank]
    count = sum(int((m["labels"][:, 1:] != IGNORE_INDEX).sum()) for m in micro)
    for m in micro:
        for r in range(m["input_ids"].shape[0]):
            positions = m["position_ids"][r].numpy()
            starts = list(np.flatnonzero(positions == 0)) + [len(positions)]
            for a, b in zip(starts, starts[1:]):
                single = {"input_ids": m["input_ids"][r:r + 1, a:b], "labels": m["labels"][r:r + 1, a:b],
                          "use_cache": False}
                (token_loss_sum(model, single) / count).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_fsdp_checkpointing_and_the_chunked_loss_step_like_the_samples_alone(one_rank_group, backend):
    name = backend_or_skip(backend)
    config = ModelConfig(name="tiny-llama", attn=name, overrides=SIZE)
    model = build_model(config, vocab_size=VOCAB, device=torch.device(DEVICE), seed=0)
    apply_activation_checkpointing(model, "full")
    apply_fsdp(model, param_dtype=torch.bfloat16)
    micro = [to_model_inputs(rows, device=DEVICE) for per_rank in packed_micro_batches() for rows in per_rank]
    result = accumulate_gradients(model, micro, chunk_tokens=7)
    got = {n.replace("_checkpoint_wrapped_module.", ""): p.grad.full_tensor().float().cpu()
           for n, p in model.named_parameters()}
    reference = reference_grads(config)
    assert result.trained_tokens > 0 and np.isfinite(result.loss)
    assert all(torch.isfinite(g).all() for g in got.values())
    flat = torch.cat([got[n].reshape(-1) for n in reference])
    expected = torch.cat([g.reshape(-1) for g in reference.values()])
    error = float((flat - expected).norm() / expected.norm())
    assert error < GRAD_RTOL, f"{name}: relative gradient error {error:.2e}"
