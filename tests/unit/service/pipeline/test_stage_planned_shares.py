"""The planned share of a schedule stage's lines is the stage's own (the weights in force
there), not the config's: a stage that pauses ``chat`` and weighs ``instruct`` 1 to ``stories``
3 plans 0 / 25 / 75%, consistent with the samples read there; the ``all`` line's is the
run's. The report of ``pack`` (and of ``inspect``, which reads the same stats) used to show
33.33% on every line."""

import pytest
from test_stats import window

from packfeed.service.pipeline.stats import RunStats
from packfeed.service.pipeline.summary import format_summary, upgrade_stats

NAMES = ["chat", "instruct", "stories"]


def scheduled_run() -> RunStats:
    # windows 0-1: the config's equal weights; windows 2-3: chat 0, instruct 1, stories 3
    run = RunStats(NAMES, planned=[20, 20, 20], planned_run=[20, 30, 50], stage_of=lambda k: int(k >= 2))
    for k in (0, 1):
        run.add(window(k, 0, {s: {"read": 10, "packed": 10, "tokens": 100, "rows": int(s == 0)} for s in range(3)}))
    for k in (2, 3):
        run.add(window(k, 0, {0: {"read": 0, "packed": 0}, 1: {"read": 5, "packed": 4, "dropped": 1, "tokens": 40},
                              2: {"read": 15, "packed": 15, "tokens": 300, "rows": 1}}))
    return run


def stage_lines(report: str) -> dict[tuple[str, str], list[str]]:
    """(source, epoch or stage) -> its planned, sample and token shares, from the sources table."""
    out = {}
    for line in report.splitlines():
        cells = line.split()
        if cells and cells[0] in NAMES:
            scope = " ".join(cells[1:3]) if cells[1] == "stage" else cells[1]
            out[(cells[0], scope)] = cells[-3:]
    return out


def test_each_stage_line_has_the_share_the_stage_planned():
    run = scheduled_run()
    run.check_complete(num_windows=4, epochs=1)
    stats = run.to_dict(seq_len=8, seconds=1.0)
    chat, instruct, stories = stats["sources"]
    assert [st["planned_share"] for st in chat["stages"]] == [pytest.approx(1 / 3), 0.0]
    assert [st["planned_share"] for st in instruct["stages"]] == [pytest.approx(1 / 3), 0.25]
    assert [st["planned_share"] for st in stories["stages"]] == [pytest.approx(1 / 3), 0.75]
    # the run's plan over its stages, not the config's weights
    assert [s["planned_share"] for s in stats["sources"]] == [0.2, 0.3, 0.5]
    lines = stage_lines(format_summary(stats))
    assert lines[("chat", "stage 0")] == ["33.33%", "33.33%", "33.33%"]
    assert lines[("chat", "stage 1")] == ["0.00%", "0.00%", "0.00%"]
    # planned 25%; one of its 5 samples dropped: 4 of the 19 packed, 40 of the 340 tokens
    assert lines[("instruct", "stage 1")] == ["25.00%", "21.05%", "11.76%"]
    assert lines[("stories", "stage 1")] == ["75.00%", "78.95%", "88.24%"]
    assert lines[("stories", "all")][0] == "50.00%"


def test_the_planned_shares_agree_with_the_samples_counted_in_every_stage():
    stats = scheduled_run().to_dict(seq_len=8, seconds=1.0)
    for stage in (0, 1):
        read = [s["stages"][stage]["samples_read"] for s in stats["sources"]]
        planned = [s["stages"][stage]["planned_share"] for s in stats["sources"]]
        assert planned == [pytest.approx(n / sum(read)) for n in read] and sum(planned) == pytest.approx(1.0)


def test_a_stats_json_written_before_gets_each_stages_share_too():
    stats = scheduled_run().to_dict(seq_len=8, seconds=1.0)
    for s in stats["sources"]:  # as written before: the config's share everywhere, none per stage or epoch
        s["planned_share"] = 1 / 3
        for entry in s["stages"] + s["epochs"]:
            del entry["planned_share"]
    lines = stage_lines(format_summary(upgrade_stats(stats)))
    assert [lines[(name, "stage 1")][0] for name in NAMES] == ["0.00%", "25.00%", "75.00%"]
    assert [lines[(name, "all")][0] for name in NAMES] == ["20.00%", "30.00%", "50.00%"]
