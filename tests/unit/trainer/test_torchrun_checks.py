"""`--launcher torchrun`'s checks before any rank trains: what only the Ray launcher can do is
refused in one line naming the fix (pure: no process group, no Ray, no file read)."""

from __future__ import annotations

import dataclasses

import pytest

from packfeed.service.data.config import DataConfig
from packfeed.trainer.run_config import ModelConfig, RunConfig, TrainConfig, TrainScaling
from packfeed.trainer.launch.torchrun import distributed_env, refuse_what_needs_ray

RUN = RunConfig(data=DataConfig.from_inputs(["a.jsonl"], tokenizer="tok", seq_len=64), model=ModelConfig(name="tiny-llama"))


@pytest.mark.parametrize("change, server, output, expected", [
    pytest.param({}, None, "runs/x", "trains on packed rows and does not start Ray to pack: pack the data first",
                 id="raw-inputs"),
    pytest.param({"scaling": TrainScaling(trainer_labels={"role": "gpu"})}, "h:1", "runs/x",
                 r"\[scaling\] trainer_labels place Ray Train workers", id="placement"),
    pytest.param({"scaling": TrainScaling(trainer_resources={"slot": 1})}, "h:1", "runs/x",
                 r"\[scaling\] trainer_resources place", id="resources"),
    pytest.param({}, "h:1", "s3://bucket/runs/x", "give a shared filesystem path, not s3://bucket/runs/x",
                 id="object-store-output"),
])
def test_what_needs_ray_is_refused_with_the_fix(change, server, output, expected):
    with pytest.raises(ValueError, match=expected):
        refuse_what_needs_ray(dataclasses.replace(RUN, **change), server=server, output=output)


def test_a_server_needs_no_packed_directory_and_keeps_the_mixture_hook():
    run = dataclasses.replace(RUN, train=TrainConfig(mixture_hook="hooks:weights"))
    assert refuse_what_needs_ray(run, server="packer:50051", output="runs/x") is None


def test_outside_torchrun_the_command_says_how_to_start_it(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="start it with `torchrun --nproc-per-node N --no-python packfeed train"):
        distributed_env()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert distributed_env() == (3, 8, 3)
