"""Checkpoints round-trip weights, optimizer and scheduler, also when the model is sharded."""

import torch
from transformers import AutoModelForCausalLM

from packfeed.trainer.state.checkpoint import load_checkpoint, save_checkpoint
from packfeed.trainer.run_config import TrainConfig
from packfeed.trainer.loop.optim import build_optimizer
from packfeed.trainer.model.tiny import tiny_config


def _model(seed: int):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config("llama", 64), attn_implementation="sdpa")


def test_a_sharded_checkpoint_loads_every_shard(tmp_path, monkeypatch):
    model = _model(0)
    optimizer, scheduler = build_optimizer(model, TrainConfig(max_steps=5, warmup_steps=1))
    # Large models are saved in shards with an index; force that with a tiny shard size.
    save_pretrained = model.save_pretrained
    monkeypatch.setattr(model, "save_pretrained", lambda d: save_pretrained(d, max_shard_size="20KB"))
    save_checkpoint(tmp_path, model=model, optimizer=optimizer, scheduler=scheduler, state={"step": 3})
    assert (tmp_path / "model" / "model.safetensors.index.json").exists(), "the checkpoint must be sharded"

    other = _model(1)
    opt2, sched2 = build_optimizer(other, TrainConfig(max_steps=5, warmup_steps=1))
    assert load_checkpoint(tmp_path, model=other, optimizer=opt2, scheduler=sched2) == {"step": 3}
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
