"""``packfeed train`` with its inputs, checkpoints and run files on S3 (moto on 127.0.0.1): a run
stopped after its checkpoint at step 2 (``stop_at_step``) resumes from the checkpoint on the
store (planning from the scan manifest kept there: no input scanned again) and trains the rows
an uninterrupted run trains; the model (replacing the stopped run's), metrics and summary land
on the store, nothing on disk, no credential in config.json.

In-process (``train(...)``) on a Ray started with the environment pointing at the server
(``support.store_runs.ray_reaching``: the feeder's packing actors and the train workers reach it too).
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from support.store_runs import CORPUS, count_scans, ray_reaching
from support.train import corpus_head

from packfeed.service import storage
from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.data.config import DataConfig
from packfeed.service.cluster.scaling import PackingScaling
from packfeed.trainer.state.checkpoint import latest_checkpoint, read_state
from packfeed.trainer.run_config import ModelConfig, RunConfig, TrainConfig, TrainScaling
from packfeed.trainer.loop.interval import read_jsonl

pytestmark = pytest.mark.integration

STEPS, STOP, WORKERS, ROWS = 4, 2, 2, 2  # 4 rows a step


@pytest.fixture(scope="module")
def ray_to_s3(s3_server):
    with ray_reaching(s3_server.env()):
        yield


def rows_trained(output: str) -> dict[tuple[int, int], list[int]]:
    """(step, rank) -> the global rows it trained; a step trained twice the same rows."""
    seen: dict[tuple[int, int], list[int]] = {}
    for rank in range(WORKERS):
        for record in read_jsonl(storage.join(output, "rows", f"rank{rank}.jsonl")):
            key = (record["step"], record["rank"])
            assert seen.setdefault(key, record["row_index"]) == record["row_index"], key
    return seen


@pytest.mark.timeout(300)
def test_train_reads_s3_checkpoints_to_s3_and_resumes_from_there(ray_to_s3, s3_server, tmp_path, monkeypatch, capsys):
    from packfeed.trainer.launch.ray_driver import train

    bucket = s3_server.bucket("train")
    inputs = []
    for path in corpus_head(tmp_path / CORPUS, 100):  # ~100 rows of 256 tokens
        inputs.append(s3_server.put(bucket, f"{CORPUS}/{os.path.basename(path)}", open(path, "rb").read()))
    secret_inputs = [uri.replace("s3://", "s3://testing:testing-secret@") for uri in inputs]  # credentials in a URI
    run = RunConfig(
        data=DataConfig.from_inputs(tuple(secret_inputs), tokenizer=demo_tokenizer_path(), seq_len=256,
                                    window_samples=64),
        model=ModelConfig(name="tiny-llama", attn="sdpa"),
        train=TrainConfig(max_steps=STEPS, micro_batch_rows=ROWS, grad_accum=1, log_every=1, checkpoint_every=STOP,
                          lr=3e-3, warmup_steps=1, record_rows=True, stop_at_step=STOP),
        scaling=TrainScaling(num_workers=WORKERS, cpus_per_worker=0.5,
                             packing=PackingScaling(num_workers=1, cpus_per_worker=0.5)),
    )
    output = f"s3://{bucket}/runs/demo"
    train(run, output=output)
    checkpoint = latest_checkpoint(output)
    assert checkpoint == f"{output}/ray/checkpoint_{STOP:06d}" and read_state(checkpoint)["step"] == STOP
    assert json.loads(storage.read_bytes(f"{output}/final/packfeed_state.json")) == {"step": STOP}

    scanned = count_scans(monkeypatch)
    resumed = dataclasses.replace(run, train=dataclasses.replace(run.train, stop_at_step=None))
    summary = train(resumed, output=output, resume=True)
    assert scanned == [0], "the resume planned from the scan manifest the run kept on the store"
    out = capsys.readouterr().out
    assert f"resuming from {output}/ray/checkpoint_{STOP:06d} at step {STOP}" in out
    assert summary["steps"] == STEPS and summary["final_model"] == f"{output}/final"

    per_step = WORKERS * ROWS  # rank k of step s trains the step's rows k mod WORKERS: an uninterrupted run's
    assert rows_trained(output) == {(s, r): [per_step * (s - 1) + r + WORKERS * j for j in range(ROWS)]
                                    for s in range(1, STEPS + 1) for r in range(WORKERS)}
    assert [r["step"] for r in read_jsonl(f"{output}/metrics.jsonl")] == list(range(1, STEPS + 1))
    keys = {info.uri[len(output) + 1:] for info in storage.listing(output, recursive=True) if not info.is_dir}
    assert {"config.json", "summary.json", "loss.png", "scan.npz", "stream_manifest.json", "final/model.safetensors",
            "final/tokenizer.json", "final/packfeed_state.json"} <= keys, sorted(keys)
    assert not any(k.startswith(".final") for k in keys), "the partial model is gone once published"
    assert json.loads(storage.read_bytes(f"{output}/final/packfeed_state.json")) == {"step": STEPS}, "replaced"
    config = storage.read_bytes(f"{output}/config.json").decode()
    assert "testing-secret" not in config and f"s3://{bucket}/{CORPUS}/" in config
    assert "testing-secret" not in out + json.dumps(summary)
    assert list(tmp_path.iterdir()) == [tmp_path / CORPUS], "nothing of the run on disk"
