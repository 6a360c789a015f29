"""Block-causal attention on real transformers models: packed logits == each sample run alone.

Tiny random-weight models of every family, fp32 on CPU. A packed batch of B=4 rows of L=48
holds samples of lengths 1 to 48 and padding tails; the logits of every segment must equal the
logits of that segment run alone through the same model. Negative controls show the check is
not vacuous: the configurations docs/design.md names as contaminated differ by far more.
"""

from __future__ import annotations

import inspect
import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from packfeed.client.model_inputs import num_trained_tokens, to_model_inputs  # noqa: E402
from packfeed.trainer.model import attention  # noqa: E402
from packfeed.trainer.model.attention import VARLEN, register_varlen_attention, select_attention  # noqa: E402
from packfeed.trainer.model.tiny import TINY_FAMILIES, tiny_config  # noqa: E402
from support.model_batch import PADDED_ROWS, SEQ_LENS, VOCAB, packed_batch, segments  # noqa: E402

EQUAL_FP32 = 1e-4  # measured: <= 3.6e-7 on every family (gemma highest)
CONTAMINATED = 1e-2  # measured: 0.45 (gemma) to 0.75 (olmo2)


def build(family: str, *attns: str, **overrides) -> list:
    """One tiny model per attention back-end, all with the same random weights."""
    torch.manual_seed(0)
    models = []
    for attn in attns:
        # A config per model: from_config records the back-end on the config it is given.
        config = tiny_config(family, VOCAB, **overrides)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()
        assert model.config._attn_implementation == attn
        if models:
            model.load_state_dict(models[0].state_dict())
        models.append(model)
    return models


@torch.no_grad()
def max_diff_to_alone(packed_logits, alone_model, batch: dict) -> float:
    """Largest |logit| difference between the packed run and each segment run alone."""
    ids = torch.as_tensor(batch["input_ids"])
    worst = 0.0
    for r, start, length in segments():
        alone = alone_model(input_ids=ids[r : r + 1, start : start + length], use_cache=False).logits
        diff = (packed_logits[r : r + 1, start : start + length] - alone).abs().max().item()
        worst = max(worst, diff)
    return worst


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_packed_logits_equal_samples_alone(family, attn):
    (model,) = build(family, attn)
    batch = packed_batch()
    with torch.no_grad():
        logits = model(**to_model_inputs(batch)).logits
    diff = max_diff_to_alone(logits, model, batch)
    assert diff < EQUAL_FP32, f"{family}/{attn}: packed samples leak into each other, max |diff| {diff:.2e}"


CONTAMINATED_CALLS = {
    # The KV cache that use_cache's default (True) creates turns packing detection off.
    "use-cache-default": lambda inputs: {k: v for k, v in inputs.items() if k != "use_cache"},
    # Any attention_mask does too, even all ones.
    "attention-mask-of-ones": lambda inputs: {
        **inputs,
        "attention_mask": torch.ones_like(inputs["input_ids"]),
    },
}


@pytest.mark.parametrize("mistake", list(CONTAMINATED_CALLS))
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_negative_control_contaminated_configuration_is_caught(family, mistake):
    (model,) = build(family, "sdpa")
    batch = packed_batch()
    with torch.no_grad():
        logits = model(**CONTAMINATED_CALLS[mistake](to_model_inputs(batch))).logits
    diff = max_diff_to_alone(logits, model, batch)
    assert diff > CONTAMINATED, f"{family}/{mistake}: expected a leak, max |diff| {diff:.2e}"


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_sliding_window_stays_within_each_sample(attn):
    (windowed,) = build("mistral", attn, sliding_window=8)
    (full,) = build("mistral", attn, sliding_window=None)
    full.load_state_dict(windowed.state_dict())
    batch = packed_batch()
    with torch.no_grad():
        logits = windowed(**to_model_inputs(batch)).logits
        full_logits = full(**to_model_inputs(batch)).logits
    assert max_diff_to_alone(logits, windowed, batch) < EQUAL_FP32
    # The window did act: samples longer than 8 tokens see less than the full model.
    assert (logits - full_logits).abs().max().item() > CONTAMINATED


