"""The chunked loss head (trainer/objective/loss_head.py) computes what the full logits compute.

Tiny random models of every CausalLM class the head knows (``LOGIT_TRANSFORMS``), float32 on
CPU, on rows built by the real packer: several segments per row, prompt masks, padding tails,
B = 3 rows. For every chunk size (1, 7, a divisor of the trained count, more than it) the SFT
loss and every parameter's gradient equal the full path's to 1e-6 relative; the head's logits
equal the model's own (softcap, scale and divisor included, each shown to matter); DPO's
per-segment sums, counts and gradients equal ``segment_logps``'s; the chunked path saves no
N x V tensor for backward. Negative controls: a one-slot misalignment of the targets, or a
dropped transform, changes the result far beyond the tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.compare import relative_error  # noqa: E402
from support.model_batch import packed_prompt_rows  # noqa: E402
from support.torch_ranks import one_torch_thread  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from packfeed.client.model_inputs import num_trained_tokens, to_model_inputs  # noqa: E402
from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, select_rows  # noqa: E402
from packfeed.trainer.run_config import ModelConfig  # noqa: E402
from packfeed.trainer.objective.dpo import PAIR_KEYS  # noqa: E402
from packfeed.trainer.objective.loss_head import (  # noqa: E402
    LOGIT_TRANSFORMS,
    NON_MODEL_KEYS,
    OutputHead,
    final_hidden_states,
    output_head,
    trained_token_logps,
)
from packfeed.trainer.model.builder import build_model  # noqa: E402
from packfeed.trainer.objective.step import accumulate_gradients, token_loss_sum  # noqa: E402
from packfeed.trainer.model.tiny import TINY_FAMILIES, tiny_config  # noqa: E402

VOCAB, SEQ_LEN, ROWS = 128, 32, 3
EQUAL = 1e-6  # relative, loss and every parameter's gradient (float32); measured <= 1.8e-7
# A chunk of 1 token multiplies by a vector where the full path multiplies matrices: the hidden
# states' gradients differ in their last bit, which backward through two layers amplifies (measured
# <= 9.9e-7, olmo2's k_norm); the full path itself on 2 threads instead of 1 moves by 1.8e-7.
EQUAL_ONE_TOKEN_CHUNKS = 2e-6
# Gradients are compared with |b| floored at 1e-3 of the largest gradient's norm: some are rounding
# noise around a true 0 (a key projection's bias), and noise has no relative precision.
NOISE_FLOOR = 1e-3

# Every class of LOGIT_TRANSFORMS -> (model_type, config overrides that make its transform
# matter on a random tiny model, attention back-end).
TINY_FIELDS = {
    "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 128, "max_position_embeddings": 1024, "pad_token_id": 0, "bos_token_id": 1,
    "eos_token_id": 2, "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
}
FAMILIES = {
    "LlamaForCausalLM": ("llama", {}, "sdpa"),
    "MistralForCausalLM": ("mistral", {}, "sdpa"),
    "MinistralForCausalLM": ("ministral", {}, "sdpa"),
    "MixtralForCausalLM": ("mixtral", {}, "sdpa"),
    "Qwen2ForCausalLM": ("qwen2", {}, "sdpa"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", {}, "sdpa"),
    "Qwen3ForCausalLM": ("qwen3", {}, "sdpa"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", {}, "sdpa"),
    "GemmaForCausalLM": ("gemma", {}, "sdpa"),
    "PhiForCausalLM": ("phi", {}, "sdpa"),
    "Phi3ForCausalLM": ("phi3", {}, "sdpa"),
    "StableLmForCausalLM": ("stablelm", {}, "sdpa"),
    "Starcoder2ForCausalLM": ("starcoder2", {}, "sdpa"),
    "SmolLM3ForCausalLM": ("smollm3", {}, "sdpa"),
    "Glm4ForCausalLM": ("glm4", {}, "sdpa"),
    "GPTNeoXForCausalLM": ("gpt_neox", {}, "sdpa"),
    "OlmoForCausalLM": ("olmo", {}, "sdpa"),
    "Olmo2ForCausalLM": ("olmo2", {}, "sdpa"),
    "Olmo3ForCausalLM": ("olmo3", {}, "sdpa"),
    "Gemma2ForCausalLM": ("gemma2", {"final_logit_softcapping": 0.5}, "eager"),  # gemma2 has no SDPA
    "Gemma3ForCausalLM": ("gemma3_text", {"final_logit_softcapping": 0.5}, "sdpa"),
    "CohereForCausalLM": ("cohere", {"logit_scale": 4.0}, "sdpa"),
    "Cohere2ForCausalLM": ("cohere2", {"logit_scale": 4.0}, "sdpa"),
    "GraniteForCausalLM": ("granite", {"logits_scaling": 0.25}, "sdpa"),
}


def tiny_model(forward_class: str, seed: int = 0):
    """A tiny random model of ``forward_class``: the packfeed tiny family when there is one."""
    model_type, overrides, attn = FAMILIES[forward_class]
    if model_type in TINY_FAMILIES:
        return build_model(ModelConfig(name=f"tiny-{model_type}", attn=attn), vocab_size=VOCAB, seed=seed)
    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **TINY_FIELDS, vocab_size=VOCAB, **overrides)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).train()


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield


def packed_inputs(num_rows: int = ROWS, seed: int = 10) -> dict:
    """``to_model_inputs`` of ``packed_rows``."""
    return to_model_inputs(packed_rows(num_rows, seed))


def packed_rows(num_rows: int = ROWS, seed: int = 10):
    """``num_rows`` rows from the real packer: samples of 2..20 tokens, every third with its
    first half masked as a prompt."""
    rows = packed_prompt_rows(seed, samples=12, max_len=20, seq_len=SEQ_LEN, vocab=VOCAB)
    rows = select_rows(rows, np.arange(num_rows))
    # Not vacuous: several segments in a row, a prompt mask after a row's first segment, padding.
    assert max(np.diff(rows.segment_splits)) >= 3 and (rows.sample_ids == PAD_SAMPLE_ID).any()
    return rows


def loss_and_grads(model, inputs: dict, chunk_tokens: int) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    loss = token_loss_sum(model, inputs, chunk_tokens=chunk_tokens)
    loss.backward()
    grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def chunk_sizes(n: int) -> list[int]:
    divisor = max(d for d in range(2, n) if n % d == 0)
    return [1, 7, divisor, n + 5]


def test_every_known_forward_is_tested_and_the_tiny_families_are_known():
    assert set(FAMILIES) == set(LOGIT_TRANSFORMS)
    assert {FAMILIES[c][0] for c in FAMILIES} >= set(TINY_FAMILIES)
    assert set(PAIR_KEYS) | {"labels"} == set(NON_MODEL_KEYS)


@pytest.mark.parametrize("forward_class", list(FAMILIES))
def test_chunked_loss_and_gradients_equal_the_full_logits(forward_class):
    model = tiny_model(forward_class)
    assert type(model).__name__ == forward_class
    inputs = packed_inputs()
    n = num_trained_tokens(inputs)
    assert n > 40 and inputs["input_ids"].shape[0] == ROWS and n < ROWS * (SEQ_LEN - 1)  # masks, padding

    full_loss, full_grads = loss_and_grads(model, inputs, 0)
    assert all(g is not None for g in full_grads.values())
    for chunk in chunk_sizes(n):
        loss, grads = loss_and_grads(model, inputs, chunk)
        assert loss == pytest.approx(full_loss, rel=EQUAL), (forward_class, chunk)
        error = relative_error(grads, full_grads, noise_floor=NOISE_FLOOR)
        assert error < (EQUAL_ONE_TOKEN_CHUNKS if chunk == 1 else EQUAL), chunk

    # Negative control: one slot of misalignment between hidden states and targets.
    shifted = dict(inputs, labels=torch.roll(inputs["labels"], 1, dims=1))
    assert abs(loss_and_grads(model, shifted, 7)[0] - full_loss) > 1e-3 * full_loss


@pytest.mark.parametrize("forward_class", list(FAMILIES))
def test_the_head_gives_the_models_own_logits(forward_class):
    model = tiny_model(forward_class)
    inputs = packed_inputs()
    kwargs = {k: v for k, v in inputs.items() if k not in NON_MODEL_KEYS}
    with torch.no_grad():
        expected = model(**kwargs).logits
        hidden = final_hidden_states(model, kwargs)
        head = output_head(model)
        got = head.logits(hidden)
    assert got.shape == expected.shape == (ROWS, SEQ_LEN, VOCAB)
    assert float((got - expected).abs().max()) <= EQUAL * float(expected.abs().max())
    kind = LOGIT_TRANSFORMS[forward_class]
    transforms = {"softcap": head.softcap, "scale": head.scale, "divide": head.divisor}
    assert [k for k, v in transforms.items() if v is not None] == ([kind] if kind else [])
    if kind:  # the transform matters: the bare projection is another function
        with torch.no_grad():
            bare = OutputHead(weight=head.weight, bias=head.bias).logits(hidden)
        assert float((bare - expected).abs().max()) > 0.05 * float(expected.abs().max())


def test_the_head_keeps_the_softcap_off_when_the_config_has_none():
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "gemma2", **TINY_FIELDS, vocab_size=VOCAB, final_logit_softcapping=None), attn_implementation="eager")
    assert output_head(model).softcap is None
    inputs = packed_inputs()
    full, _ = loss_and_grads(model, inputs, 0)
    assert loss_and_grads(model, inputs, 5)[0] == pytest.approx(full, rel=EQUAL)


def test_trained_slots_are_row_major_and_the_logps_are_the_targets():
    """Golden case: rows [-100, 7, 8, -100, 9, 4] and [-100, -100, 5, 6, -100, -100], L=6."""
    model = tiny_model("LlamaForCausalLM")
    labels = torch.tensor([[IGNORE_INDEX, 7, 8, IGNORE_INDEX, 9, 4],
                           [IGNORE_INDEX, IGNORE_INDEX, 5, 6, IGNORE_INDEX, IGNORE_INDEX]])
    inputs = to_model_inputs({"input_ids": torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0)),
                              "labels": labels, "position_ids": torch.tensor([[0, 1, 2, 0, 1, 2]] * 2)})
    logps, slots = trained_token_logps(model, inputs, chunk_tokens=4)
    assert slots.tolist() == [0, 1, 3, 4, 7, 8]  # row * 6 + t, t predicting labels[t + 1]
    with torch.no_grad():
        logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits.float()
    expected = logits.log_softmax(-1).reshape(12, VOCAB)[[0, 1, 3, 4, 7, 8], [7, 8, 9, 4, 5, 6]]
    assert logps.dtype == torch.float32
    torch.testing.assert_close(logps.detach(), expected, rtol=EQUAL, atol=0)


@pytest.mark.parametrize("forward_class", ["LlamaForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM"])
def test_a_micro_batch_without_a_trained_token(forward_class):
    model = tiny_model(forward_class)
    inputs = packed_inputs()
    inputs["labels"] = torch.full_like(inputs["labels"], IGNORE_INDEX)
    full_loss, full_grads = loss_and_grads(model, inputs, 0)
    logps, slots = trained_token_logps(model, inputs, chunk_tokens=4)
    assert logps.shape == slots.shape == (0,)
    for chunk in (1, 4):
        loss, grads = loss_and_grads(model, inputs, chunk)
        assert loss == full_loss == 0
        for name, grad in grads.items():
            assert (grad is None) == (full_grads[name] is None), name
            assert grad is None or not grad.any(), name
    # A step of such micro-batches beside a trained one: the trained one's gradient alone.
    trained = packed_inputs()
    alone = accumulate_gradients(model, [trained], chunk_tokens=5)
    alone_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    both = accumulate_gradients(model, [inputs, trained], chunk_tokens=5)
    assert (both.loss, both.trained_tokens) == (pytest.approx(alone.loss, rel=EQUAL), alone.trained_tokens)
    both_grads = {n: p.grad for n, p in model.named_parameters()}
    assert relative_error(both_grads, alone_grads, noise_floor=NOISE_FLOOR) < EQUAL


def test_accumulate_gradients_passes_the_chunk_through():
    model = tiny_model("Qwen3ForCausalLM")
    rows = packed_rows()
    micro = [to_model_inputs(select_rows(rows, [0])), to_model_inputs(select_rows(rows, [1, 2]))]
    results, grads = [], []
    for chunk in (0, 3):
        results.append(accumulate_gradients(model, micro, chunk_tokens=chunk))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        model.zero_grad(set_to_none=True)
    assert results[1].loss == pytest.approx(results[0].loss, rel=EQUAL)
    assert results[1].trained_tokens == results[0].trained_tokens > 0
    assert relative_error(grads[1], grads[0], noise_floor=NOISE_FLOOR) < EQUAL


def test_a_wrapper_with_a_module_runs_through_its_own_call():
    """DDP's layout: the head reads the decoder and lm_head of ``.module`` but calls the wrapper."""
    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module
            self.calls = 0

        def forward(self, **kwargs):
            self.calls += 1
            return self.module(**kwargs)

    model = tiny_model("LlamaForCausalLM")
    wrapper = Wrapper(model)
    inputs = packed_inputs()
    full, _ = loss_and_grads(model, inputs, 0)
    assert loss_and_grads(wrapper, inputs, 6)[0] == pytest.approx(full, rel=EQUAL)
    assert wrapper.calls == 1


