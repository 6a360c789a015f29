"""Training config: validated at construction with actionable errors; schedule golden values."""

from __future__ import annotations

import argparse

import pytest

from packfeed.trainer.run_config import ModelConfig, RunConfig, TrainConfig, TrainScaling
from packfeed.trainer.loop.optim import lr_factor


@pytest.mark.parametrize(
    "kwargs,match",
    [
        pytest.param({"max_steps": 0}, "max_steps must be an integer >= 1", id="zero-steps"),
        pytest.param({"lr": 0.0}, "lr must be > 0", id="zero-lr"),
        pytest.param({"precision": "fp16"}, "precision must be one of", id="bad-precision"),
        pytest.param({"betas": (0.9,)}, "betas must be two numbers", id="one-beta"),
        pytest.param({"grad_accum": 1.5}, "grad_accum must be an integer", id="fractional-accum"),
        pytest.param({"feeder_buffer_rows": 64}, "feeder_buffer_rows must be 0 .automatic. or >= 128",
                     id="feeder-buffer-below-the-hub's-least"),
        pytest.param({"balance": "tokens"}, "balance must be one of off, compute; got 'tokens'", id="bad-balance"),
    ],
)
def test_train_config_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_model_and_scaling_reject():
    with pytest.raises(ValueError, match="attn must be one of"):
        ModelConfig(name="tiny-llama", attn="flash")
    with pytest.raises(ValueError, match="overrides apply to tiny"):
        ModelConfig(name="Qwen/Qwen3-0.6B", overrides={"hidden_size": 8})
    with pytest.raises(ValueError, match="cpus_per_worker"):
        TrainScaling(cpus_per_worker=0)
    with pytest.raises(ValueError, match=r"unknown tiny model 'tiny-lama' \(did you mean 'tiny-llama'\?\): choose "
                                         "tiny-<family> with family one of llama, qwen2"):
        ModelConfig(name="tiny-lama")
    with pytest.raises(ValueError, match=r"unknown tiny model 'tiny-bert': choose"):  # nothing close: no guess
        ModelConfig(name="tiny-bert")
    with pytest.raises(ValueError, match=r"use_gpu must be auto, yes or no \(or true / false\); got 1"):
        TrainScaling(use_gpu=1)


def test_use_gpu_takes_toml_booleans_as_yes_and_no():
    """`use_gpu = true` (a TOML boolean) was refused: "must be auto, yes or no"."""
    import tomllib

    for text, expected in (("true", "yes"), ("false", "no"), ('"yes"', "yes"), ('"auto"', "auto")):
        table = tomllib.loads(f"[scaling]\nuse_gpu = {text}\n")["scaling"]
        run = RunConfig.from_dict({"data": {"inputs": ["a.jsonl"], "tokenizer": "tok", "seq_len": 64},
                                   "model": {"name": "tiny-llama"}, "scaling": table})
        assert run.scaling.use_gpu == expected and RunConfig.from_dict(run.to_dict()) == run


def test_the_model_is_checked_on_the_driver(tmp_path):
    """A model name that loads nothing failed in every Ray Train worker, after Ray started."""
    from packfeed.trainer.model.builder import check_model
    from packfeed.trainer.model.tiny import tiny_config

    check_model(ModelConfig(name="tiny-llama"), vocab_size=100)
    with pytest.raises(ValueError, match="vocab_size must be >= 3"):
        check_model(ModelConfig(name="tiny-llama"), vocab_size=2)
    missing = tmp_path / "models" / "mine"
    with pytest.raises(ValueError, match=f"model '{missing}' does not exist: give a local save_pretrained directory"):
        check_model(ModelConfig(name=str(missing)), vocab_size=100)
    with pytest.raises(ValueError, match=r"model './tiny_llama' does not exist \(did you mean 'tiny-llama'\?\)"):
        check_model(ModelConfig(name="./tiny_llama"), vocab_size=100)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"model '{empty}' is a directory without config.json"):
        check_model(ModelConfig(name=str(empty)), vocab_size=100)
    saved = tmp_path / "small"
    tiny_config("llama", 64).save_pretrained(saved)  # config.json only: no weights are read
    check_model(ModelConfig(name=str(saved)), vocab_size=64)
    with pytest.raises(ValueError, match="the tokenizer has 65 tokens but .* embeds only 64"):
        check_model(ModelConfig(name=str(saved)), vocab_size=65)


