"""A window of preference pairs mixed with other kinds, end to end without Ray: rows follow the
convention with every pair whole in one row, and the stats count pairs read, packed, truncated
and dropped under each overlong policy, also when two loss modes tokenize parts of the window."""

from __future__ import annotations

import json

import numpy as np
import pytest

from packfeed.client.rows import PAIR_CHOSEN, check_rows
from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.data.config import DataConfig, SourceConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.pipeline.window import process_window
from packfeed.service.tokenize.samples import SampleTokenizer

SEQ_LEN = 96
Q = [{"role": "user", "content": "What is the capital of Kareth?"}]


def rows_of(k: int) -> list[dict]:
    """Pairs of growing prompts and answers (the last ones longer than a row), text between."""
    out = []
    for i in range(k):
        prompt = "Question: " + "tell me more " * i + "?\nAnswer:"
        out.append({"prompt": prompt, "chosen": " yes" * (1 + i % 5), "rejected": " no" * (1 + i % 3)})
        out.append({"prompt": Q, "chosen": [{"role": "assistant", "content": "Sollun. " * (1 + 2 * i)}],
                    "rejected": [{"role": "assistant", "content": "Brell."}]})
        out.append({"text": "Once upon a time a fox sat on a mat."})
    return out


def write(tmp_path, name: str, rows: list[dict]) -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run_window(config: DataConfig, losses=("auto",)):
    plan = build_plan(config)
    tokenizers = {mode: SampleTokenizer(config.tokenizer, loss=mode) for mode in losses}
    rows, stats = process_window(plan.window(0), tokenizers, config, plan)
    check_rows(rows, config.seq_len)  # every pair whole and adjacent, chosen first
    return rows, stats


@pytest.mark.parametrize("overlong", ["truncate", "drop", "split"])
@pytest.mark.parametrize("strategy", ["exactfit", "concat"])
def test_pairs_counted_under_each_policy(tmp_path, overlong, strategy):
    path = write(tmp_path, "mixed.jsonl", rows_of(12))
    config = DataConfig.from_inputs([path], tokenizer=demo_tokenizer_path(), seq_len=SEQ_LEN, strategy=strategy,
                                    overlong=overlong)
    rows, stats = run_window(config)
    c = stats.source(0)
    assert c.formats == {"preference": 24, "text": 12}
    p = c.pairs
    assert p["read"] == 24 and p["packed"] + p["dropped"] == 24
    assert int((rows.pair_roles == PAIR_CHOSEN).sum()) == p["packed"]
    if overlong == "truncate":
        assert p["truncated"] > 0 and p["dropped"] == 0 and c.truncated >= p["truncated"]
    else:  # dropped, also under split: a pair is never cut into pieces
        assert p["dropped"] > 0 and p["truncated"] == 0 and c.dropped >= p["dropped"]
    assert c.split == 0  # the texts fit a row; no pair is split
    assert json.loads(stats.to_json())["sources"]["0"]["pairs"] == dict(p)


def test_max_prompt_tokens_sets_the_prompt_floor(tmp_path):
    path = write(tmp_path, "long.jsonl", [{"prompt": "Question: " + "tell me more " * 40, "chosen": " yes" * 40,
                                           "rejected": " no" * 40}])
    kept = {}
    for floor in (8, 24):
        config = DataConfig.from_inputs([path], tokenizer=demo_tokenizer_path(), seq_len=SEQ_LEN,
                                        max_prompt_tokens=floor)
        rows, stats = run_window(config)
        assert stats.source(0).pairs["truncated"] == 1
        lens = rows.row_seq_lens(0)
        labels = rows.labels[0]
        kept[floor] = int(np.argmax(labels[1:] != -100)) + 1  # prompt tokens before the first trained one
        assert lens[0] + lens[1] <= SEQ_LEN
    assert kept[8] == 8 and kept[24] == 24
    assert DataConfig.from_inputs([path], tokenizer="t", seq_len=SEQ_LEN).prompt_budget == SEQ_LEN // 4


def test_default_max_prompt_tokens_keeps_the_hash(tmp_path):
    path = write(tmp_path, "a.jsonl", rows_of(1))
    plain = DataConfig.from_inputs([path], tokenizer="t", seq_len=SEQ_LEN)
    assert "max_prompt_tokens" not in plain.to_dict()
    other = DataConfig.from_inputs([path], tokenizer="t", seq_len=SEQ_LEN, max_prompt_tokens=5)
    assert other.config_hash() != plain.config_hash()
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        DataConfig.from_inputs([path], tokenizer="t", seq_len=SEQ_LEN, max_prompt_tokens=-1)


def test_two_loss_modes_join_their_pairs(tmp_path):
    a = write(tmp_path, "a.jsonl", rows_of(3))
    b = write(tmp_path, "b.jsonl", rows_of(3))
    config = DataConfig(sources=(SourceConfig(name="a", paths=(a,)), SourceConfig(name="b", paths=(b,), loss="all")),
                        tokenizer=demo_tokenizer_path(), seq_len=SEQ_LEN)
    rows, stats = run_window(config, losses=("auto", "all"))
    assert stats.source(0).pairs["packed"] == stats.source(1).pairs["packed"] == 6
    assert int((rows.pair_roles == PAIR_CHOSEN).sum()) == 12