def test_loss_normalised_by_num_trained_tokens():
    (model,) = build("llama", "sdpa")
    inputs = to_model_inputs(packed_batch())
    n = num_trained_tokens(inputs)
    # Every real sample (padding tails excluded) is trained on all its tokens but the first.
    real = [lens[:-1] if r in PADDED_ROWS else lens for r, lens in enumerate(SEQ_LENS)]
    assert n == sum(length - 1 for lens in real for length in lens)
    with torch.no_grad():
        mean = model(**inputs).loss
        summed_over_n = model(**inputs, num_items_in_batch=n).loss
    torch.testing.assert_close(summed_over_n, mean)


# ---------------------------------------------------------------------------------------------
# packfeed's varlen back-end, run on CPU against a reference kernel with varlen_attn's contract
# ---------------------------------------------------------------------------------------------


class ReferenceVarlen:
    """Per-segment SDPA with flash-attention's window semantics; records how it was called."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, cu_q, cu_k, max_q, max_k, *, scale, window_size, enable_gqa):
        self.calls.append({"cu": cu_q, "max": max_q, "window": window_size, "gqa": enable_gqa})
        assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k)
        assert type(max_q) is int and max_q == max_k == int(cu_q.diff().max())
        if enable_gqa:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        left, right = window_size
        out = torch.empty_like(q)
        bounds = cu_q.tolist()
        for start, end in zip(bounds[:-1], bounds[1:]):
            i = torch.arange(end - start)[:, None]
            j = torch.arange(end - start)[None, :]
            allowed = (j <= i + right if right >= 0 else j >= 0) & (j >= i - left if left >= 0 else j >= 0)
            out[start:end] = torch.nn.functional.scaled_dot_product_attention(
                *(x[start:end].transpose(0, 1) for x in (q, k, v)), attn_mask=allowed, scale=scale
            ).transpose(0, 1)
        return out


@pytest.fixture
def reference_varlen(monkeypatch):
    kernel = ReferenceVarlen()
    monkeypatch.setattr(attention, "_varlen_kernel", lambda: kernel)
    register_varlen_attention()
    return kernel


@pytest.mark.parametrize(
    ("family", "overrides", "expected_window"),
    [pytest.param(family, {}, (-1, 0), id=family) for family in TINY_FAMILIES if family != "mistral"]
    + [
        pytest.param("mistral", {"sliding_window": None}, (-1, 0), id="mistral"),
        pytest.param("mistral", {"sliding_window": 8}, (7, 0), id="mistral-window8"),
    ],
)
def test_varlen_backend_packed_equals_alone(reference_varlen, family, overrides, expected_window):
    varlen, alone = build(family, VARLEN, "sdpa", **overrides)
    batch = packed_batch()
    inputs = to_model_inputs(batch)
    with torch.no_grad():
        logits = varlen(**inputs).logits
    assert max_diff_to_alone(logits, alone, batch) < EQUAL_FP32
    call = reference_varlen.calls[0]
    assert len(reference_varlen.calls) == 2  # one per layer
    assert torch.equal(call["cu"], inputs["cu_seq_lens_q"]) and call["max"] == 48
    assert call["window"] == expected_window and type(call["window"]) is tuple
    assert call["gqa"] is True  # 4 query heads share 2 kv heads


def test_varlen_backend_refuses_to_guess_boundaries(reference_varlen):
    (model,) = build("llama", VARLEN)
    inputs = to_model_inputs(packed_batch())
    with torch.no_grad():
        for key in ("cu_seq_lens_q", "max_length_k"):
            with pytest.raises(ValueError, match="to_model_inputs"):
                model(**{k: v for k, v in inputs.items() if k != key})
        padding = torch.ones_like(inputs["input_ids"])
        padding[2, -16:] = 0
        with pytest.raises(ValueError, match="attention_mask"):
            model(**inputs, attention_mask=padding)
        # An all-ones mask carries nothing: dropped, as on the flash_attention_2 path.
        ones = model(**inputs, attention_mask=torch.ones_like(padding)).logits
        torch.testing.assert_close(ones, model(**inputs).logits)


def fake_varlen_attn(signature_of):
    """A stand-in for torch's varlen_attn with the given signature, recording its arguments."""
    seen = {}

    def fake(*args, **kwargs):
        seen.update(args=args, kwargs=kwargs)
        return args[0]

    fake.__signature__ = inspect.signature(signature_of)
    return fake, seen


