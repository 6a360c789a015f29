"""The small pieces users see: `packfeed inspect`, progress lines, the probe's report.

`inspect` runs on a real packed directory written from real windows (bundled tokenizer, no
Ray); progress lines run on a fake clock; the probe reads real files.
"""

from __future__ import annotations

import io
import json
import re

from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.cli import main
from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.data.probe import describe, probe
from packfeed.service.progress import Progress
from packfeed.service.pipeline.stats import Counts, RunStats, WindowStats
from packfeed.service.tokenize.samples import SampleTokenizer
from packfeed.service.pipeline.window import process_window
from packfeed.service.packed.writer import ParquetRowWriter

CHAT = {"messages": [{"role": "user", "content": "What color is the sky?"},
                     {"role": "assistant", "content": "The sky is blue."}]}


def packed_dir(tmp_path, stats=None):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [CHAT, {"text": "Once upon a time a fox."}] * 3))
    config = DataConfig.from_inputs([str(data)], tokenizer=demo_tokenizer_path(), seq_len=256)
    plan = build_plan(config)
    tok = SampleTokenizer(config.tokenizer)
    rows, _ = process_window(plan.window(0), {"auto": tok}, config, plan)
    out = tmp_path / "packed"
    writer = ParquetRowWriter(out, seq_len=256, config_hash=config.config_hash())
    writer.write(rows)
    writer.close(config={"data": config.to_dict(), "config_hash": config.config_hash()},
                 stats=stats or {"rows": rows.num_rows, "samples_read": 6, "samples_packed": 6, "skipped": {},
                                 "skipped_total": 0, "truncated": 0, "split": 0, "dropped": 0, "bound_rows": 1,
                                 "tokens": 100, "trained_tokens": 50, "efficiency": 0.5, "seconds": 1.0,
                                 "tokens_per_second": 100.0, "skip_examples": []})  # fmt: skip
    return out


def older_mixture_stats() -> dict:
    """The stats.json of a 2-epoch mixture as packfeed wrote it before epochs were numbered from
    1 and token shares were totalled: chat 4 short samples an epoch, stories 1 long one."""
    run = RunStats(["chat", "stories"], planned=[4, 1])
    for w, (chat, stories) in enumerate([(400, 600), (600, 400)]):
        ws = WindowStats(window=w, epoch=w, rows=1)
        ws.sources = {0: Counts(samples_read=4, samples_packed=4, tokens=chat),
                      1: Counts(samples_read=1, samples_packed=1, tokens=stories)}
        run.add(ws)
    stats = {**run.to_dict(seq_len=256, seconds=11.0), "epoch_rows": [1, 1]}
    for s in stats["sources"]:
        del s["realised_token_share"]
        for e in s["epochs"]:
            e["epoch"] -= 1
    return stats


def test_inspect_shows_segments_and_what_is_trained(tmp_path, capsys):
    out = packed_dir(tmp_path)
    assert main(["inspect", str(out), "--row", "0"]) == 0
    text = capsys.readouterr().out
    assert "1 rows of 256 tokens" in text and "samples packed" in text
    assert "segment 0: sample" in text and re.search(r"segment \d+: padding, \d+ tokens", text)
    assert "[[The sky is blue.<|im_end|>" in text, "the assistant turn is trained, marked in [[ ]]"
    assert "What color is the sky?" in text and "[[What color" not in text, "the prompt is not trained"
    # text trains every token but its first: "O[[nce upon a time a fox.<|endoftext|>]]"
    assert re.search(r"^  [^\[\s]+\[\[[^\]]*upon a time a fox\.[^\]]*\]\]$", text, re.M), text


def test_inspect_shows_the_mixture_in_samples_and_tokens_for_every_epoch_numbered_from_1(tmp_path, capsys):
    out = packed_dir(tmp_path, stats={"status": "complete", **older_mixture_stats()})
    assert main(["inspect", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "rows per epoch               1 (epoch 1), 1 (epoch 2)" in lines
    # stories: 20% of the samples as planned, 50% of the tokens (60% in epoch 1, 40% in epoch 2)
    assert [line.split() for line in lines if line.startswith("stories")] == [
        ["stories", "all", "2", "2", "0", "0", "1,000", "20.00%", "20.00%", "50.00%"],
        ["stories", "1", "1", "1", "0", "0", "600", "20.00%", "20.00%", "60.00%"],
        ["stories", "2", "1", "1", "0", "0", "400", "20.00%", "20.00%", "40.00%"],
    ]
    assert main(["inspect", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert [[e["epoch"] for e in s["epochs"]] for s in stats["sources"]] == [[1, 2], [1, 2]]


def test_inspect_refuses_what_is_not_a_packed_directory(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == 2
    assert "is not a packfeed output directory" in capsys.readouterr().err
    ParquetRowWriter(tmp_path / "killed", seq_len=8, config_hash="h")  # a pack stopped before its first row
    assert main(["inspect", str(tmp_path / "killed")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"packfeed inspect: error: {tmp_path / 'killed'} is incomplete: ") and err.count("\n") == 1
    assert "it has no part file yet and lacks .packfeed/config.json and .packfeed/stats.json" in err


def test_progress_writes_lines_without_a_terminal():
    clock = [0.0]
    stream = io.StringIO()
    progress = Progress("packfeed pack", 60_000, seq_len=4096, interval_s=10, stream=stream, tty=False,
                        clock=lambda: clock[0])
    progress.update(samples=1000, rows=10, tokens=900)  # before the interval: nothing yet
    clock[0] = 12.0
    progress.update(samples=24_576, rows=6_233, tokens=14_400_000)
    clock[0] = 15.0
    progress.update(samples=30_000, rows=7_000, tokens=16_000_000)  # within the next interval: nothing
    # 14.4M tokens in 12 s; 14.4M / (6,233 x 4096) = 56.4% full; 12 s x (1 - 0.41) / 0.41 = 17 s left
    assert stream.getvalue().splitlines() == [
        "packfeed pack: 24,576/60,000 samples (41%), 6,233 rows, 1.2M tokens/s, efficiency 56.4%, ETA 0:00:17"
    ]


def test_probe_reports_formats_per_file_and_names_a_bad_source(tmp_path):
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in [CHAT, {"prompt": "p", "completion": "c"}, {"text": "t"},
                                                            {"oops": 1}]))
    plan = build_plan(DataConfig.from_inputs([str(mixed)], tokenizer="-", seq_len=8))
    lines = describe(probe(plan), plan)
    assert lines[0].startswith("source 'mixed': 1 file(s), 4 rows, 4 samples per epoch (100.0% of the mixture)")
    assert lines[1].endswith("4 rows; first 4: messages 1, prompt_completion 1, text 1; bad: missing_field 1")
    array = tmp_path / "array.json"
    array.write_text(json.dumps([{"text": "a"}, {"text": "b"}], indent=1))
    plan = build_plan(DataConfig.from_inputs([str(array)], tokenizer="-", seq_len=8))
    try:
        probe(plan)
    except ValueError as e:
        assert "a .json input must hold JSON Lines" in str(e) and "source 'array'" in str(e)
    else:
        raise AssertionError("a JSON array file is not a valid source")
