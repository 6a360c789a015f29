"""Checkpoints: model (``save_pretrained``), optimizer, scheduler, step and data position.

Layout of one checkpoint directory::

    model/                 save_pretrained: config.json + model.safetensors
    optimizer.pt           optimizer.state_dict()
    scheduler.pt           scheduler.state_dict()
    trainer_state.json     {"step": completed optimizer steps, "stream": the stream state after it
                           (client StreamState's record: cursor, step, config hash, seq_len),
                           "manifest": window first rows (delivery/manifest.py), "config": the run config}

Ray Train copies the directory to ``<output>/ray/checkpoint_<step>`` (``ray.train.report``),
``<output>`` a local directory or a URI (``s3://bucket/runs/x``: Ray Train uploads it there);
``latest_checkpoint(output)`` finds the newest one for ``--resume``, and ``local_copy`` brings
one on a store to a local directory to load.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import tempfile
from pathlib import Path
from typing import Any, Iterator

from packfeed.service import storage
from packfeed.service.storage.errors import classify

STATE_FILE = "trainer_state.json"
RUN_NAME = "ray"  # Ray Train's run directory under --output
MANIFEST_FILE = "stream_manifest.json"  # first row of every window packed (delivery/manifest.py), under --output
RAY_SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's list of the checkpoints it registered, in RUN_NAME
FINAL_DIR = "final"  # the finished run's model and tokenizer, under --output
# Where the final model is written until it is whole (model, tokenizer, FINAL_STATE): then it is
# renamed to FINAL_DIR, so a final/ that exists is complete.
FINAL_PARTIAL = ".final.partial"
FINAL_STATE = "packfeed_state.json"  # {"step": the steps the final model trained}, in FINAL_DIR
SCAN_CACHE = "scan.npz"  # the inputs' scan manifest (inputs/scan_cache.py), under --output


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


def read_state(directory: str | Path) -> dict:
    """The trainer state of the checkpoint ``directory`` (a path or a URI)."""
    from packfeed.trainer.run_dir import read_text

    path = storage.join(os.fspath(directory), STATE_FILE)
    try:
        text = read_text(path)
        if text is None:
            raise ValueError("it does not exist")
        return json.loads(text)
    except storage.StorageError:
        raise  # the store failed: its own line
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError too
        raise ValueError(f"{storage.display(path)} is damaged ({e}): resume from another checkpoint or pass "
                         "--overwrite") from None


def latest_checkpoint(output: str | Path) -> str | Path | None:
    """The checkpoint a resumed run starts from (a Path, or a URI when ``output`` is one), or
    None: the latest one Ray Train registered (its snapshot; what ``ray.train.get_checkpoint()``
    gives the workers of a new fit), so that a checkpoint whose upload was cut short is never
    picked; without a snapshot, the one with the most completed steps."""
    run_dir = storage.join(os.fspath(output), RUN_NAME)
    remote = storage.is_remote(run_dir)
    if storage.exists(storage.join(run_dir, RAY_SNAPSHOT)):
        from ray.train import Result

        from packfeed.trainer.run_dir import ray_storage

        where = ray_storage(run_dir)
        ray_train = logging.getLogger("ray.train")
        level = ray_train.level
        ray_train.setLevel(logging.WARNING)  # its INFO paragraph on finding a snapshot says nothing here
        try:
            checkpoint = Result.from_path(where["storage_path"], where.get("storage_filesystem")).checkpoint
        finally:
            ray_train.setLevel(level)
        if checkpoint is None:
            return None
        return storage.join(run_dir, posixpath.basename(checkpoint.path.rstrip("/"))) if remote else Path(checkpoint.path)
    best, best_step = None, -1
    for state in _state_files(run_dir):
        directory = state.rpartition("/")[0] if remote else Path(state).parent
        step = read_state(directory)["step"]
        if step > best_step:
            best, best_step = directory, step
    return best


def _state_files(run_dir: str) -> list[str]:
    """The ``checkpoint_*/trainer_state.json`` under ``run_dir`` (on a store: one listing)."""
    if not storage.is_remote(run_dir):
        return [str(p) for p in Path(run_dir).glob(f"checkpoint_*/{STATE_FILE}")]
    return [info.uri for info in storage.listing(run_dir, recursive=True)
            if storage.match(["checkpoint_*", STATE_FILE], info.uri[len(run_dir) + 1:].split("/"))]


@contextlib.contextmanager
def local_copy(checkpoint: str | Path) -> Iterator[Path]:
    """The checkpoint as a local directory: itself on disk; on a store its files downloaded to
    a temporary directory, removed afterwards."""
    if not storage.is_remote(os.fspath(checkpoint)):
        yield Path(checkpoint)
        return
    import pyarrow.fs as pafs

    fs, inside = storage.resolve(os.fspath(checkpoint))
    with tempfile.TemporaryDirectory(prefix="packfeed-checkpoint-") as tmp:
        try:
            pafs.copy_files(inside, tmp, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
        except OSError as exc:
            raise storage.StorageError(storage.display(os.fspath(checkpoint)),
                                       f"download failed ({classify(exc).detail})") from None
        yield Path(tmp)
