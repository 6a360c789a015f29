"""The files of a training run under ``--output``: a local directory or a URI
(``s3://bucket/runs/demo``, anything ``service.storage`` serves).

============================  ======================================  =============================================
file                          written by                              on an object store
============================  ======================================  =============================================
``config.json``               the driver, at the start                one PUT (credentials removed from its URIs)
``metrics.jsonl``             rank 0, a record every ``log_every``    the object written whole again (GET + PUT)
``rows/rank<k>.jsonl``        each rank, every step (``record_rows``)  the same
``ray/checkpoint_<step>/``    Ray Train (``ray_storage``)             Ray Train's upload, through the same store
``checkpoints/checkpoint_<step>/``  every rank of a torchrun job         (a shared filesystem only)
``stream_manifest.json``      the feeder (delivery/manifest.py)       one PUT every few seconds
``scan.npz``                  the plan (inputs/scan_cache.py)         one PUT when a file was scanned
``final/``                    rank 0 and the driver (``publish_final``)  objects copied, ``FINAL_STATE`` last
``summary.json``, ``loss.png``  the driver, at the end                one PUT each
``trackers.json``             rank 0, as its trackers open            one PUT a (re)start
``tensorboard/``, ``mlruns/``, ``wandb/``  rank 0's trackers (loop/trackers.py)  (local outputs only)
============================  ======================================  =============================================

With ``[lora]``, ``final/`` holds the adapter as peft saves it (adapter_config.json,
adapter_model.safetensors), ``base/`` for a tiny model and ``merged/`` for ``merge = true``.

``RunDir`` names each of them once (and what ``--overwrite`` clears: everything but
``scan.npz``); a checkpoint's own name is ``checkpoint.checkpoint_name``.

A store has no rename: a ``final/`` is whole when its ``FINAL_STATE`` (written last) exists,
and a new one replaces the old with that object deleted first; the ``.final.partial/`` it was
copied from is deleted whole, its own ``name/`` key included (``storage/tree.py``
``remove_dir``: a prefix emptied key by key kept a ``.final.partial/`` key on S3, measured
against moto).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from packfeed.service.face import (
    delete_prefix,
    holds,
    is_remote,
    join,
    publish_dir,
    read_text,
    remove_names,
    resolve,
    upload_dir,
)

FINAL_STATE = "packfeed_state.json"  # {"step": the steps the final model trained}, in final/
MERGED_DIR = "merged"  # final/merged/: a LoRA run's merged model ([lora] merge = true), with the tokenizer
BASE_DIR = "base"  # final/base/: a LoRA run's base when it is a tiny model (random from the seed: on no hub)


@dataclasses.dataclass(frozen=True)
class RunDir:
    """The files and folders of one run under ``root`` (``--output``: a path or a URI), named
    once: the module docstring's table. Each property is a path or a URI, as ``root`` is."""

    CONFIG = "config.json"
    METRICS = "metrics.jsonl"
    SUMMARY = "summary.json"
    PLOT = "loss.png"
    ROWS = "rows"  # rows/rank<k>.jsonl: each rank's rows of every step ([train] record_rows)
    RAY = "ray"  # Ray Train's run directory: its checkpoints and their snapshot
    CHECKPOINTS = "checkpoints"  # a torchrun job's checkpoints (trainer/launch/torchrun.py)
    MANIFEST = "stream_manifest.json"  # the first row of every window packed (delivery/manifest.py)
    SCAN_CACHE = "scan.npz"  # the inputs' scan manifest (inputs/scan_cache.py)
    FINAL = "final"  # the finished run's model and tokenizer
    # Where the final model is written until it is whole (model, tokenizer, FINAL_STATE): then it
    # becomes final/, so a final/ that exists is complete.
    FINAL_PARTIAL = ".final.partial"
    FINAL_OLD = ".final.old"  # on disk: the previous final/ while a new one takes its place
    # [train] report_to (trainer/loop/trackers.py): the tracker runs' ids, so a restart or
    # --resume continues them, and the files of the trackers that write under the output.
    TRACKERS = "trackers.json"
    TENSORBOARD = "tensorboard"
    MLRUNS = "mlruns"  # MLflow's file store, when MLFLOW_TRACKING_URI names none
    WANDB = "wandb"
    # What --overwrite clears: the previous run (its trackers' files under the output too), not
    # the scan manifest (it describes the inputs).
    RUN_FILES = (CONFIG, RAY, CHECKPOINTS, FINAL, FINAL_PARTIAL, FINAL_OLD, ROWS, METRICS, SUMMARY, PLOT, MANIFEST,
                 TRACKERS, TENSORBOARD, MLRUNS, WANDB)

    root: str | Path

    def file(self, *names: str) -> str:
        """``names`` under the run's root."""
        return path(self.root, *names)

    @property
    def config(self) -> str:
        return self.file(self.CONFIG)

    @property
    def metrics(self) -> str:
        return self.file(self.METRICS)

    @property
    def summary(self) -> str:
        return self.file(self.SUMMARY)

    @property
    def plot(self) -> str:
        return self.file(self.PLOT)

    def rows(self, rank: int) -> str:
        return self.file(self.ROWS, f"rank{rank}.jsonl")

    @property
    def manifest(self) -> str:
        return self.file(self.MANIFEST)

    @property
    def scan_cache(self) -> str:
        return self.file(self.SCAN_CACHE)

    @property
    def trackers(self) -> str:
        return self.file(self.TRACKERS)

    @property
    def tensorboard(self) -> str:
        return self.file(self.TENSORBOARD)

    @property
    def mlruns(self) -> str:
        return self.file(self.MLRUNS)

    @property
    def final(self) -> str:
        return self.file(self.FINAL)

    @property
    def final_partial(self) -> str:
        return self.file(self.FINAL_PARTIAL)

    def holds_a_run(self) -> bool:
        """Whether a run has written here (its checkpoints or its metrics)."""
        return any(holds(self.root, name) for name in (self.RAY, self.CHECKPOINTS, self.METRICS))

    def clear_run(self) -> None:
        """Delete the previous run's files (``RUN_FILES``): what ``--overwrite`` clears."""
        remove_names(self.root, self.RUN_FILES)


