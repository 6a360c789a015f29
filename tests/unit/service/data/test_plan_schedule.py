"""The stream plan over real files with a mixture schedule, and the mixing block of small
windows (issue 26). Which rows each window holds: a paused source resumes where it stopped,
a plan changed on the fly keeps the windows before the change, windows of 200 samples still
mix a source's files."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packfeed.service.data.config import ScheduleEntry, SourceConfig
from packfeed.service.data.mixture import SourceOrder
from packfeed.service.data.plan import build_plan, mixing_block
from test_plan import config, rows_by_window, write_source


def source_sequence(plan, s: int) -> list[int]:
    """Source s's rows in the order the windows hold them."""
    rows = rows_by_window(plan)
    return [r for k in range(plan.num_windows) for r in rows[k].get(s, [])]


def entry(at: int, **weights: float) -> ScheduleEntry:
    return ScheduleEntry(from_sample=at, weights=weights)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(5, 60), min_size=2, max_size=3),
    epochs=st.integers(1, 3),
    window=st.integers(3, 40),
    block=st.sampled_from([0, 1, 4, 64]),
    pauses=st.lists(st.tuples(st.integers(0, 150), st.booleans()), min_size=1, max_size=3),
)
def test_a_paused_source_resumes_where_it_stopped(tmp_path_factory, sizes, epochs, window, block, pauses):
    """Source 0 paused and resumed by turns: its rows over the run are the first rows of the
    very sequence it has without a schedule (the same seeded passes, shifted), and so for every
    source; every window holds what its stage says, and the run's totals are the plan's."""
    d = tmp_path_factory.mktemp("pause")
    names = [f"s{i}" for i in range(len(sizes))]
    sources = [SourceConfig(name=n, paths=write_source(d, n, r, 2), weight=1.0) for n, r in zip(names, sizes)]
    at = sorted({f for f, _ in pauses})
    paused = dict(pauses)
    schedule = tuple(entry(f, **{n: (0.0 if paused[f] and i == 0 else 1.0) for i, n in enumerate(names)}) for f in at)
    plain = config(sources, samples_per_epoch=sum(sizes), epochs=epochs, window_samples=window, block_samples=block)
    plan = build_plan(dataclasses.replace(plain, schedule=schedule))
    unscheduled = build_plan(plain)
    assert plan.num_windows == unscheduled.num_windows and [s.block for s in plan.sources] == [
        s.block for s in unscheduled.sources]
    totals = plan.planned_samples()
    for s, src in enumerate(plan.sources):
        got = source_sequence(plan, s)
        order = SourceOrder(src.num_rows, block=src.block, seed=0, source=s)
        assert got == [r for lo, hi in order.ranges(0, len(got)) for r in range(lo, hi)]
        assert len(got) == totals[s]
    for k in range(plan.num_windows):
        stage = plan.stage_of(k)
        counts = plan.window_counts(k)
        if stage and paused[plan.schedule[stage - 1].from_sample]:
            assert counts[0] == 0, "paused"
        assert plan.window_start_sample(k + 1) - plan.window_start_sample(k) == counts.sum()
    stages = plan.stage_summary()
    assert [s["from_sample"] for s in stages[1:]] == at
    for s in stages:  # an entry takes effect where a window starts at or after it, or never (past the end)
        assert s["start_sample"] >= s["from_sample"] or s["window"] == plan.num_windows


def test_with_schedule_keeps_the_windows_before_the_change_and_equals_a_fresh_plan(tmp_path):
    a = write_source(tmp_path, "a", 300, files=3)
    b = write_source(tmp_path, "b", 200)
    cfg = config([SourceConfig(name="a", paths=a, weight=1.0), SourceConfig(name="b", paths=b, weight=1.0)],
                 samples_per_epoch=400, epochs=3, window_samples=64, block_samples=8)
    plan = build_plan(cfg)
    windows = [plan.window(k) for k in range(plan.num_windows)]
    for k in (1, 5, 7, plan.windows_per_epoch, plan.num_windows - 1):
        at = plan.window_start_sample(k)
        for offset in (0, -1):  # at a window's start, or one sample before: the change waits for window k
            if k == 1 and offset:
                continue
            schedule = (entry(at + offset, a=0, b=1),)
            changed = plan.with_schedule(schedule)
            assert changed.sources is plan.sources, "no file scanned again"
            assert [changed.window(j) for j in range(k)] == windows[:k]
            assert changed.window(k) != windows[k] and changed.window_counts(k)[0] == 0
            fresh = build_plan(dataclasses.replace(cfg, schedule=schedule))
            assert [fresh.window(j) for j in range(fresh.num_windows)] == [
                changed.window(j) for j in range(changed.num_windows)]
    # a second change on top of the first keeps the windows below its own
    first = plan.with_schedule((entry(plan.window_start_sample(3), a=0, b=1),))
    second = first.with_schedule((*first.schedule, entry(first.window_start_sample(9), a=3, b=1)))
    assert [second.window(j) for j in range(9)] == [first.window(j) for j in range(9)]
    with pytest.raises(ValueError, match="unknown sources"):
        plan.with_schedule((entry(10, a=1, c=1),))


