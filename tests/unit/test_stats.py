"""Accounting: per (epoch, source) counts, the read = packed + skipped + dropped identity, the
JSON trip of a window's stats, planned vs realised shares, and the printed report."""

from collections import Counter

import pytest

from packfeed.service.records import Skip
from packfeed.service.stats import MAX_SKIP_EXAMPLES, Counts, RunStats, WindowStats, format_summary


def window(index: int, epoch: int, per_source: dict[int, dict], examples=()) -> WindowStats:
    ws = WindowStats(window=index, epoch=epoch, rows=sum(c.get("rows", 0) for c in per_source.values()))
    for s, c in per_source.items():
        counts = ws.source(s)
        counts.samples_read = c["read"]
        counts.samples_packed = c["packed"]
        counts.skipped = Counter(c.get("skipped", {}))
        counts.dropped = c.get("dropped", 0)
        counts.tokens = c.get("tokens", 0)
        counts.formats = Counter(c.get("formats", {}))
    ws.skip_examples = list(examples)
    return ws


def test_run_stats_add_by_epoch_and_source_and_shares():
    run = RunStats(["chat", "web"], planned=[30, 10])
    run.add(window(0, 0, {0: {"read": 20, "packed": 18, "skipped": {"malformed_json": 2}, "tokens": 900, "rows": 3},
                          1: {"read": 5, "packed": 5, "tokens": 100}}))
    run.add(window(1, 0, {0: {"read": 10, "packed": 10, "tokens": 500, "rows": 2}, 1: {"read": 5, "packed": 4, "dropped": 1}}))
    run.add(window(2, 1, {0: {"read": 30, "packed": 30, "tokens": 1500, "rows": 5}, 1: {"read": 10, "packed": 10}}))
    run.check_accounting()
    d = run.to_dict(seq_len=512, seconds=2.0)
    assert (d["samples_read"], d["samples_packed"], d["skipped_total"], d["dropped"]) == (80, 77, 2, 1)
    chat, web = d["sources"]
    assert (chat["name"], chat["samples_read"], chat["usable"], chat["planned_samples_per_epoch"]) == ("chat", 60, 58, 30)
    assert chat["planned_share"] == pytest.approx(0.75)
    assert chat["realised_share"] == pytest.approx(58 / 77)
    assert [e["samples_packed"] for e in chat["epochs"]] == [28, 30]
    assert [e["share_samples"] for e in web["epochs"]] == [pytest.approx(9 / 37), pytest.approx(10 / 40)]
    assert d["windows"] == 3 and d["rows"] == 10
    run.check_complete(num_windows=3, epochs=2)
    with pytest.raises(RuntimeError, match="3 of 4 windows arrived"):
        run.check_complete(num_windows=4, epochs=2)


def test_a_lost_window_is_an_accounting_error_naming_the_source():
    run = RunStats(["chat", "web"], planned=[10, 4])
    run.add(window(0, 0, {0: {"read": 10, "packed": 10}}))
    run.add(window(1, 0, {1: {"read": 3, "packed": 3}}))  # one sample of web never arrived
    run.check_accounting()  # each window adds up
    with pytest.raises(RuntimeError, match="source 'web' read 3 samples, planned 4"):
        run.check_complete(num_windows=2, epochs=1)


def test_a_window_packed_twice_counts_once():
    run = RunStats(["a"], planned=[5])
    w = window(4, 0, {0: {"read": 5, "packed": 5, "rows": 1}})
    run.add(w)
    run.add(w)  # a restarted reader packed it again
    assert run.total().samples_read == 5 and run.windows == 1 and run.rows == 1


def test_a_lost_sample_is_an_accounting_error_naming_epoch_and_source():
    run = RunStats(["chat"], planned=[10])
    run.add(window(0, 3, {0: {"read": 10, "packed": 8, "skipped": {"blank_line": 1}}}))
    with pytest.raises(RuntimeError, match="epoch 3, source 'chat'.*read 10 samples but packed 8, skipped 1, dropped 0"):
        run.check_accounting()


def test_window_stats_survive_json_and_keep_the_first_examples_by_sample_id():
    skips = [Skip(i, "a.jsonl", i, "malformed_json", "bad", i + 1) for i in (9, 3, 7)]
    ws = window(0, 0, {0: {"read": 3, "packed": 0, "skipped": {"malformed_json": 3}, "formats": {"text": 1}}}, skips)
    again = WindowStats.from_json(ws.to_json())
    assert again == ws
    run = RunStats(["a"], planned=[3])
    run.add(again)
    run.add(window(1, 0, {0: {"read": 9, "packed": 9}}, [Skip(i, "b.jsonl", 0, "blank_line", "") for i in range(20, 30)]))
    assert [s.sample_id for s in run.skip_examples] == [3, 7, 9, 20, 21][:MAX_SKIP_EXAMPLES]


def test_empty_sources_are_named():
    run = RunStats(["good", "bad"], planned=[2, 2])
    run.add(window(0, 0, {0: {"read": 2, "packed": 2}, 1: {"read": 2, "packed": 0, "skipped": {"missing_field": 2}}}))
    assert run.empty_sources() == ["bad"]


def test_summary_reports_efficiency_against_the_bound_and_the_sources_table():
    run = RunStats(["chat", "web"], planned=[2, 1])
    run.add(window(0, 0, {0: {"read": 2, "packed": 2, "tokens": 700, "rows": 2}, 1: {"read": 1, "packed": 1, "tokens": 300}}))
    stats = run.to_dict(seq_len=512, seconds=2.0)
    assert stats["bound_rows"] == 2 and stats["efficiency"] == pytest.approx(1000 / 1024)
    text = format_summary(stats)
    assert "97.66%" in text and "rows (bound)" in text
    lines = {line.split()[0]: line.split() for line in text.splitlines() if line.split() and line.split()[0] in ("chat", "web")}
    assert lines["chat"][-2:] == ["66.67%", "66.67%"] and lines["web"][-2:] == ["33.33%", "33.33%"]


def test_counts_round_trip():
    c = Counts(samples_read=3, samples_packed=2, skipped=Counter(x=1), tokens=7, formats=Counter(text=2))
    assert Counts.from_dict(c.to_dict()) == c