def location(output: str | Path) -> str | Path:
    """``output`` as the run uses it: an absolute Path on disk, a URI as it is."""
    return os.fspath(output) if is_remote(os.fspath(output)) else Path(output).resolve()


def path(output: str | Path, *names: str) -> str:
    """The file ``names`` under ``output`` (a path or a URI)."""
    return join(os.fspath(output), *names)


def save_final_model(model: Any, output: str | Path, step: int, *, state_dict: dict | None = None,
                     extras: Callable[[Path], None] | None = None) -> None:
    """The final model into ``<output>/.final.partial`` (emptied first: a group restarted by
    Ray Train may have left half a model there), ``FINAL_STATE`` last: it says the model is whole.
    ``state_dict``: the whole model's weights when ``model`` holds only a shard of them
    (checkpoint.full_state_dict); a peft model saves its adapter. ``extras(directory)``: writes
    more into the final model's directory before ``FINAL_STATE`` (LoRA's ``base/`` and
    ``merged/``: trainer/model/lora.py ``write_final_extras``)."""
    partial = RunDir(output).final_partial
    if not is_remote(partial):
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial, state_dict=state_dict)
        if extras is not None:
            extras(Path(partial))
        Path(partial, FINAL_STATE).write_text(json.dumps({"step": step}))
        return
    delete_prefix(partial)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, state_dict=state_dict)
        if extras is not None:
            extras(Path(tmp))
        Path(tmp, FINAL_STATE).write_text(json.dumps({"step": step}))
        upload_dir(Path(tmp), partial, last=FINAL_STATE)


def publish_final(output: str | Path, tokenizer: Any) -> int:
    """Complete the final model the workers wrote aside (``RunDir.final_partial``) with the tokenizer
    (in ``merged/`` too when LoRA wrote one) and make it ``final/``, so a ``final/`` that exists
    is whole; returns its step count. On
    disk a rename (a previous ``final/``, of a run stopped at ``stop_at_step`` and resumed, is
    renamed away first: deleted in place, it would be half a model for a while); on a store the
    old one's ``FINAL_STATE`` goes first, the new one's comes last."""
    run = RunDir(output)
    partial = run.final_partial
    step = int(json.loads(read_text(path(partial, FINAL_STATE)))["step"])
    merged = path(partial, MERGED_DIR)
    for directory in (partial, merged) if read_text(path(merged, "config.json")) is not None else (partial,):
        if is_remote(directory):
            with tempfile.TemporaryDirectory() as tmp:
                tokenizer.tokenizer.save_pretrained(tmp)
                upload_dir(Path(tmp), directory)
        else:
            tokenizer.tokenizer.save_pretrained(directory)
    publish_dir(partial, run.final, marker=FINAL_STATE, old=run.file(RunDir.FINAL_OLD))
    return step


def ray_storage(output: str | Path) -> dict[str, Any]:
    """Ray Train's ``RunConfig`` arguments that put its run directory under ``output``: the
    path, or on a store the path inside it and the filesystem of ``storage.resolve`` (its own
    retries, the credentials and endpoint packfeed uses everywhere)."""
    if not is_remote(os.fspath(output)):
        return {"storage_path": os.fspath(output)}
    fs, inside = resolve(os.fspath(output))
    return {"storage_path": inside, "storage_filesystem": fs}