def test_the_decoder_hook_is_removed_also_after_an_exception():
    model = tiny_model("LlamaForCausalLM")
    decoder = model.get_decoder()
    inputs = packed_inputs()
    trained_token_logps(model, inputs, chunk_tokens=8)
    assert not decoder._forward_hooks
    bad = dict(inputs, input_ids=inputs["input_ids"] + VOCAB)  # ids past the embedding table
    with pytest.raises(IndexError):
        trained_token_logps(model, bad, chunk_tokens=8)
    assert not decoder._forward_hooks


def test_unknown_forwards_and_bad_chunks_are_refused():
    from transformers import GPT2Config

    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB))
    with pytest.raises(ValueError, match="loss_chunk_tokens = 0"):
        output_head(gpt2)

    llama = tiny_model("LlamaForCausalLM")

    class RemoteCode(type(llama)):  # a subclass that changes the forward: not what was read
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    class Renamed(type(llama)):  # FSDP2's kind of dynamic subclass: the forward is Llama's
        pass

    llama.__class__ = RemoteCode
    with pytest.raises(ValueError, match="RemoteCode"):
        output_head(llama)
    llama.__class__ = Renamed
    assert output_head(llama).weight is llama.lm_head.weight

    class QuantisedLinear(torch.nn.Linear):  # a head that does not compute hidden @ W.T + b
        def forward(self, x):
            return super().forward(x).round()

    llama.lm_head.__class__ = QuantisedLinear
    with pytest.raises(ValueError, match="QuantisedLinear"):
        output_head(llama)
    llama.lm_head.__class__ = torch.nn.Linear

    inputs = packed_inputs()
    for bad in (0, -1, 2.0, True, None):
        with pytest.raises(ValueError, match="chunk_tokens"):
            trained_token_logps(llama, inputs, chunk_tokens=bad)