def test_a_schedule_is_deterministic_and_works_with_repeat_sources(tmp_path):
    a = write_source(tmp_path, "a", 120)
    b = write_source(tmp_path, "b", 80)
    cfg = config([SourceConfig(name="a", paths=a), SourceConfig(name="b", paths=b, repeat=0.5)],
                 epochs=2, window_samples=32, block_samples=4, schedule=(entry(90, a=1, b=3),))
    one, two = build_plan(cfg), build_plan(cfg)
    assert [one.window(k) for k in range(one.num_windows)] == [two.window(k) for k in range(two.num_windows)]
    assert one.samples_per_epoch == 160 and one.window_start_sample(one.num_windows) == 320, "epochs keep their size"
    k = one.stage_summary()[1]["window"]
    assert one.window_start_sample(k) >= 90 > one.window_start_sample(k - 1)
    shares = [one.window_counts(j)[1] / one.window_counts(j).sum() for j in range(k + 1, one.num_windows)]
    assert all(abs(x - 0.75) <= 1 / 32 + 1e-9 for x in shares), shares


def test_a_schedule_needs_windows_of_at_least_one_sample_per_source(tmp_path):
    paths = [write_source(tmp_path, n, 10) for n in "abc"]
    cfg = config([SourceConfig(name=n, paths=p, weight=1.0) for n, p in zip("abc", paths)], samples_per_epoch=30,
                 window_samples=2, schedule=(entry(10, a=1, b=1, c=0),))
    with pytest.raises(ValueError, match="a schedule needs windows of at least as many samples as there are sources"):
        build_plan(cfg)


# ---- small windows still mix -------------------------------------------------------------------
@pytest.mark.parametrize("block, count, total, window, expected", [
    pytest.param(256, 8192, 8192, 8192, 256, id="one-source-default-window"),
    pytest.param(256, 4096, 8192, 8192, 128, id="half-of-the-default-window"),
    pytest.param(256, 100, 200, 200, 3, id="window-200-two-sources"),
    pytest.param(256, 1, 10**6, 8192, 1, id="a-tiny-share-reads-single-rows"),
    pytest.param(0, 500, 1000, 100, 0, id="file-order-stays"),
    pytest.param(8, 10**6, 10**6, 8192, 8, id="a-small-block-stays"),
    pytest.param(256, 300, 500, 8192, 9, id="window-beyond-the-epoch"),  # 300 per window / 32
])
def test_mixing_block_golden(block, count, total, window, expected):
    assert mixing_block(block, count, total, window) == expected


def test_windows_of_200_mix_a_source_of_three_files_in_order(tmp_path):
    """Issue 26: window 200, block 256: a window was one place in one file (the first 15% of
    the rows 97% one file, whose share is 50%). Now each window draws ~33 blocks of 6 rows."""
    big = write_source(tmp_path, "big", 1500)
    (tmp_path / "s").mkdir()
    small = write_source(tmp_path / "s", "small", 1500, files=2)  # two files of 750
    other = write_source(tmp_path, "other", 3000)
    cfg = config([SourceConfig(name="mixed", paths=[*big, *small], weight=1.0),
                  SourceConfig(name="other", paths=other, weight=1.0)],
                 samples_per_epoch=6000, window_samples=200)
    plan = build_plan(cfg)
    assert plan.sources[0].block == 3
    files: Counter = Counter()
    for k in range(plan.num_windows * 15 // 100):
        per_window = Counter(p.path for p in plan.window(k).pieces if p.source == 0 for _ in range(p.num_rows))
        assert len(per_window) == 3, "every window draws from all three files"
        files.update(per_window)
    share = files[big[0]] / sum(files.values())
    assert abs(share - 0.5) < 0.08, share


def test_the_example_schedule_plans_its_annealing_stage(monkeypatch):
    """examples/mixture_schedule.toml, on the bundled corpus, as ``packfeed pack --config`` reads it."""
    from pathlib import Path

    from packfeed.service.commands.args import load_config_file
    from packfeed.service.data.config import DataConfig

    root = Path(__file__).resolve().parents[4]
    monkeypatch.chdir(root)
    data = load_config_file(Path("examples/mixture_schedule.toml"))["data"]
    plan = build_plan(DataConfig.from_dict(data))
    (stage,) = plan.stage_summary()[1:]
    assert (stage["from_sample"], stage["start_sample"], plan.window_start_sample(plan.num_windows)) == (9000, 9000, 12000)
    assert plan.window_counts(stage["window"] - 1).tolist() == [167, 167, 167]  # 2000 each an epoch, windows of 500
    assert plan.window_counts(stage["window"]).tolist() == [0, 125, 375]
    from packfeed.service.data.probe import describe

    assert describe({}, plan)[-1] == ("schedule from sample 9,000: weights chat 0, instruct 1, stories 3; takes effect "
                                      "at window 18 (sample 9,000)")
