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
============================  ======================================  =============================================

``RunDir`` names each of them once (and what ``--overwrite`` clears: everything but
``scan.npz``); a checkpoint's own name is ``checkpoint.checkpoint_name``.

A store has no rename: a ``final/`` is whole when its ``FINAL_STATE`` (written last) exists,
and a new one replaces the old with that object deleted first; the ``.final.partial/`` it was
copied from is deleted whole, its own ``name/`` key included (``remove_dir``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from packfeed.service.face import (
    NO_BUCKET,
    NOT_FOUND,
    StorageError,
    classify,
    delete_prefix,
    display,
    exists,
    is_remote,
    join,
    listing,
    read_bytes,
    resolve,
    scrub,
    write_bytes_atomic,
)
FINAL_STATE = "packfeed_state.json"  # {"step": the steps the final model trained}, in final/


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
    # What --overwrite clears: the previous run, not the scan manifest (it describes the inputs).
    RUN_FILES = (CONFIG, RAY, CHECKPOINTS, FINAL, FINAL_PARTIAL, FINAL_OLD, ROWS, METRICS, SUMMARY, PLOT, MANIFEST)

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
        remove(self.root, self.RUN_FILES)


def location(output: str | Path) -> str | Path:
    """``output`` as the run uses it: an absolute Path on disk, a URI as it is."""
    return os.fspath(output) if is_remote(os.fspath(output)) else Path(output).resolve()


def path(output: str | Path, *names: str) -> str:
    """The file ``names`` under ``output`` (a path or a URI)."""
    return join(os.fspath(output), *names)


def read_text(uri: str) -> str | None:
    """The text of ``uri`` (a path or a URI), None when there is no such file."""
    if not is_remote(uri):
        return Path(uri).read_text() if os.path.isfile(uri) else None
    try:
        return read_bytes(uri).decode()
    except StorageError as exc:
        if exc.kind in (NOT_FOUND, NO_BUCKET):
            return None
        raise


def write_json(uri: str, value: Any) -> None:
    """``value`` as JSON at ``uri``, whole or not at all, credentials scrubbed from its URIs."""
    write_bytes_atomic(uri, scrub(json.dumps(value, indent=1)).encode())


def holds(output: str | Path, name: str) -> bool:
    """Whether the file or directory ``name`` is under ``output`` (on a store: any key below it)."""
    uri = path(output, name)
    if not is_remote(uri):
        return os.path.exists(uri)
    return exists(uri) or bool(listing(uri, recursive=False))


def remove(output: str | Path, names: tuple[str, ...]) -> None:
    """Delete the files and directories ``names`` under ``output`` (on a store: one listing)."""
    if is_remote(os.fspath(output)):
        delete_prefix(os.fspath(output), only=lambda rel: rel.split("/")[0] in names)
        return
    for name in names:
        target = Path(output, name)
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def upload_dir(local: Path, uri: str, *, last: str | None = None) -> None:
    """Copy the files under ``local`` to ``uri`` (a store), streamed, ``last`` after the others."""
    files = sorted((p for p in local.rglob("*") if p.is_file()), key=lambda p: (p.name == last, str(p)))
    for file in files:
        target = path(uri, file.relative_to(local).as_posix())
        _on_store(target, "upload", lambda: _copy(file, target))


def _copy(file: Path, target: str) -> None:
    fs, dest = resolve(target)
    pafs.copy_files(str(file), dest, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)


def _on_store(uri: str, what: str, fn) -> Any:
    """``fn()`` on the filesystem of ``storage.resolve`` (which retries by itself); a failure is
    one line naming ``uri``."""
    try:
        return fn()
    except OSError as exc:
        raise StorageError(display(uri), f"{what} failed ({classify(exc).detail})") from None


def save_final_model(model: Any, output: str | Path, step: int, *, state_dict: dict | None = None) -> None:
    """The final model into ``<output>/.final.partial`` (emptied first: a group restarted by
    Ray Train may have left half a model there), ``FINAL_STATE`` last: it says the model is whole.
    ``state_dict``: the whole model's weights when ``model`` holds only a shard of them
    (checkpoint.full_state_dict)."""
    partial = RunDir(output).final_partial
    if not is_remote(partial):
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial, state_dict=state_dict)
        Path(partial, FINAL_STATE).write_text(json.dumps({"step": step}))
        return
    delete_prefix(partial)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, state_dict=state_dict)
        Path(tmp, FINAL_STATE).write_text(json.dumps({"step": step}))
        upload_dir(Path(tmp), partial, last=FINAL_STATE)


def publish_final(output: str | Path, tokenizer: Any) -> int:
    """Complete the final model the workers wrote aside (``RunDir.final_partial``) with the tokenizer
    and make it ``final/``, so a ``final/`` that exists is whole; returns its step count. On
    disk a rename (a previous ``final/``, of a run stopped at ``stop_at_step`` and resumed, is
    renamed away first: deleted in place, it would be half a model for a while); on a store the
    old one's ``FINAL_STATE`` goes first, the new one's comes last."""
    run = RunDir(output)
    partial, final = run.final_partial, run.final
    step = int(json.loads(read_text(path(partial, FINAL_STATE)))["step"])
    if not is_remote(partial):
        old = run.file(RunDir.FINAL_OLD)
        tokenizer.tokenizer.save_pretrained(partial)
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(final):
            os.rename(final, old)
        os.rename(partial, final)
        shutil.rmtree(old, ignore_errors=True)
        return step
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.tokenizer.save_pretrained(tmp)
        upload_dir(Path(tmp), partial)
    delete_prefix(final, only=lambda rel: rel == FINAL_STATE)
    delete_prefix(final)
    fs, _ = resolve(partial)
    names = sorted((info.uri[len(partial) + 1:] for info in listing(partial, recursive=True) if not info.is_dir),
                   key=lambda rel: (rel == FINAL_STATE, rel))
    for rel in names:
        source, target = path(partial, rel), path(final, rel)
        _on_store(target, "copy", lambda: fs.copy_file(resolve(source)[1], resolve(target)[1]))
    remove_dir(partial)
    return step


def remove_dir(uri: str) -> None:
    """Delete ``uri`` on a store whole: every key under it, then its own ``name/`` key.

    ``storage.delete_prefix`` keeps the "directory": Arrow writes an empty ``name/`` key to keep
    it in being, so a run published on S3 kept a ``.final.partial/`` key (measured against
    moto). Arrow's ``delete_dir`` removes it (one DELETE, after a LIST) and, as every delete of
    Arrow's, puts an empty key for the parent instead: the output's own ``name/``, harmless."""
    delete_prefix(uri)
    fs, inside = resolve(uri)

    def delete() -> None:
        try:
            fs.delete_dir(inside)
        except FileNotFoundError:  # no key left, not even its own
            pass

    _on_store(uri, "delete", delete)


def ray_storage(output: str | Path) -> dict[str, Any]:
    """Ray Train's ``RunConfig`` arguments that put its run directory under ``output``: the
    path, or on a store the path inside it and the filesystem of ``storage.resolve`` (its own
    retries, the credentials and endpoint packfeed uses everywhere)."""
    if not is_remote(os.fspath(output)):
        return {"storage_path": os.fspath(output)}
    fs, inside = resolve(os.fspath(output))
    return {"storage_path": inside, "storage_filesystem": fs}
