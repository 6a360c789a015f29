"""Accounting: per (epoch, source) counts, the read = packed + skipped + dropped identity, the
JSON trip of a window's stats, planned vs realised shares (of samples and of tokens), epochs
numbered from 1 wherever a user reads them, and the printed report."""

from collections import Counter

import pytest

from packfeed.service.inputs.records import Skip
from packfeed.service.pipeline.stats import MAX_SKIP_EXAMPLES, Counts, RunStats, WindowStats
from packfeed.service.pipeline.summary import format_summary, upgrade_stats


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
    assert chat["realised_token_share"] == pytest.approx(2900 / 3000) and web["realised_token_share"] == pytest.approx(0.1 / 3)
    assert [e["epoch"] for e in chat["epochs"]] == [1, 2], "epochs are numbered from 1, as the README counts them"
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
    run.add(window(0, 2, {0: {"read": 10, "packed": 8, "skipped": {"blank_line": 1}}}))  # the third epoch
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
    assert text.splitlines()[-3:] == [  # one epoch: no epoch column
        "source  read  packed  skipped  dropped  tokens  planned share  sample share  token share",
        "chat       2       2        0        0     700         66.67%        66.67%       70.00%",
        "web        1       1        0        0     300         33.33%        33.33%       30.00%",
    ]


def mixture_stats() -> dict:
    """chat (4 short samples an epoch) and stories (1 long one), 2 epochs: 80% / 20% of the
    samples as planned, 50% / 50% of the tokens."""
    run = RunStats(["chat", "stories"], planned=[4, 1])
    run.add(window(0, 0, {0: {"read": 4, "packed": 4, "tokens": 400, "rows": 1}, 1: {"read": 1, "packed": 1, "tokens": 600}}))
    run.add(window(1, 1, {0: {"read": 4, "packed": 4, "tokens": 600, "rows": 2}, 1: {"read": 1, "packed": 1, "tokens": 400}}))
    return {**run.to_dict(seq_len=512, seconds=11.0), "epoch_rows": [1, 2]}


def test_the_mixture_report_shows_token_shares_and_every_epoch_numbered_from_1():
    text = format_summary(mixture_stats())
    assert "rows per epoch               1 (epoch 1), 2 (epoch 2)" in text.splitlines()
    assert text.splitlines()[-7:] == [
        "source   epoch  read  packed  skipped  dropped  tokens  planned share  sample share  token share",
        "chat     all       8       8        0        0   1,000         80.00%        80.00%       50.00%",
        "chat     1         4       4        0        0     400         80.00%        80.00%       40.00%",
        "chat     2         4       4        0        0     600         80.00%        80.00%       60.00%",
        "stories  all       2       2        0        0   1,000         20.00%        20.00%       50.00%",
        "stories  1         1       1        0        0     600         20.00%        20.00%       60.00%",
        "stories  2         1       1        0        0     400         20.00%        20.00%       40.00%",
    ]


def test_a_stats_json_with_epochs_from_0_reads_as_one_from_1():
    new = mixture_stats()
    old = {**new, "sources": [{**s, "epochs": [{**e, "epoch": e["epoch"] - 1} for e in s["epochs"]]}
                              for s in new["sources"]]}  # fmt: skip
    for s in old["sources"]:
        del s["realised_token_share"]  # not written before either
    assert [e["epoch"] for e in old["sources"][0]["epochs"]] == [0, 1]
    assert [e["epoch"] for e in upgrade_stats(old)["sources"][0]["epochs"]] == [1, 2]
    assert upgrade_stats(new) == new and upgrade_stats(upgrade_stats(old)) == upgrade_stats(old)
    assert format_summary(upgrade_stats(old)) == format_summary(new)


