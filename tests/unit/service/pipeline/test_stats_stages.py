"""Stats of a scheduled mixture (issue 26): each source's samples and shares per schedule
stage, the run's planned totals (not counts x epochs), and the report's stage lines."""

import pytest
from test_stats import window

from packfeed.service.pipeline.stats import RunStats
from packfeed.service.pipeline.summary import format_summary


def test_shares_per_stage_and_the_run_total_under_a_schedule():
    # windows 0-1: stage 0 (equal shares); windows 2-3: stage 1 (chat paused)
    run = RunStats(["chat", "web"], planned=[20, 20], planned_run=[20, 40], stage_of=lambda k: int(k >= 2))
    run.add(window(0, 0, {0: {"read": 10, "packed": 10, "tokens": 100, "rows": 1}, 1: {"read": 10, "packed": 10}}))
    run.add(window(1, 0, {0: {"read": 10, "packed": 9, "dropped": 1}, 1: {"read": 10, "packed": 10, "rows": 1}}))
    run.add(window(2, 1, {1: {"read": 10, "packed": 10, "tokens": 50, "rows": 1}}))
    run.add(window(3, 1, {0: {"read": 0, "packed": 0}, 1: {"read": 10, "packed": 10, "rows": 1}}))
    run.add(window(3, 1, {1: {"read": 10, "packed": 10}}))  # packed again after a restart: counted once
    d = run.to_dict(seq_len=8, seconds=1.0)
    chat, web = d["sources"]
    assert [(s["stage"], s["samples_packed"], s["dropped"]) for s in chat["stages"]] == [(0, 19, 1), (1, 0, 0)]
    assert [s["share_samples"] for s in web["stages"]] == [pytest.approx(20 / 39), 1.0]
    assert web["stages"][1]["share_tokens"] == 1.0 and chat["stages"][0]["share_tokens"] == 1.0
    run.check_complete(num_windows=4, epochs=2)  # 20 and 40 over the run, not 20 x 2 each
    report = format_summary(d)
    lines = [line.split() for line in report.splitlines() if line.startswith("chat ")]
    assert [line[1:3] for line in lines] == [["all", "20"], ["1", "20"], ["2", "0"], ["stage", "0"], ["stage", "1"]]


def test_no_schedule_no_stages():
    run = RunStats(["a"], planned=[5])
    run.add(window(0, 0, {0: {"read": 5, "packed": 5}}))
    assert "stages" not in run.to_dict(seq_len=8, seconds=1.0)["sources"][0]


def test_metrics_count_samples_per_stage_only_under_a_schedule():
    from types import SimpleNamespace

    from packfeed.service.metrics import _packing_families, packing_totals

    run = RunStats(["chat", "web"], planned=[2, 2], stage_of=lambda k: k)
    run.add(window(0, 0, {0: {"read": 2, "packed": 2}, 1: {"read": 2, "packed": 2}}))
    run.add(window(1, 0, {1: {"read": 4, "packed": 4}}))
    per_source, _ = packing_totals(SimpleNamespace(stats=run, seq_len=8))
    families = {f.name: f for f in _packing_families(per_source, None)}
    samples = {tuple(s.labels.values()): s.value for s in families["packfeed_packed_stage_samples"].samples}
    assert samples == {("chat", "0"): 2, ("web", "0"): 2, ("web", "1"): 4}
    plain = RunStats(["a"], planned=[1])
    plain.add(window(0, 0, {0: {"read": 1, "packed": 1}}))
    per_source, _ = packing_totals(SimpleNamespace(stats=plain, seq_len=8))
    assert "packfeed_packed_stage_samples" not in {f.name for f in _packing_families(per_source, None)}
