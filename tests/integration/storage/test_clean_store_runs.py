"""A clean run on S3 (moto on 127.0.0.1) says it was clean and leaves no working keys behind.

* ``pack`` from and to S3: the objects it looks for on purpose before they exist (the kept
  scan, files.json, config.json) are answers, not failed requests: its report said "(0
  retried, 1 failed)". Packed by the driver alone (no Ray: a few windows).
* ``publish_final`` of a training run on S3 (the final model moved from ``.final.partial/`` to
  ``final/``): a store has no rename, the copy's source must go whole; an empty
  ``.final.partial/`` key stayed (Arrow keeps a "directory" in being).
"""

from __future__ import annotations

import pytest

from packfeed.service import storage
from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.data.config import DataConfig
from packfeed.service.packjob.pack_run import run_pack
from packfeed.trainer.state import run_dir

pytestmark = pytest.mark.integration


def keys(s3, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in s3.client.list_objects_v2(Bucket=bucket).get("Contents", []))


def test_a_clean_pack_on_s3_reports_no_failed_request(s3, driver_alone, tmp_path, capsys):
    bucket = s3.bucket("clean")
    source = next(p for p in demo_corpus_paths() if p.endswith("instruct.jsonl"))
    with open(source, "rb") as f:
        uri = s3.put(bucket, "corpus/instruct.jsonl", b"".join(line for _, line in zip(range(400), f)))
    config = DataConfig.from_inputs([uri], tokenizer=demo_tokenizer_path(), seq_len=512, window_samples=200)
    before = storage.COUNTERS.snapshot()
    stats = run_pack(config, f"s3://{bucket}/packed", progress_seconds=60)
    delta = storage.COUNTERS.snapshot() - before
    assert stats["storage"]["requests"] > 0 and stats["storage"]["failures"] == 0
    assert delta.failures == 0 and delta.retries == 0, delta
    assert " requests (0 retried, 0 failed)" in capsys.readouterr().out


class Saves:
    """A model or tokenizer: ``save_pretrained(dir)`` writes ``files``."""

    def __init__(self, **files: bytes) -> None:
        self.files, self.tokenizer = files, self

    def save_pretrained(self, directory, state_dict=None) -> None:
        from pathlib import Path

        Path(directory).mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            Path(directory, name).write_bytes(data)


def test_publishing_the_final_model_on_s3_leaves_no_partial_key(s3):
    bucket = s3.bucket("train")
    out = f"s3://{bucket}/runs/demo"
    s3.put(bucket, "runs/demo/config.json", b"{}")
    for step in (3, 7):  # a first final model, then the one of a resumed run replacing it
        run_dir.save_final_model(Saves(**{"model.safetensors": b"v%d" % step}), out, step)
        assert any(k.startswith("runs/demo/.final.partial/") for k in keys(s3, bucket))
        assert run_dir.publish_final(out, Saves(**{"tokenizer.json": b"t"})) == step
        left = keys(s3, bucket)
        assert not [k for k in left if ".final.partial" in k], left
        assert [k for k in left if k.startswith("runs/demo/final/") and not k.endswith("/")] == [
            f"runs/demo/final/{name}" for name in ("model.safetensors", run_dir.FINAL_STATE, "tokenizer.json")]
    assert storage.read_bytes(f"{out}/final/model.safetensors") == b"v7"
