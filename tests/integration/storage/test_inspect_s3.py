"""``packfeed inspect`` of an output ``pack`` wrote to S3 (moto on 127.0.0.1; no Ray): the
report and a decoded row, as of the same output on disk. The URI used to be made a local
``Path`` (``s3:/bucket/prefix``): "is not a packfeed output directory".

The output has a mixture schedule: each stage's line shows the share its own weights planned
(chat paused: 0%), not the config's 33.33%."""

from __future__ import annotations

import json

import pytest

from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.cli import main
from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.packed.writer import ParquetRowWriter
from packfeed.service.pipeline.stats import Counts, RunStats, WindowStats
from packfeed.service.pipeline.window import process_window
from packfeed.service.tokenize.samples import SampleTokenizer

pytestmark = pytest.mark.integration

CHAT = {"messages": [{"role": "user", "content": "What color is the sky?"},
                     {"role": "assistant", "content": "The sky is blue."}]}
NAMES = ("chat", "instruct", "stories")


def scheduled_stats() -> dict:
    """Stage 0 (window 0) at the config's equal weights, stage 1 (window 1): 0 / 1 / 3."""
    run = RunStats(list(NAMES), planned=[4, 4, 4], planned_run=[4, 5, 7], stage_of=lambda k: k)
    for k, reads in enumerate([(4, 4, 4), (0, 1, 3)]):
        ws = WindowStats(window=k, epoch=0, rows=1)
        ws.sources = {i: Counts(samples_read=n, samples_packed=n, tokens=10 * n) for i, n in enumerate(reads) if n}
        run.add(ws)
    return {**run.to_dict(seq_len=256, seconds=1.0), "status": "complete"}


def write_output(out: str, tmp_path) -> None:
    """A packed output of one real window (bundled tokenizer) at ``out``, a path or a URI."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [CHAT, {"text": "Once upon a time a fox."}] * 3))
    config = DataConfig.from_inputs([str(data)], tokenizer=demo_tokenizer_path(), seq_len=256)
    plan = build_plan(config)
    rows, _ = process_window(plan.window(0), {"auto": SampleTokenizer(config.tokenizer)}, config, plan)
    writer = ParquetRowWriter(out, seq_len=256, config_hash=config.config_hash())
    writer.write(rows)
    writer.close(config={"data": config.to_dict(), "config_hash": config.config_hash()}, stats=scheduled_stats())


def inspect(target: str, capsys, *flags: str) -> str:
    assert main(["inspect", target, *flags]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_inspect_reads_an_output_on_s3_as_the_same_output_on_disk(s3, tmp_path, capsys):
    uri = f"s3://{s3.bucket('inspect')}/packed/demo"
    write_output(uri, tmp_path)
    write_output(str(tmp_path / "local"), tmp_path)
    on_s3 = inspect(uri, capsys, "--row", "0")
    on_disk = inspect(str(tmp_path / "local"), capsys, "--row", "0")
    assert on_s3.startswith(f"{uri}: 2 rows of 256 tokens")
    assert on_s3.replace(uri, "OUT") == on_disk.replace(str(tmp_path / "local"), "OUT")
    assert "[[The sky is blue.<|im_end|>" in on_s3, "row 0 decoded from the store"
    # each stage's planned share: its own weights'
    lines = {tuple(line.split()[:3]): line.split()[-3] for line in on_s3.splitlines() if line.startswith(NAMES)}
    assert [lines[(name, "stage", "1")] for name in NAMES] == ["0.00%", "25.00%", "75.00%"]
    assert [lines[(name, "stage", "0")] for name in NAMES] == ["33.33%"] * 3
    stats = json.loads(inspect(uri, capsys, "--json"))
    assert stats["rows"] == 2 and [s["stages"][1]["planned_share"] for s in stats["sources"]] == [0.0, 0.25, 0.75]


def test_inspect_of_a_uri_that_holds_no_output_names_the_uri(s3, capsys):
    uri = f"s3://{s3.bucket('inspect')}/nothing/here"
    assert main(["inspect", uri]) == 2
    err = capsys.readouterr().err
    assert err == f"packfeed inspect: error: {uri} is not a packfeed output directory (no .packfeed/config.json)\n"
    assert main(["inspect", uri.replace("s3://", "s3://key:secret@")]) == 2
    assert "secret" not in capsys.readouterr().err, "a URI's credentials are never printed"