@pytest.mark.parametrize("timing, expected", [
    pytest.param({"first_row_seconds": 10.5, "ray_init_seconds": 2.1, "steady_tokens_per_second": 4_800_000.0},
                 ["seconds                      11.00 (start-up: first row at 10.50, Ray start 2.10)",
                  "tokens/s                     4,800,000 steady, after the actors' first window (254,545 overall, "
                  "start-up included)"],
                 id="steady-rate-first-start-up-beside"),
    pytest.param({"first_row_seconds": 10.5, "ray_init_seconds": 2.1, "steady_tokens_per_second": 4_800_000.0,
                  "core_tokens_per_second": 2_600_000.0, "cpu_tokens_per_second": 2_900_000.0},
                 ["seconds                      11.00 (start-up: first row at 10.50, Ray start 2.10)",
                  "tokens/s                     4,800,000 steady, after the actors' first window (254,545 overall, "
                  "start-up included)",
                  "per packing core             2,600,000 tokens/s while packing; 2,900,000 per CPU-second used (the "
                  "actors' windows after their first, read to written)"],
                 id="and-the-rates-per-packing-core"),
    pytest.param({"first_row_seconds": 10.5, "ray_init_seconds": 2.1, "steady_tokens_per_second": 4_800_000.0,
                  "core_tokens_per_second": 2_600_000.0},
                 ["seconds                      11.00 (start-up: first row at 10.50, Ray start 2.10)",
                  "tokens/s                     4,800,000 steady, after the actors' first window (254,545 overall, "
                  "start-up included)",
                  "per packing core             2,600,000 tokens/s while packing (the actors' windows after their "
                  "first, read to written)"],
                 id="stats-json-before-the-cpu-rate"),
    pytest.param({"first_row_seconds": 10.5, "ray_init_seconds": 2.1, "steady_tokens_per_second": None},
                 ["seconds                      11.00 (start-up: first row at 10.50, Ray start 2.10)",
                  "tokens/s                     254,545 overall, start-up included (the actors packed one window: no "
                  "steady rate)"],
                 id="one-window-no-steady-rate"),
    pytest.param({"first_row_seconds": 10.5, "ray_init_seconds": 2.1, "steady_tokens_per_second": None,
                  "driver_windows": 1},
                 ["seconds                      11.00 (start-up: first row at 10.50, Ray start 2.10)",
                  "tokens/s                     254,545 overall, start-up included (the driver packed every window: "
                  "no actors' steady rate)"],
                 id="the-driver-packed-every-window"),
    pytest.param({"first_row_seconds": 1.5, "ray_init_seconds": None, "steady_tokens_per_second": None,
                  "driver_windows": 1},
                 ["seconds                      11.00 (start-up: first row at 1.50, no Ray)",
                  "tokens/s                     254,545 overall, start-up included (the driver packed every window: "
                  "no actors' steady rate)"],
                 id="no-ray-started"),
    pytest.param({}, ["seconds                      11.00", "tokens/s                     254,545"],
                 id="older-stats-json-without-start-up"),
])  # fmt: skip
def test_the_rate_of_a_short_run_is_not_mostly_start_up(timing, expected):
    """2.8M tokens in 11 s with the first row at 10.5 s: the headline is the steady rate."""
    run = RunStats(["a"], planned=[1])
    run.add(window(0, 0, {0: {"read": 1, "packed": 1, "tokens": 2_800_000, "rows": 5469}}))
    text = format_summary({**run.to_dict(seq_len=512, seconds=11.0), **timing})
    assert [line for line in text.splitlines() if line.startswith(("seconds", "tokens/s", "per packing core"))] == expected


def test_counts_round_trip():
    c = Counts(samples_read=3, samples_packed=2, skipped=Counter(x=1), tokens=7, formats=Counter(text=2))
    assert Counts.from_dict(c.to_dict()) == c


def test_the_summary_names_the_start_up_phases_that_took_time():
    run = RunStats(["a"], planned=[1])
    run.add(window(0, 0, {0: {"read": 1, "packed": 1, "tokens": 2_800_000, "rows": 5469}}))
    stats = {**run.to_dict(seq_len=512, seconds=11.0),
             "startup_seconds": {"plan_s": 0.25, "ray_start_s": 2.5, "actor_process_s": 0.0, "first_window_pack_s": 0.125}}
    line = next(x for x in format_summary(stats).splitlines() if x.startswith("start-up by phase"))
    assert line.split("  ")[-1].strip() == "plan 0.25, ray start 2.50, first window pack 0.12"
