"""Checks of the model before anything starts (trainer/launch/prechecks.py ``context_warning``,
trainer/model/builder.py ``check_model``): rows longer than the model's context are said in one
line (with RoPE scaling named when the config has it); a directory that is not a
save_pretrained one is refused as such, not by transformers' "model_type key" message."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from transformers import LlamaConfig  # noqa: E402

from packfeed.trainer.launch.prechecks import context_warning  # noqa: E402
from packfeed.trainer.model.builder import check_model  # noqa: E402
from packfeed.trainer.run_config import ModelConfig  # noqa: E402


@pytest.mark.parametrize("context", [1024, 131_072])
def test_rows_longer_than_the_context_are_said_in_one_line(context):
    config = LlamaConfig(max_position_embeddings=context)
    for seq_len in (context // 2, context):
        assert context_warning(config, seq_len=seq_len, name="m") is None
    line = context_warning(config, seq_len=2 * context, name="m")
    assert "\n" not in line and f"max_position_embeddings {context:,}" in line and f"{2 * context:,}" in line
    assert "rope_scaling" not in line


def test_rope_scaling_is_named():
    config = LlamaConfig(max_position_embeddings=8192, rope_scaling={"rope_type": "linear", "factor": 4.0})
    assert "rope_scaling 'linear' is set" in context_warning(config, seq_len=16384, name="m")


def test_a_config_without_a_context_says_nothing():
    assert context_warning(object(), seq_len=10**6, name="m") is None


def test_a_directory_without_config_json_is_refused_as_such(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="is a directory without config.json") as error:
        check_model(ModelConfig(name=str(tmp_path)), vocab_size=100)
    assert "model_type" not in str(error.value)


# ---- what a resume changes (prechecks.resume_changes) -------------------------------------------

def _run(**train):
    from packfeed.trainer.run_config import RunConfig

    base = {"max_steps": 40, "warmup_steps": 4, "micro_batch_rows": 2, "grad_accum": 1, "lr": 1e-3}
    scaling = {"num_workers": train.pop("num_workers", 2)}
    return RunConfig.from_dict({"data": {"inputs": ["x.jsonl"], "tokenizer": "t", "seq_len": 64},
                                "model": {"name": "tiny-llama"}, "train": {**base, **train}, "scaling": scaling})


def _state(step, run):
    from packfeed.trainer.state.train_state import TrainState

    return TrainState(step=step, stream={}, config=run.to_dict())


def test_a_resume_of_the_same_run_says_nothing():
    from packfeed.trainer.launch.prechecks import resume_changes

    assert resume_changes(_state(20, _run()), _run()) == []
    assert resume_changes(_state(20, _run()).__class__(step=20, stream={}), _run()) == [], "no config: nothing"


def test_another_world_size_says_the_rows_of_a_step_and_how_to_keep_them():
    from packfeed.trainer.launch.prechecks import resume_changes

    [line] = resume_changes(_state(20, _run()), _run(num_workers=1))
    assert "2 rows a step" in line and "the run had 4" in line and "grad_accum = 2" in line and "\n" not in line
    [line] = resume_changes(_state(20, _run(num_workers=2)), _run(num_workers=3))
    assert "6 rows a step" in line and "to keep" not in line, "4 rows cannot be kept by 3 workers of 2 rows"


def test_another_max_steps_says_the_schedule_is_stretched_again():
    from packfeed.trainer.launch.prechecks import resume_changes
    from packfeed.trainer.loop.optim import lr_factor

    [line] = resume_changes(_state(40 - 5, _run()), _run(max_steps=60))
    assert "max_steps 40 -> 60" in line and "at step 36" in line
    before = lr_factor(35, warmup_steps=4, max_steps=40, min_lr_ratio=0.1) * 1e-3
    after = lr_factor(35, warmup_steps=4, max_steps=60, min_lr_ratio=0.1) * 1e-3
    assert after > before and f"{after:.3g}" in line and f"{before:.3g}" in line
    assert resume_changes(_state(40, _run()), _run(max_steps=40)) == []


@pytest.mark.parametrize("memory", [0, -1, 1e9, 1025, float("inf")])
def test_a_gpu_memory_that_no_gpu_has_is_refused(memory):
    from packfeed.trainer.run_config import TrainScaling

    with pytest.raises(ValueError, match="gpu_memory_gb"):
        TrainScaling(gpu_memory_gb=memory)
    assert TrainScaling(gpu_memory_gb=141).gpu_memory_gb == 141


def test_the_plan_says_when_rows_are_longer_than_the_models_context(tmp_path, capsys):
    from packfeed.service.assets import demo_tokenizer_path
    from packfeed.service.cli import run_command

    config = tmp_path / "run.toml"
    for seq_len, warned in ((1024, False), (2048, True)):  # tiny-llama's context: 1,024
        config.write_text(f'[data]\ninputs = ["nowhere/*.jsonl"]\ntokenizer = "{demo_tokenizer_path()}"\n'
                          f'seq_len = {seq_len}\n[model]\nname = "tiny-llama"\n')
        assert run_command(["train", "--plan", "--config", str(config)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[-1].startswith("fits: yes")
        assert any(line.startswith("WARNING seq_len 2,048 is longer than tiny-llama's context") for line in out) == warned