def test_the_feeder_buffer_holds_two_steps_or_is_automatic():
    data = {"inputs": ["a.jsonl"], "tokenizer": "tok", "seq_len": 64}

    def run(**train) -> RunConfig:  # 2 workers x 2 micro-batches x 64 rows: steps of 256 rows
        return RunConfig.from_dict({"data": data, "model": {"name": "tiny-llama"},
                                    "train": {"micro_batch_rows": 64, "grad_accum": 2, **train}})

    assert run().feeder_buffer_rows == 2048 and run(grad_accum=16).feeder_buffer_rows == 4 * 2 * 16 * 64
    assert run(feeder_buffer_rows=512).feeder_buffer_rows == 512
    with pytest.raises(ValueError, match="feeder_buffer_rows 511 holds less than two steps of 256 rows"):
        run(feeder_buffer_rows=511)


def test_run_config_round_trip_and_unknown_keys():
    d = {
        "data": {"inputs": ["a.jsonl"], "tokenizer": "tok", "seq_len": 64},
        "model": {"name": "tiny-qwen3", "overrides": {"hidden_size": 32}},
        "train": {"max_steps": 7, "stop_at_step": 3, "balance": "compute"},
    }
    run = RunConfig.from_dict(d)
    assert run.train.last_step == 3 and run.scaling == TrainScaling() and run.train.balance == "compute"
    assert RunConfig.from_dict(run.to_dict()) == run
    with pytest.raises(ValueError, match=r"unknown \[train\] keys \['max_step'\]"):
        RunConfig.from_dict({**d, "train": {"max_step": 7}})
    with pytest.raises(ValueError, match="needs a \\[model\\] table"):
        RunConfig.from_dict({"data": d["data"]})


def test_lr_schedule_golden():
    # warmup 2, max_steps 6, min ratio 0.1 (the worked example of optim.py)
    got = [lr_factor(s, warmup_steps=2, max_steps=6, min_lr_ratio=0.1) for s in range(7)]
    assert got == pytest.approx([0.5, 1.0, 1.0, 0.86820, 0.55, 0.23180, 0.1], abs=1e-5)


def test_cli_flags_override_the_config_file(tmp_path):
    from packfeed.service.cli import main  # noqa: F401  (the train subcommand is registered)
    from packfeed.trainer.launch.command import add_arguments, run_config_from_args

    config = tmp_path / "train.toml"
    config.write_text(
        '[data]\ninputs = ["a.jsonl"]\ntokenizer = "tok"\nseq_len = 64\n'
        '[model]\nname = "tiny-llama"\noverrides = { hidden_size = 32 }\n'
        "[train]\nmax_steps = 50\n[scaling]\nnum_workers = 2\n"
    )
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    run = run_config_from_args(parser.parse_args(["--config", str(config), "--max-steps", "5", "--num-workers", "1",
                                                  "--seq-len", "128"]))
    assert (run.train.max_steps, run.scaling.num_workers, run.data.seq_len) == (5, 1, 128)
    assert run.model.overrides == {"hidden_size": 32}
    run = run_config_from_args(parser.parse_args(["--config", str(config), "--model", "tiny-qwen3"]))
    assert run.model.name == "tiny-qwen3" and run.model.overrides == {}


def test_a_packed_directory_must_fit_the_run():
    from types import SimpleNamespace

    from packfeed.trainer.state.resume import check_packed_dir

    info = {"config": {"data": {"seq_len": 512}, "tokenizer": {"name": "t", "vocab_size": 100, "pad_id": 0}}}
    tok = SimpleNamespace(name="t", vocab_size=100, pad_id=0)
    check_packed_dir("p", info, 512, tok)
    with pytest.raises(ValueError, match="holds rows of 512 tokens, the run's seq_len is 256"):
        check_packed_dir("p", info, 256, tok)
    with pytest.raises(ValueError, match="packed with tokenizer 't'.*use the same tokenizer"):
        check_packed_dir("p", info, 512, SimpleNamespace(name="u", vocab_size=200, pad_id=0))


