"""A training run's files on an object store the same as on disk (support/stores.py: the storage
layer's URI path without a socket): metrics records, checkpoints found for --resume and
downloaded, the final model published whole, a previous run kept until cleared, Ray Train's
storage arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.stores import keys, local_or_store, memory_store  # noqa: F401 - the fixtures "where", "store"

from packfeed.service import storage
from packfeed.trainer.loop.interval import append_jsonl, keep_records_until, read_jsonl
from packfeed.trainer.state import run_dir
from packfeed.trainer.state.checkpoint import STATE_FILE, latest_checkpoint, local_copy, read_state
from packfeed.trainer.state.run_dir import FINAL_STATE, RunDir

RUN_NAME, FINAL_DIR, FINAL_PARTIAL = RunDir.RAY, RunDir.FINAL, RunDir.FINAL_PARTIAL


def put(uri: str, data: bytes) -> None:
    """A file written as a run would have left it (on disk its directory made first)."""
    if "://" not in uri:
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
    storage.write_bytes_atomic(uri, data)


def test_every_name_of_a_run_once_and_overwrite_keeps_only_the_scan_manifest(where):
    """RunDir names each file and folder once; ``clear_run`` (--overwrite) deletes every one but
    the inputs' scan manifest, and nothing a user put beside them, on disk and on a store."""
    names = [value for key, value in vars(RunDir).items() if key.isupper() and isinstance(value, str)]
    assert len(names) == len(set(names)) >= 12, names
    assert set(RunDir.RUN_FILES) == set(names) - {RunDir.SCAN_CACHE}
    run = RunDir(where)
    assert (run.metrics, run.rows(3), run.final) == (storage.join(where, "metrics.jsonl"),
                                                     storage.join(where, "rows", "rank3.jsonl"),
                                                     storage.join(where, "final"))
    for name in names:  # a file inside each, as a run leaves them (folders hold files)
        put(run.file(name, "x") if name in (RunDir.RAY, RunDir.CHECKPOINTS, RunDir.ROWS, RunDir.FINAL,
                                              RunDir.FINAL_PARTIAL, RunDir.FINAL_OLD) else run.file(name), b"1")
    put(run.file("notes.txt"), b"mine")
    assert run.holds_a_run()
    run.clear_run()
    assert not run.holds_a_run()
    left = sorted(n for n in names + ["notes.txt"] if run_dir.holds(where, n))
    assert left == sorted([RunDir.SCAN_CACHE, "notes.txt"])


def test_metrics_records_on_a_store_append_and_trim_as_on_disk(where):
    path = storage.join(where, "metrics.jsonl")
    assert read_jsonl(path) == []
    for step in range(1, 6):
        append_jsonl(path, {"step": step, "loss": 1.0 / step})
    keep_records_until(path, 3)  # a resume from the checkpoint of step 3 trains 4 and 5 again
    append_jsonl(path, {"step": 4, "loss": 0.2})
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3, 4]


def test_resume_finds_the_latest_checkpoint_on_a_store(where):
    run = storage.join(where, RUN_NAME)
    assert latest_checkpoint(where) is None
    for step in (3, 12, 6):
        put(storage.join(run, f"checkpoint_{step:06d}", STATE_FILE), json.dumps({"step": step}).encode())
        put(storage.join(run, f"checkpoint_{step:06d}", "optimizer.pt"), b"opt%d" % step)
    found = latest_checkpoint(where)
    assert str(found) == storage.join(run, "checkpoint_000012") and read_state(found)["step"] == 12
    with local_copy(found) as directory:
        assert (directory / "optimizer.pt").read_bytes() == b"opt12" and directory.is_dir()
    put(storage.join(str(found), STATE_FILE), b"")  # cut short
    with pytest.raises(ValueError, match="trainer_state.json is damaged"):
        read_state(found)