def test_autocast_projects_in_bf16_and_takes_the_log_softmax_in_fp32():
    model = tiny_model("Qwen2ForCausalLM")
    inputs = packed_inputs()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = token_loss_sum(model, inputs)
        logps, _ = trained_token_logps(model, inputs, chunk_tokens=16)
        hidden = final_hidden_states(model, {k: v for k, v in inputs.items() if k != "labels"})
        assert output_head(model).logits(hidden[0, :4]).dtype == torch.bfloat16
    assert logps.dtype == torch.float32 and full.dtype == torch.float32
    assert float(-logps.sum()) == pytest.approx(float(full), rel=1e-3)
    with torch.no_grad():  # not vacuous: bf16 was used, float32 alone gives another sum
        assert float(-logps.sum()) != pytest.approx(float(token_loss_sum(model, inputs)), rel=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # and backward runs under autocast too
        token_loss_sum(model, inputs, chunk_tokens=16).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def saved_for_backward(fn) -> list[int]:
    """Element counts of the tensors autograd saves for backward while ``fn`` runs (a
    checkpointed region's own saves are its: it keeps only its inputs and recomputes)."""
    sizes: list[int] = []

    def pack_hook(tensor):
        sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda tensor: tensor):
        fn().backward()
    return sizes


def test_the_chunked_path_saves_no_tokens_by_vocabulary_tensor():
    vocab, rows, seq_len, chunk = 20_000, 2, 1024, 256
    model = build_model(ModelConfig(name="tiny-llama", attn="sdpa"), vocab_size=vocab, seed=0)
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(3, vocab, size=(rows, seq_len)))
    labels = ids.clone()
    labels[:, 0] = IGNORE_INDEX
    labels[:, 1:64] = IGNORE_INDEX  # a prompt: not projected at all
    inputs = to_model_inputs({"input_ids": ids, "labels": labels,
                              "position_ids": torch.arange(seq_len).repeat(rows, 1)})
    n = num_trained_tokens(inputs)
    assert n > 1900

    full = saved_for_backward(lambda: token_loss_sum(model, inputs))
    chunked = saved_for_backward(lambda: token_loss_sum(model, inputs, chunk_tokens=chunk))
    assert max(full) >= n * vocab  # the full path keeps its N x V log-softmax (not vacuous)
    assert chunked and max(chunked) < chunk * vocab  # the hooks saw the decoder's saves; none N x V
    assert sum(chunked) < sum(full) / 10


def test_the_driver_refuses_a_family_the_head_does_not_know_before_any_worker_starts():
    from transformers import AutoConfig

    from packfeed.trainer.objective.loss_head import check_loss_head

    for family in TINY_FAMILIES:
        check_loss_head(tiny_config(family, 64), chunk_tokens=1024)  # every tiny family is known
    gpt2 = AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2)
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel.forward .*train it with loss_chunk_tokens = 0"):
        check_loss_head(gpt2, chunk_tokens=1024)
    check_loss_head(gpt2, chunk_tokens=0)  # the full logits: any model