def test_resume_auto_resumes_when_it_can_and_starts_otherwise(tmp_path):
    import json

    from packfeed.trainer.state.checkpoint import STATE_FILE
    from packfeed.trainer.state.resume import prepare_output
    from packfeed.trainer.state.run_dir import RunDir

    RUN_NAME = RunDir.RAY
    out = tmp_path / "run"
    assert prepare_output(out, resume="auto", overwrite=False) == (None, None)  # nothing there: start
    (out / RUN_NAME).mkdir(parents=True)
    (out / "metrics.jsonl").write_text("{}\n")  # an attempt that died before its first checkpoint
    with pytest.raises(ValueError, match="no checkpoint under .*pass --overwrite \\(or --resume auto\\)"):
        prepare_output(out, resume="yes", overwrite=False)
    found, clear = prepare_output(out, resume="auto", overwrite=False)
    assert found is None and (out / "metrics.jsonl").exists(), "nothing is removed before every check passed"
    clear()
    assert not (out / "metrics.jsonl").exists(), "its leftovers are cleared"
    ckpt = out / RUN_NAME / "checkpoint_000003"
    ckpt.mkdir(parents=True)
    (ckpt / STATE_FILE).write_text(json.dumps({"step": 3}))
    assert prepare_output(out, resume="auto", overwrite=False) == (ckpt, None)
    assert prepare_output(out, resume="yes", overwrite=False) == (ckpt, None)
    with pytest.raises(ValueError, match="already holds a training run"):
        prepare_output(out, resume=False, overwrite=False)
    (ckpt / STATE_FILE).write_text("")  # cut short
    with pytest.raises(ValueError, match="trainer_state.json is damaged"):
        prepare_output(out, resume="yes", overwrite=False)


@pytest.mark.parametrize(("table", "value", "match"), [
    ("train", {"lr": "3e-4"}, "lr must be a finite number, got '3e-4'"),
    ("train", {"grad_clip": float("nan")}, "grad_clip must be a finite number"),
    ("train", {"betas": 0.9}, "betas must be two numbers"),
    ("train", {"betas": ["0.9", "0.95"]}, "betas must be a finite number"),
    ("scaling", {"cpus_per_worker": "1"}, "cpus_per_worker must be a finite number"),
    ("model", {"name": "tiny-llama", "overrides": 5}, "overrides must be a table"),
    ("model", {"name": 123}, "model name must be"),
])
def test_wrong_types_in_the_train_config_are_named(table, value, match):
    """They were TypeError/AttributeError tracebacks (or accepted, and failed in the workers)."""
    cls = {"train": TrainConfig, "scaling": TrainScaling, "model": ModelConfig}[table]
    with pytest.raises(ValueError, match=match):
        cls(**value)


def test_a_checkpoint_of_another_stream_or_model_is_refused_before_ray():
    from types import SimpleNamespace

    from packfeed.service.data.config import DataConfig
    from packfeed.trainer.state.resume import check_resume
    from packfeed.trainer.state.train_state import TrainState

    run = RunConfig(data=DataConfig.from_inputs(["a.jsonl"], tokenizer="tok", seq_len=64), model=ModelConfig(name="tiny-llama"))
    h = run.data.config_hash()
    plan = SimpleNamespace(fingerprint=lambda: "f1")
    stream = {"version": 1, "config_hash": h, "seq_len": 64}  # a checkpoint's StreamState record
    good = {"step": 3, "stream": stream, "manifest": {"key": f"{h}-f1"}, "config": run.to_dict()}
    check_resume(TrainState.from_dict(good), run, packed=None, plan=plan)
    for state, match in (
        ({**good, "stream": {**stream, "config_hash": "other"}}, "trained on data config other"),
        ({**good, "stream": {**stream, "seq_len": 128}}, "rows of 128 tokens"),
        ({**good, "manifest": {"key": f"{h}-f0"}}, "the input files changed"),
        ({**good, "config": {**good["config"], "model": {**good["config"]["model"], "name": "tiny-qwen3"}}},
         "model name 'tiny-qwen3'"),
    ):
        with pytest.raises(ValueError, match=match):
            check_resume(TrainState.from_dict(state), run, packed=None, plan=plan)