def _current_api(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None,
                 window_size=(-1, -1), enable_gqa=False):  # fmt: skip
    """torch 2.13's varlen_attn: causality is window_size == (-1, 0)."""


def _early_api(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None, scale=None):
    """Earlier releases: is_causal, no windows, no GQA."""


@pytest.fixture
def fresh_kernel():
    attention._varlen_kernel.cache_clear()
    yield
    attention._varlen_kernel.cache_clear()


def qkv(dtype):
    q = torch.zeros(6, 4, 16, dtype=dtype)
    return q, torch.zeros(6, 2, 16, dtype=dtype), torch.zeros(6, 2, 16, dtype=dtype)


def test_kernel_adapter_current_torch_api(monkeypatch, fresh_kernel):
    import torch.nn.attention.varlen as torch_varlen

    assert "window_size" in inspect.signature(torch_varlen.varlen_attn).parameters  # the installed torch
    fake, seen = fake_varlen_attn(_current_api)
    monkeypatch.setattr(torch_varlen, "varlen_attn", fake)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    kernel = attention._varlen_kernel()
    kernel(*qkv(torch.bfloat16), cu, cu, 4, 4, scale=0.25, window_size=[-1, 0], enable_gqa=True)
    assert seen["kwargs"] == {"scale": 0.25, "window_size": (-1, 0), "enable_gqa": True}
    assert type(seen["kwargs"]["window_size"]) is tuple  # varlen_attn tests causality with == (-1, 0)


def test_kernel_adapter_early_torch_api(monkeypatch, fresh_kernel):
    import torch.nn.attention.varlen as torch_varlen

    fake, seen = fake_varlen_attn(_early_api)
    monkeypatch.setattr(torch_varlen, "varlen_attn", fake)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    kernel = attention._varlen_kernel()
    kernel(*qkv(torch.float16), cu, cu, 4, 4, scale=None, window_size=(-1, 0), enable_gqa=True)
    assert seen["kwargs"] == {"scale": None, "is_causal": True}
    assert seen["args"][1].shape == (6, 4, 16)  # kv heads repeated for GQA
    with pytest.raises(NotImplementedError, match="sliding"):
        kernel(*qkv(torch.float16), cu, cu, 4, 4, scale=None, window_size=(7, 0), enable_gqa=False)


def test_kernel_adapter_dtype_policy(monkeypatch, fresh_kernel):
    import torch.nn.attention.varlen as torch_varlen

    fake, seen = fake_varlen_attn(_current_api)
    monkeypatch.setattr(torch_varlen, "varlen_attn", fake)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    kernel = attention._varlen_kernel()
    with pytest.raises(TypeError, match="bfloat16"):
        kernel(*qkv(torch.float32), cu, cu, 6, 6, scale=None, window_size=(-1, 0), enable_gqa=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kernel(*qkv(torch.float32), cu, cu, 6, 6, scale=None, window_size=(-1, 0), enable_gqa=True)
    assert all(t.dtype == torch.bfloat16 for t in seen["args"][:3])


# ---------------------------------------------------------------------------------------------
# back-end selection
# ---------------------------------------------------------------------------------------------


def test_auto_selects_sdpa_on_cpu(caplog):
    with caplog.at_level(logging.INFO, logger="packfeed.trainer.model.attention"):
        assert select_attention("auto", device="cpu") == "sdpa"
    assert "sdpa" in caplog.text
    assert select_attention("eager", device="cpu") == "eager"
    assert select_attention("sdpa", device=torch.device("cpu")) == "sdpa"


@pytest.mark.parametrize("name", ["flash_attention_2", "flash_attention_4", "varlen", "fa2"])
def test_forcing_a_cuda_backend_on_cpu_raises(name):
    with pytest.raises(RuntimeError, match="needs a CUDA GPU.*'sdpa' or 'eager'"):
        select_attention(name, device="cpu")


def test_unknown_backend_raises():
    with pytest.raises(ValueError, match="unknown attention back-end 'flex_attention'"):
        select_attention("flex_attention", device="cpu")
