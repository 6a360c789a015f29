"""The memory plan (trainer/model/memory_plan.py): the public 7B-at-64k arithmetic, advice that works
when applied, and invariants of the estimate over a sweep of layouts. Offline: config.json
fixtures in examples/models, models on the meta device, no Ray."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import time
import types
from itertools import product
from pathlib import Path

import pytest

from packfeed.trainer.run_config import ModelConfig, RunConfig, TrainConfig, TrainScaling
from packfeed.trainer.model.memory_plan import (
    GB,
    HOST_SOURCE,
    Layout,
    advise,
    check_memory_plan,
    plan_memory,
    total_bytes,
)
from packfeed.trainer.model.shape import model_shape
from packfeed.trainer.model.tiny import TINY_FAMILIES, tiny_config

ROOT = Path(__file__).resolve().parents[3]
QWEN_7B = ROOT / "examples/models/qwen2.5-7b"
NEMO_12B = ROOT / "examples/models/mistral-nemo-12b"
CONFIG_7B_64K = ROOT / "examples/train_7b_64k.toml"
TOKENIZER = ROOT / "service/assets/tokenizer"


@pytest.fixture(scope="module")
def qwen():
    return model_shape(ModelConfig(name=str(QWEN_7B)))


@pytest.fixture(scope="module")
def nemo():
    return model_shape(ModelConfig(name=str(NEMO_12B)))


def run_7b(*flags: str) -> RunConfig:
    """examples/train_7b_64k.toml with command-line flags, as `packfeed train` reads them."""
    from packfeed.service.cli import main  # noqa: F401  (the train subcommand is registered)
    from packfeed.trainer.launch.command import add_arguments, run_config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return run_config_from_args(parser.parse_args(["--config", str(CONFIG_7B_64K), "--model", str(QWEN_7B), *flags]))


def advice_flags(verdict: str) -> list[str]:
    """"fits: no: ...; try --sharding fsdp --num-workers 9" -> ["--sharding", "fsdp", ...]."""
    assert verdict.startswith("fits: no: ") and "; try --" in verdict, verdict
    return verdict.split("; try ", 1)[1].split()


def within(value: float, low: float, high: float, rel: float = 0.15) -> bool:
    return low * (1 - rel) <= value <= high * (1 + rel)


def test_qwen_7b_parameters_are_counted_exactly(qwen):
    # 28 layers x 233,057,792 + embeddings and lm_head 2 x 152,064 x 3,584 + final norm 3,584
    assert (qwen.num_params, qwen.num_layer_params, qwen.num_root_params) == (7_615_616_512, 233_057_792,
                                                                               1_089_998_336)
    assert (qwen.hidden, qwen.num_layers, qwen.intermediate, qwen.kv_dim, qwen.vocab) == (3584, 28, 18944, 512, 152064)


def test_qwen_7b_at_64k_on_8x80gb_fits_as_the_public_arithmetic_says(qwen):
    plan = plan_memory(run_7b(), shape=qwen)
    terms = {name: size / GB for name, size in plan.terms}
    # ~15 GB sharded states + ~13 GB checkpointed inputs + ~14 GB one layer's recompute + ~2-3 GB
    # gathered parameters = ~51 GB, each within 15% of its public figure
    assert within(terms["sharded states"], 15, 15) and within(terms["checkpointed layer inputs"], 13, 13)
    assert within(terms["one layer's recompute"], 14, 14) and within(terms["gathered parameters"], 2, 3)
    assert within(plan.total_bytes / GB, 51, 51)
    assert (plan.fits, plan.on_gpu, plan.layout.bf16, plan.gpu_memory_bytes) == (True, True, True, 80 * GB)
    assert plan.gpu_memory_source == "[scaling] gpu_memory_gb"
    assert plan.total_bytes == sum(size for _, size in plan.terms)
    lines = plan.format().splitlines()
    assert lines[-1] == f"fits: yes: estimated peak {plan.total_bytes / GB:.1f} GB of 80.0 GB per GPU"
    assert [line for line in lines if line.startswith("fits:")] == lines[-1:]


@pytest.mark.parametrize("flags, term, low, high, advice", [
    pytest.param(["--activation-checkpointing", "off"], "activations (no checkpointing)", 390, 390,
                 ["--activation-checkpointing", "full"], id="no-checkpointing-390gb"),
    pytest.param(["--loss-chunk-tokens", "0"], "logits (not chunked)", 80, 100,
                 ["--loss-chunk-tokens", "1024"], id="full-logits-80gb-and-more"),
    pytest.param(["--sharding", "ddp"], "model states (not sharded)", 122, 122,
                 ["--sharding", "fsdp"], id="ddp-16B-x-7.6B-122gb"),
])
def test_qwen_7b_at_64k_does_not_fit_and_the_named_change_makes_it_fit(qwen, flags, term, low, high, advice):
    plan = plan_memory(run_7b(*flags), shape=qwen)
    assert not plan.fits and within(dict(plan.terms)[term] / GB, low, high)
    assert plan.format().splitlines()[-1] == plan.verdict
    assert advice_flags(plan.verdict) == advice
    assert plan_memory(run_7b(*flags, *advice), shape=qwen).fits


def test_every_advice_fits_when_applied(qwen):
    # the sweep of layouts that do not fit 80 GB: each advice is a set of flags which, applied,
    # fits; where nothing would fit, the advice says so and names no flags
    fields = {"--sharding": "sharding", "--activation-checkpointing": "activation_checkpointing",
              "--loss-chunk-tokens": "loss_chunk_tokens", "--micro-batch-rows": "micro_batch_rows",
              "--grad-accum": "grad_accum", "--num-workers": "num_workers"}
    memory, tried, named = 80 * GB, 0, set()
    for sharding, checkpointing, chunk, rows, seq_len, workers in product(
            ("ddp", "fsdp"), ("off", "full", "offload"), (0, 1024), (1, 4), (8192, 65536, 1 << 20), (1, 8)):
        layout = Layout(sharding=sharding, activation_checkpointing=checkpointing, loss_chunk_tokens=chunk,
                        micro_batch_rows=rows, grad_accum=2, seq_len=seq_len, num_workers=workers, bf16=True)
        if total_bytes(qwen, layout) <= memory:
            continue
        tried += 1
        advice = advise(qwen, layout, memory)
        if not advice.startswith("try "):
            assert "lower seq_len" in advice
            continue
        flags = advice[len("try "):].split()
        changes = {fields[flag]: (value if fields[flag] in ("sharding", "activation_checkpointing") else int(value))
                   for flag, value in zip(flags[::2], flags[1::2])}
        named |= set(changes)
        fixed = dataclasses.replace(layout, **changes)
        assert total_bytes(qwen, fixed) <= memory, (layout, advice)
        assert fixed.micro_batch_rows * fixed.grad_accum == layout.micro_batch_rows * layout.grad_accum
    assert tried > 50 and named == set(fields.values())  # every kind of change was advised somewhere


def test_mistral_nemo_12b_estimates_higher_than_qwen_7b(qwen, nemo):
    assert nemo.num_params == pytest.approx(12.25e9, rel=0.01) and nemo.kv_dim == 8 * 128
    for flags in ([], ["--activation-checkpointing", "off"], ["--sharding", "ddp"], ["--loss-chunk-tokens", "0"],
                  ["--seq-len", "8192", "--num-workers", "2"]):
        run = run_7b(*flags)
        assert plan_memory(run, shape=nemo).total_bytes > plan_memory(run, shape=qwen).total_bytes, flags


def tiny_shapes():
    return [model_shape(tiny_config(family, 128)) for family in TINY_FAMILIES]


def test_parameters_of_the_meta_model_are_the_real_models_for_every_tiny_family():
    from transformers import AutoModelForCausalLM

    for family, shape in zip(TINY_FAMILIES, tiny_shapes()):
        real = AutoModelForCausalLM.from_config(tiny_config(family, 128))
        assert shape.num_params == sum(p.numel() for p in real.parameters()), family
        assert shape.num_params == shape.num_root_params + shape.num_layers * shape.num_layer_params, family
    tied, untied = (model_shape(tiny_config("llama", 128, tie_word_embeddings=tie)) for tie in (True, False))
    assert untied.num_root_params - tied.num_root_params == 128 * 64  # a tied lm_head is counted once


def test_invariants_over_a_sweep(qwen):
    # sharding x checkpointing x chunk x world 1..8 x seq_len x rows x precision, tiny models and 7B:
    # more workers never cost (fsdp); longer rows or more rows never save; ddp >= fsdp (2+ workers,
    # or bf16: a single worker has no DDP buckets, and fp32 fsdp still gathers whole layers);
    # full <= off (2+ layers); offload <= full; a loss chunk <= full logits (a micro-batch of 2+ chunks)
    checks = dict.fromkeys(("world", "seq_len", "rows", "ddp", "full", "offload", "chunk"), 0)
    strict = dict.fromkeys(checks, 0)

    def check(name, small, large):
        assert small <= large, name
        checks[name] += 1
        strict[name] += small < large

    for shape in [qwen, *tiny_shapes()]:
        for sharding, ckpt, chunk, world, seq_len, rows, bf16 in product(
                ("ddp", "fsdp"), ("off", "full", "offload"), (0, 256), range(1, 9), (128, 512, 4096), (1, 2),
                (True, False)):
            lay = Layout(sharding=sharding, activation_checkpointing=ckpt, loss_chunk_tokens=chunk,
                         micro_batch_rows=rows, grad_accum=1, seq_len=seq_len, num_workers=world, bf16=bf16)
            total = total_bytes(shape, lay)
            if sharding == "fsdp":
                check("world", total_bytes(shape, dataclasses.replace(lay, num_workers=world + 1)), total)
                if world > 1 or bf16:
                    check("ddp", total, total_bytes(shape, dataclasses.replace(lay, sharding="ddp")))
            check("seq_len", total, total_bytes(shape, dataclasses.replace(lay, seq_len=2 * seq_len)))
            check("rows", total, total_bytes(shape, dataclasses.replace(lay, micro_batch_rows=rows + 1)))
            if ckpt == "full":
                check("offload", total_bytes(shape, dataclasses.replace(lay, activation_checkpointing="offload")), total)
                if shape.num_layers >= 2:
                    check("full", total, total_bytes(shape, dataclasses.replace(lay, activation_checkpointing="off")))
            if chunk and lay.tokens >= 2 * chunk:  # one chunk of the whole micro-batch keeps 3 fp32 copies
                check("chunk", total, total_bytes(shape, dataclasses.replace(lay, loss_chunk_tokens=0)))
    assert min(checks.values()) > 100 and min(strict.values()) > 10, (checks, strict)  # not vacuous


def small_run(**scaling) -> RunConfig:
    from packfeed.service.data.config import DataConfig

    data = DataConfig.from_dict({"inputs": ["nowhere/*.jsonl"], "tokenizer": str(TOKENIZER), "seq_len": 4096})
    return RunConfig(data=data, model=ModelConfig(name="tiny-llama"), train=TrainConfig(micro_batch_rows=1),
                     scaling=TrainScaling(**scaling))


def test_the_memory_compared_with_and_the_precision(qwen, monkeypatch):
    import psutil

    from packfeed.trainer.model import memory_plan

    monkeypatch.setattr(memory_plan, "detect_gpu", lambda: None)
    cpu = plan_memory(small_run(use_gpu="no", num_workers=2), shape=qwen)
    assert (cpu.on_gpu, cpu.layout.bf16, cpu.gpu_memory_source) == (False, False, HOST_SOURCE)
    assert cpu.gpu_memory_bytes == psutil.virtual_memory().total // 2 and cpu.verdict.endswith("per worker; " + cpu.advice)
    assert plan_memory(small_run(), shape=qwen).gpu_memory_source == HOST_SOURCE  # auto, no GPU: a CPU run
    detected = plan_memory(small_run(), shape=qwen, gpu_memory_gb=141.0, device_name="NVIDIA H200")
    assert (detected.on_gpu, detected.layout.bf16, detected.gpu_memory_bytes) == (True, True, 141 * GB)
    assert detected.gpu_memory_source == "detected: NVIDIA H200"
    given = plan_memory(small_run(gpu_memory_gb=40), shape=qwen, gpu_memory_gb=141.0, device_name="NVIDIA H200")
    assert (given.gpu_memory_bytes, given.gpu_memory_source) == (40 * GB, "[scaling] gpu_memory_gb")
    assumed = plan_memory(small_run(use_gpu="yes"), shape=qwen)
    assert assumed.on_gpu and assumed.gpu_memory_bytes == 80 * GB and assumed.gpu_memory_source.startswith("assumed")


def test_dpo_adds_its_frozen_reference_and_takes_the_whole_logits(qwen):
    run = small_run(num_workers=8, gpu_memory_gb=80)  # ddp: the reference is whole on every worker
    sft = plan_memory(run, shape=qwen)
    dpo = plan_memory(dataclasses.replace(run, train=TrainConfig(micro_batch_rows=1, objective="dpo")), shape=qwen)
    assert "loss chunk" in dict(sft.terms) and "DPO reference weights" not in dict(sft.terms)
    terms = dict(dpo.terms)
    assert terms["DPO reference weights"] == 4 * qwen.num_params and "loss chunk" in terms
    assert dpo.total_bytes > sft.total_bytes


def test_a_tiny_model_is_planned_with_the_tokenizers_vocabulary_and_checked():
    plan = check_memory_plan(small_run(use_gpu="no"), no_memory_check=False)
    assert plan.fits and plan.shape.vocab == 882 and plan.shape.num_layers == 2
    tight = small_run(gpu_memory_gb=0.5)  # below the fixed 1 GB of overhead
    with pytest.raises(ValueError, match=r"fits: no: estimated peak 1\.0 GB of 0\.5 GB per GPU"):
        check_memory_plan(tight, no_memory_check=False)
    assert not check_memory_plan(tight, no_memory_check=True).fits


def plan_command(*argv: str) -> tuple[subprocess.CompletedProcess, float]:
    """`packfeed train --plan ...` in a fresh interpreter, which says on stderr whether Ray was imported."""
    code = ("import sys; from packfeed.service.cli import run_command; code = run_command(sys.argv[1:]); "
            "print('ray imported:', 'ray' in sys.modules, file=sys.stderr); sys.exit(code)")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code, "train", "--plan", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    return done, time.monotonic() - start


def test_the_plan_command_starts_nothing_and_exits_0_when_it_fits_2_when_not(tmp_path, capsys):
    done, seconds = plan_command("--config", str(CONFIG_7B_64K))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("fits: yes: estimated peak 50.")
    assert "sharded states" in done.stdout and "ray imported: False" in done.stderr
    assert seconds < 60  # ~3 s: a config and a meta model, no Ray
    # the other verdicts in this process (the subprocess above proved what the command imports)
    from packfeed.service.cli import run_command

    assert run_command(["train", "--plan", "--config", str(CONFIG_7B_64K), "--activation-checkpointing", "off"]) == 2
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("fits: no: ") and last.endswith("; try --activation-checkpointing full"), last
    # inputs and tokenizer that do not exist: the plan reads neither (a pretrained model)
    config = tmp_path / "run.toml"
    config.write_text(f'[data]\ninputs = ["nowhere/*.jsonl"]\ntokenizer = "no-tokenizer"\nseq_len = 4096\n'
                      f'[model]\nname = "{NEMO_12B}"\n[scaling]\nnum_workers = 8\ngpu_memory_gb = 80\n'
                      '[train]\nsharding = "fsdp"\nmicro_batch_rows = 1\n')
    assert run_command(["train", "--plan", "--config", str(config)]) == 0
    done = types.SimpleNamespace(stdout=capsys.readouterr().out)
    assert done.stdout.splitlines()[-1].startswith("fits: yes")
