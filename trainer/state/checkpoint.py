"""Checkpoints: model, optimizer, scheduler, step and data position.

Layout of one checkpoint directory, ``sharding = "ddp"`` (rank 0 writes it)::

    model/                 save_pretrained: config.json + model.safetensors
    optimizer.pt           optimizer.state_dict()
    scheduler.pt           scheduler.state_dict()
    trainer_state.json     {"step": completed optimizer steps, "stream": the stream state after it
                           (client StreamState's record: cursor, step, config hash, seq_len),
                           "manifest": window first rows (delivery/manifest.py), "config": the run config}

``sharding = "fsdp"``: every rank writes its shards, no rank ever holds the whole model::

    sharded/               torch.distributed.checkpoint of {"model", "optimizer"} (keys are the
                           parameters' names): .metadata + one __<rank>_0.distcp per rank
    scheduler.pt, trainer_state.json   as above (rank 0)

With ``[lora]`` (trainer/model/lora.py) a checkpoint holds the adapter and its optimizer only,
never the frozen weights (they are rebuilt from the model's config: the same weights):
``model/`` is the peft model's ``save_pretrained`` (adapter_config.json +
adapter_model.safetensors), ``sharded/`` the adapter's shards.

A sharded checkpoint loads at any world size: each rank reads the pieces of its own shards
(DCP reshards the weights and the AdamW moments). The two layouts do not load into each other:
``load_checkpoint`` says which sharding wrote a checkpoint.

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
import shutil
from pathlib import Path
from typing import Any

from packfeed.service.face import StorageError, display, download_dir, exists, find, is_remote, join, publish_dir, read_text
from packfeed.trainer.model.lora import adapter_names, is_lora
from packfeed.trainer.model.parallelize import is_sharded, unwrapped
from packfeed.trainer.state.run_dir import RunDir, ray_storage

STATE_FILE = "trainer_state.json"
RAY_SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's list of the checkpoints it registered, in ray/
CHECKPOINT_PREFIX = "checkpoint_"  # checkpoint_<step, 6 digits>: Ray Train's and torchrun's alike
PARTIAL_PREFIX = ".partial-"  # a checkpoint being written (torchrun): not matched by checkpoint_* globs
SHARDED_DIR = "sharded"  # a sharded (FSDP2) checkpoint's model and optimizer, torch.distributed.checkpoint
ADAPTER_FILE = "adapter_model.safetensors"  # a LoRA checkpoint's model/ (peft's save_pretrained)


def save_checkpoint(directory: Path, *, model: Any, optimizer: Any, scheduler: Any, state: dict | None) -> None:
    """Write a checkpoint into ``directory``. A sharded model (FSDP2): a collective, every rank
    calls it with its own ``directory`` and writes its shards there; ``state`` None on all
    ranks but rank 0, which writes the scheduler and the trainer state too. A whole model:
    rank 0 alone calls it."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    if is_sharded(model):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(model, optimizer, options=_sharded_options(model))
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(directory / SHARDED_DIR))
    else:
        with adapter_names(model):  # a peft model saves its adapter alone
            model.save_pretrained(directory / "model")
        torch.save(optimizer.state_dict(), directory / "optimizer.pt")
    if state is not None:
        torch.save(scheduler.state_dict(), directory / "scheduler.pt")
        (directory / STATE_FILE).write_text(json.dumps(state, indent=1))


def load_checkpoint(directory: Path, *, model: Any, optimizer: Any, scheduler: Any) -> dict:
    """Load weights and optimizer/scheduler state in place; returns the trainer state. A
    sharded model loads a sharded checkpoint (a collective: every rank calls it), at any world
    size; a whole model a whole one. ValueError when the checkpoint's layout is the other one."""
    import torch

    sharded = (directory / SHARDED_DIR).is_dir()
    if sharded != is_sharded(model):
        wrote, runs = ("fsdp", "ddp") if sharded else ("ddp", "fsdp")
        raise ValueError(f"checkpoint {directory} was written with sharding = \"{wrote}\", this run uses \"{runs}\": "
                         f"resume with --sharding {wrote}, or start a new run (--overwrite)")
    if sharded:
        _load_sharded(directory / SHARDED_DIR, model, optimizer)
    else:
        _load_whole(directory, model, optimizer)
    scheduler.load_state_dict(torch.load(directory / "scheduler.pt", weights_only=True))
    return read_state(directory)


def _load_sharded(directory: Path, model: Any, optimizer: Any) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    options = _sharded_options(model)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(directory))  # every key asked for must be in the checkpoint
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=options)


