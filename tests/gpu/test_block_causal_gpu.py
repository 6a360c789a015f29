"""Block-causal attention on CUDA: every flash back-end keeps packed samples apart, in bf16.

For each CUDA back-end that can run here (packfeed_varlen: torch.nn.attention.varlen on SM80+;
flash_attention_2 when flash-attn is installed; flash_attention_4 when flash-attn-4 is
installed on SM90+), a packed batch of B=4 rows must give, segment by segment, the logits of
that segment run alone: through the same back-end, and through SDPA.

Tolerance (BF16_TOL = 5e-2, max |logit difference|): these models (hidden 256, head_dim 64,
logits up to ~1.4, gemma ~5.4) run in bfloat16, whose rounding alone moves logits by up to
7.8e-3 between two bf16 runs of one sample and by up to 2.3e-2 from the fp32 result (measured
with SDPA and eager on CPU, every family). A sample that sees another one moves them by 0.56
(gemma) to 1.6: the bound sits 2x above rounding and 10x below leakage, and the negative
control below proves a leak is caught at that bound.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from packfeed.client.model_inputs import num_trained_tokens, to_model_inputs  # noqa: E402
from packfeed.trainer.model.attention import VARLEN, select_attention  # noqa: E402
from packfeed.trainer.model.tiny import TINY_FAMILIES, tiny_config  # noqa: E402
from support.gpu import CUDA_BACKENDS, DEVICE, backend_or_skip  # noqa: E402
from support.model_batch import VOCAB, packed_batch, segments  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# head_dim 64: a size every flash kernel supports (flash-attn-4 does not take head_dim 16).
SIZE = {"hidden_size": 256, "intermediate_size": 512}
BF16_TOL = 5e-2
# Relative L2 error of all parameter gradients, bf16 autocast over fp32 weights. Measured on
# CPU (llama, qwen3, gemma): 0.2% to 0.9% from rounding; 18% to 92% when samples leak.
GRAD_RTOL = 5e-2

def alone(batch: dict, r: int, start: int, length: int) -> dict:
    """One segment as a batch of its own: one row, one segment."""
    return {
        "input_ids": batch["input_ids"][r : r + 1, start : start + length],
        "labels": batch["labels"][r : r + 1, start : start + length],
        "position_ids": np.arange(length)[None],
    }


def build(family: str, attns: list[str], dtype: str, **overrides) -> list:
    """Models with the same random weights, one per back-end, on the GPU."""
    torch.manual_seed(0)
    models = []
    for attn in attns:
        config = tiny_config(family, VOCAB, dtype=dtype, **SIZE, **overrides)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn).to(DEVICE).eval()
        if models:
            model.load_state_dict(models[0].state_dict())
        models.append(model)
    return models


FAMILY_CASES = [pytest.param(family, {}, id=family) for family in TINY_FAMILIES] + [
    pytest.param("mistral", {"sliding_window": 8}, id="mistral-window8")
]


@pytest.mark.parametrize(("family", "overrides"), FAMILY_CASES)
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@torch.no_grad()
def test_packed_logits_equal_samples_alone_bf16(backend, family, overrides):
    name = backend_or_skip(backend)
    model, sdpa = build(family, [name, "sdpa"], "bfloat16", **overrides)
    batch = packed_batch()
    logits = model(**to_model_inputs(batch, device=DEVICE)).logits.float()

    worst_same, worst_sdpa = 0.0, 0.0
    for r, start, length in segments():
        packed = logits[r : r + 1, start : start + length]
        single = to_model_inputs(alone(batch, r, start, length), device=DEVICE)
        same = model(**single).logits.float()
        reference = sdpa(input_ids=single["input_ids"], use_cache=False).logits.float()
        worst_same = max(worst_same, (packed - same).abs().max().item())
        worst_sdpa = max(worst_sdpa, (packed - reference).abs().max().item())
    assert worst_same < BF16_TOL, f"{name}/{family}: packed vs alone ({name}) max |diff| {worst_same:.2e}"
    assert worst_sdpa < BF16_TOL, f"{name}/{family}: packed vs alone (sdpa) max |diff| {worst_sdpa:.2e}"


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@torch.no_grad()
def test_negative_control_without_cu_seq_lens(backend):
    """B > 1 without cu_seq_lens: transformers' flash path silently attends across samples;
    packfeed's varlen back-end refuses instead."""
    name = backend_or_skip(backend)
    (model,) = build("llama", [name], "bfloat16")
    batch = packed_batch()
    inputs = to_model_inputs(batch, device=DEVICE)
    stripped = {k: v for k, v in inputs.items() if not k.startswith(("cu_seq_lens", "max_length"))}
    if name == VARLEN:
        with pytest.raises(ValueError, match="cu_seq_lens"):
            model(**stripped)
        return
    leaky = model(**stripped).logits.float()
    worst = 0.0
    for r, start, length in segments():
        same = model(**to_model_inputs(alone(batch, r, start, length), device=DEVICE)).logits.float()
        worst = max(worst, (leaky[r : r + 1, start : start + length] - same).abs().max().item())
    assert worst > BF16_TOL, f"{name}: expected cross-sample attention without cu_seq_lens, got {worst:.2e}"


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma"])
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_packed_gradients_equal_sum_over_samples(backend, family):
    """Backward through the kernel (GQA included): d(sum of token losses) over the packed batch
    equals the sum over samples run alone through SDPA. fp32 weights under bf16 autocast."""
    name = backend_or_skip(backend)
    model, sdpa = build(family, [name, "sdpa"], "float32")
    model.train()
    sdpa.train()
    batch = packed_batch()
    inputs = to_model_inputs(batch, device=DEVICE)
    n = num_trained_tokens(inputs)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        model(**inputs, num_items_in_batch=n).loss.backward()
        for r, start, length in segments():
            single = to_model_inputs(alone(batch, r, start, length), device=DEVICE)
            if num_trained_tokens(single) == 0:
                continue  # padding, or a sample of length 1: nothing to train on
            loss = sdpa(
                input_ids=single["input_ids"],
                labels=single["labels"],
                use_cache=False,
                num_items_in_batch=n,
            ).loss
            loss.backward()

    def flat_grads(m):
        return torch.cat([p.grad.float().reshape(-1) for p in m.parameters() if p.grad is not None])

    packed, reference = flat_grads(model), flat_grads(sdpa)
    error = ((packed - reference).norm() / reference.norm()).item()
    assert torch.isfinite(packed).all()
    assert error < GRAD_RTOL, f"{name}/{family}: relative gradient error {error:.2e}"


def test_auto_picks_a_flash_backend_on_cuda():
    name = select_attention("auto", device=DEVICE)
    assert name in (VARLEN, "flash_attention_2", "flash_attention_4", "sdpa")
    if torch.cuda.get_device_capability()[0] >= 8:
        if importlib.util.find_spec("torch.nn.attention.varlen") is None:
            return
        assert name != "sdpa", "torch ships varlen_attn on this SM80+ GPU, yet auto chose sdpa"