def test_run_stats_sum_pairs_and_show_them(tmp_path):
    from packfeed.service.pipeline.stats import RunStats, WindowStats
    from packfeed.service.pipeline.summary import format_summary

    path = write(tmp_path, "mixed.jsonl", rows_of(12))
    config = DataConfig.from_inputs([path], tokenizer=demo_tokenizer_path(), seq_len=SEQ_LEN, overlong="drop")
    _, stats = run_window(config)
    again = WindowStats.from_json(stats.to_json())
    assert again.source(0).pairs == stats.source(0).pairs
    run = RunStats(["mixed"], planned=[36])
    run.add(again)
    out = run.to_dict(seq_len=SEQ_LEN, seconds=1.0)
    p = out["pairs"]
    assert p == {"read": 24, "packed": 24 - p["dropped"], "truncated": 0, "dropped": p["dropped"]} and p["dropped"]
    lines = {line.strip().split("  ")[0]: line.split()[-3:] for line in format_summary(out).splitlines()}
    assert lines["preference pairs read / packed"] == ["24", "/", str(p["packed"])]
    assert lines["pairs truncated / dropped"] == ["0", "/", str(p["dropped"])]
    no_pairs = DataConfig.from_inputs([write(tmp_path, "t.jsonl", [{"text": "a fox"}])], tokenizer=demo_tokenizer_path(),
                                      seq_len=SEQ_LEN)
    _, plain = run_window(no_pairs)
    assert "pairs" not in json.loads(plain.to_json())["sources"]["0"]  # stats.json as before pairs existed


def test_the_bundled_preference_example_is_current_and_packs_whole(tmp_path):
    from pathlib import Path

    from packfeed.service.assets import build_pairs

    out = tmp_path / "preference.jsonl"
    build_pairs.main(out)
    bundled = Path(build_pairs.OUT)
    assert out.read_bytes() == bundled.read_bytes()  # regenerate it with `python -m packfeed.service.assets.build_pairs`
    rows = [json.loads(line) for line in bundled.read_text().splitlines()]
    forms = {("prompt" in r, isinstance(r["chosen"], str)) for r in rows}
    assert forms == {(True, True), (True, False), (False, False)}  # standard, conversational, implicit
    config = DataConfig.from_inputs([str(bundled)], tokenizer=demo_tokenizer_path(), seq_len=512, window_samples=1000)
    packed, stats = run_window(config)
    assert stats.source(0).pairs == {"read": len(rows), "packed": len(rows), "truncated": 0, "dropped": 0}
    assert stats.source(0).skipped_total == 0 and packed.num_rows < len(rows) // 4  # several pairs per row


def test_inspect_names_each_side_of_a_pair(tmp_path, capsys):
    from packfeed.service.cli import main
    from packfeed.service.packed.writer import ParquetRowWriter

    path = write(tmp_path, "one.jsonl", [{"prompt": "Question: What is 2 plus 2?\nAnswer:", "chosen": " 4.",
                                          "rejected": " 5."}])
    config = DataConfig.from_inputs([path], tokenizer=demo_tokenizer_path(), seq_len=SEQ_LEN)
    rows, stats = run_window(config)
    writer = ParquetRowWriter(tmp_path / "packed", seq_len=SEQ_LEN, config_hash=config.config_hash())
    writer.write(rows)
    writer.close(config={"data": config.to_dict(), "config_hash": config.config_hash()},
                 stats={"rows": 1, "samples_read": 1, "samples_packed": 1, "skipped": {}, "skipped_total": 0,
                        "truncated": 0, "split": 0, "dropped": 0, "bound_rows": 1, "tokens": 30, "trained_tokens": 4,
                        "efficiency": 0.3, "seconds": 1.0, "tokens_per_second": 30.0, "skip_examples": []})
    assert main(["inspect", str(tmp_path / "packed"), "--row", "0"]) == 0
    text = capsys.readouterr().out
    assert "segment 0: sample 0 (pair: chosen)" in text and "segment 1: sample 0 (pair: rejected)" in text
    assert "[[ 4.<|endoftext|>]]" in text and "[[ 5.<|endoftext|>]]" in text
    assert "segment 2: padding" in text


def test_a_source_without_pairs_keeps_no_pair_counts(tmp_path):
    a = write(tmp_path, "a.jsonl", rows_of(2))
    b = write(tmp_path, "b.jsonl", [{"text": "a fox sat on a mat"}] * 4)
    config = DataConfig(sources=(SourceConfig(name="a", paths=(a,)), SourceConfig(name="b", paths=(b,))),
                        tokenizer=demo_tokenizer_path(), seq_len=SEQ_LEN)
    _, stats = run_window(config)
    assert stats.source(0).pairs["packed"] == 4 and not stats.source(1).pairs
    assert "pairs" not in json.loads(stats.to_json())["sources"]["1"]