def _sharded_options(model: Any) -> Any:
    """DCP's state dict options: a LoRA model's trained parameters only (the frozen ones are not
    saved, and not expected back: ``strict`` off for them alone, as every saved key is loaded)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=False) if is_lora(model) else None


def _load_adapter(directory: Path, model: Any) -> None:
    """A LoRA checkpoint's adapter (``model/adapter_model.safetensors``) into the peft ``model``."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(directory / "model" / ADAPTER_FILE))
    with adapter_names(model):
        result = set_peft_model_state_dict(model, weights)
    trained = [name for name, p in model.named_parameters() if p.requires_grad]
    if result.unexpected_keys or len(weights) != len(trained):
        raise ValueError(f"checkpoint {directory} holds another adapter: {len(weights)} tensors for {len(trained)} "
                         f"trained parameters, unexpected {result.unexpected_keys[:5]}")


def _load_whole(directory: Path, model: Any, optimizer: Any) -> None:
    import torch
    from safetensors.torch import load_file

    if is_lora(model):
        _load_adapter(directory, model)
        optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))
        return
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


def full_state_dict(model: Any) -> dict:
    """The whole model's state dict on rank 0, on the CPU (a sharded model's shards gathered one
    tensor at a time: a collective, every rank calls it; other ranks get {}); a whole model's
    own state dict. For ``save_pretrained(state_dict=...)`` of the final model."""
    if not is_sharded(model):
        return unwrapped(model).state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def read_state(directory: str | Path) -> dict:
    """The trainer state of the checkpoint ``directory`` (a path or a URI)."""
    path = join(os.fspath(directory), STATE_FILE)
    try:
        text = read_text(path)
        if text is None:
            raise ValueError("it does not exist")
        return json.loads(text)
    except StorageError:
        raise  # the store failed: its own line
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError too
        raise ValueError(f"{display(path)} is damaged ({e}): resume from another checkpoint or pass "
                         "--overwrite") from None


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint of ``step``, under either launcher."""
    return f"{CHECKPOINT_PREFIX}{step:06d}"


def partial_checkpoint(root: Path, step: int) -> Path:
    """Where the ranks of a torchrun job write the checkpoint of ``step`` under ``root`` until
    ``publish_checkpoint`` makes it whole."""
    return root / f"{PARTIAL_PREFIX}{checkpoint_name(step)}"


def publish_checkpoint(root: Path, step: int, *, keep: int) -> None:
    """The checkpoint of ``step`` written at ``partial_checkpoint`` becomes ``checkpoint_<step>``
    whole (storage ``publish_dir``: a checkpoint that exists is complete); then only the
    ``keep`` newest are kept. Ray Train publishes and keeps its own (``CheckpointConfig``)."""
    partial = partial_checkpoint(root, step)
    publish_dir(str(partial), str(root / checkpoint_name(step)), marker=STATE_FILE, old=f"{partial}.old")
    for old in sorted(root.glob(f"{CHECKPOINT_PREFIX}*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(output: str | Path) -> str | Path | None:
    """The checkpoint a resumed run starts from (a Path, or a URI when ``output`` is one), or
    None: the one with the most completed steps of those Ray Train registered under ``ray/``
    (its snapshot; what ``ray.train.get_checkpoint()`` gives the workers of a new fit, so that
    a checkpoint whose upload was cut short is never picked; without a snapshot, every one)
    and those a torchrun job published under ``checkpoints/`` (trainer/launch/torchrun.py: renamed
    there once whole), so a run may change launchers between resumes."""
    run = RunDir(output)
    found = [_latest_of_ray(run.file(RunDir.RAY)), _latest_in(run.file(RunDir.CHECKPOINTS))]
    found = [f for f in found if f is not None]
    return max(found, key=lambda f: f[1])[0] if found else None


def _latest_of_ray(run_dir: str) -> tuple[str | Path, int] | None:
    """(Ray Train's latest registered checkpoint, its step), or the latest in ``run_dir``
    without a snapshot; None when there is none."""
    if not exists(join(run_dir, RAY_SNAPSHOT)):
        return _latest_in(run_dir)
    from ray.train import Result  # ~2 s to import: only for a run Ray Train wrote

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
    name = posixpath.basename(checkpoint.path.rstrip("/"))
    directory = join(run_dir, name) if is_remote(run_dir) else Path(checkpoint.path)
    return directory, int(read_state(directory)["step"])


def _latest_in(run_dir: str) -> tuple[str | Path, int] | None:
    """(the checkpoint under ``run_dir`` with the most completed steps, its step), or None."""
    remote = is_remote(run_dir)
    best, best_step = None, -1
    for state in _state_files(run_dir):
        directory = state.rpartition("/")[0] if remote else Path(state).parent
        step = read_state(directory)["step"]
        if step > best_step:
            best, best_step = directory, step
    return None if best is None else (best, best_step)


def _state_files(run_dir: str) -> list[str]:
    """The ``checkpoint_*/trainer_state.json`` under ``run_dir`` (on a store: one listing)."""
    return find(run_dir, [f"{CHECKPOINT_PREFIX}*", STATE_FILE])


def local_copy(checkpoint: str | Path) -> contextlib.AbstractContextManager[Path]:
    """The checkpoint as a local directory: itself on disk; on a store its files downloaded to
    a temporary directory, removed afterwards."""
    return download_dir(checkpoint, prefix="packfeed-checkpoint-")
