"""The ``[lora]`` table (trainer/model/lora.py ``LoraSettings``) and what the memory plan makes of
it: adapter sizes counted from shapes (r x (in + out) per targeted linear), the frozen weights at
the compute dtype's bytes, AdamW states for the adapter only. Offline: the Qwen2.5-7B
config.json fixture on the meta device, no Ray, no weights."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from packfeed.trainer.model.lora import LoraSettings, adapter_parameters
from packfeed.trainer.model.memory_plan import GB, plan_memory
from packfeed.trainer.model.shape import model_shape
from packfeed.trainer.run_config import ModelConfig, RunConfig

ROOT = Path(__file__).resolve().parents[3]
QWEN_7B = ROOT / "examples/models/qwen2.5-7b"
TOKENIZER = ROOT / "service/assets/tokenizer"


@pytest.fixture(scope="module")
def qwen():
    return model_shape(ModelConfig(name=str(QWEN_7B)))


def run_of(lora: dict | None, **train) -> RunConfig:
    """Qwen2.5-7B at 65,536 tokens on ONE 80 GB GPU: fsdp over one worker, full checkpointing."""
    table = {
        "data": {"inputs": ["x.jsonl"], "tokenizer": str(TOKENIZER), "seq_len": 65536},
        "model": {"name": str(QWEN_7B)},
        "train": {"micro_batch_rows": 1, "precision": "bf16", "sharding": "fsdp", "activation_checkpointing": "full",
                  **train},
        "scaling": {"num_workers": 1, "use_gpu": "yes", "gpu_memory_gb": 80},
    }
    if lora is not None:
        table["lora"] = lora
    return RunConfig.from_dict(table)


def test_defaults_round_trip_and_are_absent_without_a_table():
    run = run_of({})
    assert run.lora == LoraSettings() and run.lora.target_modules == "all-linear"
    assert (run.lora.r, run.lora.alpha, run.lora.dropout, run.lora.modules_to_save, run.lora.merge) == \
        (16, 32, 0.0, None, False)
    assert RunConfig.from_dict(run.to_dict()) == run
    listed = run_of({"r": 4, "target_modules": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"], "merge": True})
    assert listed.lora.target_modules == ("q_proj", "v_proj") and RunConfig.from_dict(listed.to_dict()) == listed
    plain = run_of(None)
    assert plain.lora is None and "lora" not in plain.to_dict(), "a run without LoRA writes the dict it always wrote"


@pytest.mark.parametrize("table, match", [
    ({"r": 0}, r"\[lora\] r must be an integer >= 1, got 0"),
    ({"r": True}, r"\[lora\] r must be an integer"),
    ({"alpha": 0}, r"\[lora\] alpha must be > 0"),
    ({"dropout": 1.0}, r"\[lora\] dropout must be in \[0, 1\)"),
    ({"target_modules": "q_proj"}, r"\[lora\] target_modules must be a non-empty list of module names or \"all-linear\""),
    ({"target_modules": []}, r"\[lora\] target_modules must be a non-empty list"),
    ({"modules_to_save": "lm_head"}, r"\[lora\] modules_to_save must be a non-empty list of module names, got"),
    ({"merge": "yes"}, r"\[lora\] merge must be true or false"),
    ({"rank": 8}, r"unknown \[lora\] keys"),
])
def test_the_table_rejects(table, match):
    with pytest.raises(ValueError, match=match):
        run_of(table)


def test_adapter_parameters_are_r_times_in_plus_out_per_targeted_linear(qwen):
    # one layer: q 3584->3584, k and v 3584->512, o 3584->3584, gate and up 3584->18944, down 18944->3584
    per_layer = (3584 + 3584) + 2 * (3584 + 512) + (3584 + 3584) + 2 * (3584 + 18944) + (18944 + 3584)
    assert adapter_parameters(qwen.linears, LoraSettings(), vocab=qwen.vocab, hidden=qwen.hidden) == \
        16 * per_layer * 28 == 40_370_176
    attention = LoraSettings(r=8, target_modules=("q_proj", "v_proj"))
    assert adapter_parameters(qwen.linears, attention, vocab=qwen.vocab, hidden=qwen.hidden) == \
        8 * ((3584 + 3584) + (3584 + 512)) * 28
    head = LoraSettings(r=8, target_modules=("q_proj",), modules_to_save=("lm_head",))
    assert adapter_parameters(qwen.linears, head, vocab=qwen.vocab, hidden=qwen.hidden) == \
        8 * (3584 + 3584) * 28 + 152_064 * 3584


def test_qwen_7b_at_64k_with_lora_fits_one_80gb_gpu_where_full_weights_do_not(qwen):
    full = plan_memory(run_of(None), shape=qwen)
    lora = plan_memory(run_of({}), shape=qwen)
    assert not full.fits and full.verdict.startswith("fits: no:")
    assert lora.fits and lora.verdict.startswith("fits: yes: estimated peak"), lora.format()
    terms = dict(lora.terms)
    assert terms["frozen weights"] == 2 * qwen.num_params  # bf16, one worker
    assert terms["LoRA adapter states"] == 16 * 40_370_176  # fp32 weight, gradient, two AdamW moments
    assert "sharded states" not in terms and "40.4M trained parameters" in lora.format()
    assert full.total_bytes - lora.total_bytes > 100 * GB, "the full weights' 16 B/param are 122 GB of one GPU"
    assert lora.total_bytes < 0.45 * full.total_bytes


def test_lora_changes_only_the_weight_terms_and_its_dpo_needs_no_second_model(qwen):
    fp32 = plan_memory(run_of({}, precision="fp32"), shape=qwen)
    assert dict(fp32.terms)["frozen weights"] == 4 * qwen.num_params
    bf16, full = plan_memory(run_of({}), shape=qwen), plan_memory(run_of(None), shape=qwen)
    same = ("checkpointed layer inputs", "one layer's recompute", "gathered parameters", "loss chunk")
    assert [dict(bf16.terms)[t] for t in same] == [dict(full.terms)[t] for t in same]
    dpo = plan_memory(run_of({}, objective="dpo"), shape=qwen)
    assert "DPO reference weights" not in dict(dpo.terms), "the reference is the model with its adapter disabled"
    halves = plan_memory(dataclasses.replace(run_of({}), scaling=dataclasses.replace(run_of({}).scaling, num_workers=2)),
                      shape=qwen)
    assert dict(halves.terms)["frozen weights"] == qwen.num_params  # fsdp over 2: half each
    with pytest.raises(ValueError, match=r"\[lora\] target_modules \['qkv'\] match no linear layer.*q_proj"):
        plan_memory(run_of({"target_modules": ["qkv"]}), shape=qwen)


def test_the_wrapped_model_starts_as_the_base_frozen_in_the_compute_dtype():
    """``apply_lora``: the same adapter from the same seed, only the adapter (and modules_to_save)
    trained and in fp32, the frozen weights cast; at step 0 the logits are the base's (lora_B 0),
    and the chunked loss head reads the trained lm_head copy through the wrapper."""
    import torch

    from packfeed.trainer.model.builder import build_model
    from packfeed.trainer.model.lora import apply_lora
    from packfeed.trainer.objective.loss_head import output_head

    def wrapped(lora: LoraSettings, dtype=None):
        model = build_model(ModelConfig(name="tiny-llama", attn="sdpa"), vocab_size=96, seed=3)
        return apply_lora(model, lora, seed=3, frozen_dtype=dtype)

    lora = LoraSettings(r=4, modules_to_save=("lm_head",))
    a, b = wrapped(lora), wrapped(lora)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    trained = {n for n, p in a.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n or "modules_to_save" in n for n in trained)
    cast = wrapped(lora, torch.bfloat16)
    assert {p.dtype for n, p in cast.named_parameters() if n in trained} == {torch.float32}
    assert {p.dtype for n, p in cast.named_parameters() if n not in trained} == {torch.bfloat16}
    ids = torch.arange(20).reshape(1, 20)
    base = build_model(ModelConfig(name="tiny-llama", attn="sdpa"), vocab_size=96, seed=3)
    with torch.no_grad():
        assert torch.equal(a(input_ids=ids, use_cache=False).logits, base(input_ids=ids, use_cache=False).logits)
    head = a.get_base_model().lm_head
    assert output_head(a).weight is head.modules_to_save["default"].weight
    with a.disable_adapter():
        assert output_head(a).weight is head.original_module.weight


def test_packfeed_train_reads_the_lora_table_of_its_config_file(tmp_path):
    from packfeed.trainer.launch.command import run_config_from_args

    config = tmp_path / "run.toml"
    config.write_text(f'[data]\ninputs = ["x.jsonl"]\ntokenizer = "{TOKENIZER}"\nseq_len = 256\n'
                      '[model]\nname = "tiny-llama"\n[lora]\nr = 4\nmerge = true\n')
    args = argparse.ArgumentParser()
    from packfeed.trainer.launch.command import add_arguments

    add_arguments(args)
    run = run_config_from_args(args.parse_args(["--config", str(config)]))
    assert run.lora == LoraSettings(r=4, merge=True)
    config.write_text(config.read_text().replace("[lora]\nr = 4\nmerge = true\n", ""))
    assert run_config_from_args(args.parse_args(["--config", str(config)])).lora is None
