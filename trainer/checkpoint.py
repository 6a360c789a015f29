"""Checkpoints: model (``save_pretrained``), optimizer, scheduler, step and data position.

Layout of one checkpoint directory::

    model/                 save_pretrained: config.json + model.safetensors
    optimizer.pt           optimizer.state_dict()
    scheduler.pt           scheduler.state_dict()
    trainer_state.json     {"step": completed optimizer steps, "stream": the stream state after it
                           (client StreamState's record: cursor, step, config hash, seq_len),
                           "manifest": window first rows (delivery/manifest.py), "config": the run config}

Ray Train copies the directory to ``<output>/ray/checkpoint_<step>`` (``ray.train.report``);
``latest_checkpoint(output)`` finds the newest one for ``--resume``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

STATE_FILE = "trainer_state.json"
RUN_NAME = "ray"  # Ray Train's run directory under --output
MANIFEST_FILE = "stream_manifest.json"  # first row of every window packed (delivery/manifest.py), under --output
RAY_SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's list of the checkpoints it registered, in RUN_NAME
FINAL_DIR = "final"  # the finished run's model and tokenizer, under --output
# Where the final model is written until it is whole (model, tokenizer, FINAL_STATE): then it is
# renamed to FINAL_DIR, so a final/ that exists is complete.
FINAL_PARTIAL = ".final.partial"
FINAL_STATE = "packfeed_state.json"  # {"step": the steps the final model trained}, in FINAL_DIR


def save_checkpoint(directory: Path, *, model: Any, optimizer: Any, scheduler: Any, state: dict) -> None:
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory / "model")
    torch.save(optimizer.state_dict(), directory / "optimizer.pt")
    torch.save(scheduler.state_dict(), directory / "scheduler.pt")
    (directory / STATE_FILE).write_text(json.dumps(state, indent=1))


def load_checkpoint(directory: Path, *, model: Any, optimizer: Any, scheduler: Any) -> dict:
    """Load weights and optimizer/scheduler state in place; returns the trainer state."""
    import torch
    from safetensors.torch import load_file

    # save_pretrained writes one model.safetensors, or shards listed in an index for large models.
    index = directory / "model" / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    weights = {}
    for name in files:
        weights.update(load_file(str(directory / "model" / name)))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # Tied embeddings are saved once; anything else missing is an error.
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"checkpoint {directory} does not match the model: missing {missing}, unexpected {unexpected}")
    optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))
    scheduler.load_state_dict(torch.load(directory / "scheduler.pt", weights_only=True))
    return read_state(directory)


def read_state(directory: Path) -> dict:
    path = Path(directory) / STATE_FILE
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is damaged ({e}): resume from another checkpoint or pass --overwrite") from None


def latest_checkpoint(output: Path) -> Path | None:
    """The checkpoint a resumed run starts from, or None: the latest one Ray Train registered
    (its snapshot; what ``ray.train.get_checkpoint()`` gives the workers of a new fit), so that
    a checkpoint whose upload was cut short is never picked; without a snapshot, the one with
    the most completed steps."""
    run_dir = Path(output, RUN_NAME)
    if (run_dir / RAY_SNAPSHOT).exists():
        from ray.train import Result

        ray_train = logging.getLogger("ray.train")
        level = ray_train.level
        ray_train.setLevel(logging.WARNING)  # its INFO paragraph on finding a snapshot says nothing here
        try:
            checkpoint = Result.from_path(str(run_dir)).checkpoint
        finally:
            ray_train.setLevel(level)
        return None if checkpoint is None else Path(checkpoint.path)
    best, best_step = None, -1
    for state in Path(output, RUN_NAME).glob(f"checkpoint_*/{STATE_FILE}"):
        step = read_state(state.parent)["step"]
        if step > best_step:
            best, best_step = state.parent, step
    return best