class Saves:
    """A model or tokenizer: ``save_pretrained(dir)`` writes ``files``."""

    def __init__(self, **files: bytes) -> None:
        self.files = files
        self.tokenizer = self

    def save_pretrained(self, directory, state_dict=None) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            Path(directory, name).write_bytes(data)


def test_the_final_model_is_published_whole_replacing_the_previous_one(where):
    run_dir.save_final_model(Saves(**{"model.safetensors": b"v1", "config.json": b"{}"}), where, 3)
    assert run_dir.publish_final(where, Saves(**{"tokenizer.json": b"t"})) == 3
    run_dir.save_final_model(Saves(**{"model.safetensors": b"v2", "config.json": b"{}"}), where, 7)
    assert run_dir.publish_final(where, Saves(**{"tokenizer.json": b"t"})) == 7
    final = storage.join(where, FINAL_DIR)
    names = sorted(n.name for n in Path(final).iterdir()) if "://" not in where else keys(final)
    assert names == sorted(["model.safetensors", "config.json", "tokenizer.json", FINAL_STATE])
    assert storage.read_bytes(storage.join(final, "model.safetensors")) == b"v2"
    assert json.loads(storage.read_bytes(storage.join(final, FINAL_STATE))) == {"step": 7}
    assert not run_dir.holds(where, FINAL_PARTIAL) and not run_dir.holds(where, RunDir.FINAL_OLD)


def test_a_previous_run_on_a_store_is_kept_until_cleared_and_its_scan_manifest_stays(store):
    from packfeed.trainer.state.resume import prepare_output

    out = f"{store}/run"
    assert prepare_output(out, resume="auto", overwrite=False) == (None, None)
    for name in ("metrics.jsonl", "summary.json", "scan.npz", f"{RUN_NAME}/checkpoint_000002/{STATE_FILE}"):
        storage.write_bytes_atomic(f"{out}/{name}", json.dumps({"step": 2}).encode())
    with pytest.raises(ValueError, match=f"^{out} already holds a training run"):
        prepare_output(out, resume=False, overwrite=False)
    found, clear = prepare_output(out, resume="yes", overwrite=False)
    assert found == f"{out}/{RUN_NAME}/checkpoint_000002" and clear is None
    found, clear = prepare_output(out, resume=False, overwrite=True)
    assert found is None and len(keys(out)) == 4, "nothing removed before every check passed"
    clear()
    assert keys(out) == ["scan.npz"]


def test_ray_train_gets_the_store_of_the_uri(store, tmp_path):
    assert run_dir.ray_storage(tmp_path) == {"storage_path": str(tmp_path)}
    where = run_dir.ray_storage(f"{store}/run")
    fs, inside = storage.resolve(f"{store}/run")
    assert where == {"storage_path": inside, "storage_filesystem": fs}


def test_a_torchrun_checkpoint_is_published_whole_and_only_the_newest_are_kept(tmp_path):
    """``publish_checkpoint``: what the ranks wrote aside becomes ``checkpoint_<step>`` at once
    (a checkpoint written again for the same step replaces the old one whole), and ``keep``
    bounds how many stay; ``latest_checkpoint`` finds the newest."""
    from packfeed.trainer.state.checkpoint import checkpoint_name, partial_checkpoint, publish_checkpoint

    root = tmp_path / RunDir.CHECKPOINTS
    for step in (1, 2, 3, 3, 4):
        partial = partial_checkpoint(root, step)
        partial.mkdir(parents=True)
        (partial / "weights").write_text(f"{step}")
        (partial / STATE_FILE).write_text(json.dumps({"step": step}))
        assert latest_checkpoint(tmp_path) in (None, root / checkpoint_name(step - 1), root / checkpoint_name(step)), \
            "a checkpoint being written is never found"
        publish_checkpoint(root, step, keep=2)
        assert latest_checkpoint(tmp_path) == root / checkpoint_name(step)
    assert sorted(p.name for p in root.iterdir()) == [checkpoint_name(3), checkpoint_name(4)]
    assert (root / checkpoint_name(4) / "weights").read_text() == "4"
