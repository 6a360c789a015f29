"""Packed preference pairs on CUDA: every flash back-end gives each pair's log-probs, the DPO loss
and its gradients of the pairs run one sequence at a time through SDPA, in bf16.

The CPU twin (tests/models/test_dpo_packed.py) proves the same in fp32 to 1e-4; here the
kernels are the ones training uses (packfeed_varlen, flash_attention_2/4 where installed) and
the numbers are bf16, so the bounds are rounding bounds:
- a segment's log-prob sum: mean |difference| per trained token <= 5e-2 (BF16_TOL of the
  block-causal test: bf16 moves a logit by up to 2.3e-2 from fp32, a leak by 0.56 to 1.6);
- the DPO loss: |difference| <= 2e-2 (beta 0.1 scales the log-prob errors down);
- the gradients: relative L2 error <= 5e-2 (GRAD_RTOL of the block-causal test).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from packfeed.client.model_inputs import to_model_inputs  # noqa: E402
from packfeed.client.pair_logps import segment_logps  # noqa: E402
from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, check_rows  # noqa: E402
from packfeed.trainer.objective.dpo import accumulate_dpo_gradients, dpo_micro_batch  # noqa: E402
from packfeed.trainer.objective.dpo_loss import DpoLoss  # noqa: E402
from packfeed.trainer.model.tiny import tiny_config  # noqa: E402
from support.gpu import CUDA_BACKENDS, DEVICE, backend_or_skip  # noqa: E402
from support.pair_rows import alone_logps, pack_pairs, random_pairs, segments_of, unpacked_dpo_loss  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

VOCAB, SEQ_LEN, NUM_PAIRS = 96, 40, 10
SIZE = {"hidden_size": 256, "intermediate_size": 512}  # head_dim 64: every flash kernel takes it
LOGP_TOL_PER_TOKEN = 5e-2
LOSS_TOL = 2e-2
GRAD_RTOL = 5e-2


def model(family: str, seed: int, attn: str):
    """fp32 weights on the GPU (training's layout: bf16 comes from autocast)."""
    torch.manual_seed(seed)
    config = tiny_config(family, VOCAB, **SIZE)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).to(DEVICE)


def rows_of_pairs():
    pairs = random_pairs(3, NUM_PAIRS, VOCAB)
    rows = pack_pairs(pairs, SEQ_LEN)
    check_rows(rows, SEQ_LEN)
    assert rows.num_rows < NUM_PAIRS, "rows must hold several pairs each"
    return pairs, rows


def bf16():
    return torch.autocast(DEVICE, dtype=torch.bfloat16)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma"])
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@torch.no_grad()
def test_packed_segment_logps_equal_each_sequence_alone_bf16(backend, family):
    name = backend_or_skip(backend)
    packed_model, sdpa = model(family, 0, name).eval(), model(family, 0, "sdpa").eval()
    _, rows = rows_of_pairs()
    inputs = to_model_inputs(rows, device=DEVICE)
    with bf16():
        logits = packed_model(**{k: v for k, v in inputs.items() if k != "labels"}).logits
    sums, counts = segment_logps(logits, inputs["labels"], inputs["cu_seq_lens_q"])
    worst = 0.0
    for s, sid, ids, labels in segments_of(rows):
        if sid == PAD_SAMPLE_ID:
            continue
        with bf16():
            alone, n = alone_logps(sdpa, ids, labels)
        assert int(counts[s]) == n == int((labels != IGNORE_INDEX).sum())
        worst = max(worst, abs(float(sums[s]) - float(alone)) / max(n, 1))
    print(f"{name}/{family}: packed vs alone (sdpa) log-prob sums, max mean |diff| per token {worst:.2e}")
    assert worst <= LOGP_TOL_PER_TOKEN, f"{name}/{family}: {worst:.2e} per token"


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma"])
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_packed_dpo_loss_and_gradients_equal_unpacked_bf16(backend, family):
    name = backend_or_skip(backend)
    loss = DpoLoss(beta=0.1)
    pairs, rows = rows_of_pairs()

    sdpa_policy = model(family, 0, "sdpa")
    sdpa_reference = model(family, 1, "sdpa").eval().requires_grad_(False)
    with bf16():
        expected = unpacked_dpo_loss(sdpa_policy, sdpa_reference, pairs, loss)
    expected.backward()
    expected_grads = torch.cat([p.grad.float().reshape(-1) for p in sdpa_policy.parameters()])

    policy = model(family, 0, name)
    reference = model(family, 1, name).eval().requires_grad_(False)
    result = accumulate_dpo_gradients(
        policy, [dpo_micro_batch(rows, device=DEVICE)], reference=reference, loss=loss, autocast_dtype=torch.bfloat16
    )
    grads = torch.cat([p.grad.float().reshape(-1) for p in policy.parameters()])
    error = float((grads - expected_grads).norm() / expected_grads.norm())
    print(f"{name}/{family}: loss {result.loss:.5f} vs unpacked {expected.detach().item():.5f}, gradient error {error:.2e}")
    assert result.pairs == NUM_PAIRS
    assert abs(result.loss - expected.detach().item()) <= LOSS_TOL
    assert torch.isfinite(grads).all() and error <= GRAD_RTOL
