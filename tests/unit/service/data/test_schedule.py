"""Mixture schedules: the ``[[data.schedule]]`` config (data/schedule.py) and the windows of a
stream whose weights change (data/epochs.py). Pure: no files; sweeps state the contract of
docs/design.md ("Schedules"): the windows stay where they are, each entry takes effect at the
first window starting at or after its ``from_sample``, every window holds each source within
one sample of its share, an entry changes no window before its own, every source's positions
run on without a gap (a paused source resumes where it stopped)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packfeed.service.data.config import DataConfig, ScheduleEntry, check_schedule_weights
from packfeed.service.data.epochs import ScheduledEpochs, apportion
from packfeed.service.data.mixture import window_bounds

SOURCES = [{"name": "web", "paths": ["w/"], "weight": 3}, {"name": "code", "paths": ["c/"], "weight": 1}]


def data(**fields) -> DataConfig:
    return DataConfig.from_dict({"tokenizer": "tok", "seq_len": 64, "samples_per_epoch": 1000, "epochs": 2,
                                 "sources": SOURCES, **fields})


# ---- the config ------------------------------------------------------------------------------
def test_a_schedule_round_trips_and_is_part_of_the_hash():
    config = data(schedule=[{"from_sample": 1800, "weights": {"web": 0, "code": 1}},
                            {"from_sample": 1900, "weights": {"web": 1.5, "code": 1}}])
    assert config.schedule == (ScheduleEntry(from_sample=1800, weights={"code": 1, "web": 0}),
                               ScheduleEntry(from_sample=1900, weights=(("code", 1.0), ("web", 1.5))))
    assert dict(config.schedule[0].weights) == {"code": 1.0, "web": 0.0}
    assert config.to_dict()["schedule"][0] == {"from_sample": 1800, "weights": {"code": 1.0, "web": 0.0}}
    assert DataConfig.from_dict(config.to_dict()) == config
    assert ScheduleEntry.from_dict(config.schedule[1].to_dict()) == config.schedule[1]
    hashes = {config.config_hash(), data().config_hash(),
              data(schedule=[{"from_sample": 1801, "weights": {"web": 0, "code": 1}}]).config_hash(),
              data(schedule=[{"from_sample": 1800, "weights": {"web": 0, "code": 2}}]).config_hash()}
    assert len(hashes) == 4


@pytest.mark.parametrize("fields, expected", [
    # literal hashes of packfeed before schedules: packed directories and checkpoints keep matching
    pytest.param({"inputs": ["a.jsonl"], "tokenizer": "tok", "seq_len": 128}, "caafcaa377e2011e", id="plain"),
    pytest.param({"tokenizer": "tok", "seq_len": 64, "samples_per_epoch": 1000, "epochs": 2, "sources": SOURCES},
                 "3996a636b227b377", id="weighted-mixture"),
])
def test_no_schedule_leaves_the_hash_and_the_dict_as_they_were(fields, expected):
    config = DataConfig.from_dict(fields)
    assert config.config_hash() == expected and "schedule" not in config.to_dict()
    assert DataConfig.from_dict({**fields, "schedule": []}).config_hash() == expected


@pytest.mark.parametrize("schedule, message", [
    pytest.param([{"from_sample": 10, "weights": {"web": 1, "cod": 1}}],
                 r"schedule at 10: mixture weights: unknown sources \['cod'\]; the sources are \['web', 'code'\]",
                 id="unknown-source"),
    pytest.param([{"from_sample": 10, "weights": {"web": 1}}],
                 r"sources \['code'\] have no weight; name every source \(a weight of 0 pauses one\)",
                 id="missing-source"),
    pytest.param([{"from_sample": 10, "weights": {"web": -1, "code": 1}}], "'web' must be a finite number >= 0",
                 id="negative"),
    pytest.param([{"from_sample": 10, "weights": {"web": float("nan"), "code": 1}}], "'web' must be a finite number",
                 id="nan"),
    pytest.param([{"from_sample": 10, "weights": {"web": float("inf"), "code": 1}}], "'web' must be a finite number",
                 id="inf"),
    pytest.param([{"from_sample": 10, "weights": {"web": "1", "code": 1}}], "'web' must be a finite number",
                 id="not-a-number"),
    pytest.param([{"from_sample": 10, "weights": {"web": True, "code": 1}}], "'web' must be a finite number",
                 id="bool"),
    pytest.param([{"from_sample": 10, "weights": {"web": 0, "code": 0}}], "every weight is 0", id="all-zero"),
    pytest.param([{"from_sample": -1, "weights": {"web": 1, "code": 1}}], "from_sample must be an integer >= 0",
                 id="negative-position"),
    pytest.param([{"from_sample": 1.5, "weights": {"web": 1, "code": 1}}], "from_sample must be an integer",
                 id="fractional-position"),
    pytest.param([{"from_sample": 10, "weights": {"web": 1, "code": 1}}, {"from_sample": 10, "weights": {"web": 2,
                  "code": 1}}], "strictly increasing from_sample: 10 follows 10", id="same-position"),
    pytest.param([{"from_sample": 20, "weights": {"web": 1, "code": 1}}, {"from_sample": 10, "weights": {"web": 2,
                  "code": 1}}], "strictly increasing from_sample: 10 follows 20", id="decreasing"),
    pytest.param([{"from_sample": 10}], r"\[\[data.schedule\]\]: missing `weights`", id="no-weights"),
    pytest.param([{"weights": {"web": 1, "code": 1}}], "missing `from_sample`", id="no-position"),
    pytest.param([{"from_sample": 10, "weights": {"web": 1, "code": 1}, "weight": 2}], r"unknown keys \['weight'\]",
                 id="unknown-key"),
    pytest.param([{"from_sample": 10, "weights": [1, 2]}], "weights must be a table of source name = weight",
                 id="weights-as-list"),
    pytest.param({"from_sample": 10}, r"schedule must be a list of tables \(\[\[data.schedule\]\]", id="one-table"),
])
def test_bad_schedules_are_value_errors_that_say_what_to_fix(schedule, message):
    with pytest.raises(ValueError, match=message):
        data(schedule=schedule)


def test_check_schedule_weights_gives_the_sources_order_and_refuses_bad_weights():
    assert check_schedule_weights({"b": 2, "a": 0}, ["a", "b"]) == {"a": 0.0, "b": 2.0}
    assert list(check_schedule_weights({"b": 2, "a": 0}, ["a", "b"])) == ["a", "b"]
    for bad in ({"a": 1}, {"a": 1, "b": 1, "c": 1}, {"a": 0, "b": 0}, {"a": -0.5, "b": 1}, {}):
        with pytest.raises(ValueError, match="mixture weights"):
            check_schedule_weights(bad, ["a", "b"])


# ---- the windows under a schedule --------------------------------------------------------------
def test_golden_worked_example():
    """epochs.py's docstring: T = 12, W = 4, counts (6, 6); from sample 4 weights (0, 1)."""
    epochs = ScheduledEpochs(window_bounds([6, 6], 4), window=4, epochs=2, changes=[(4, (0, 1))])
    windows = [(hi - lo).tolist() for _, lo, hi in map(epochs.window_range, range(6))]
    assert windows == [[2, 2], [0, 4], [0, 4], [0, 4], [0, 4], [0, 4]]
    assert [epochs.window_start(k) for k in range(6)] == [0, 4, 8, 12, 16, 20]
    assert [epochs.stage_of(k) for k in range(6)] == [0, 1, 1, 1, 1, 1] and epochs.effective_windows == [1]
    # source 1 continues where it was: positions 2.. in window 1, 14.. in epoch 2 (no gap)
    assert epochs.window_range(1)[1].tolist() == [2, 2] and epochs.window_range(3)[1].tolist() == [2, 10]
    # an entry inside window 1 (sample 5) waits for window 2, the first to start at or after it
    later = ScheduledEpochs(window_bounds([6, 6], 4), window=4, epochs=1, changes=[(5, (1, 0))])
    assert [(hi - lo).tolist() for _, lo, hi in map(later.window_range, range(3))] == [[2, 2], [2, 2], [4, 0]]


def test_golden_the_last_window_is_never_emptied():
    """T = 28 in windows of 3: the last window is 1 sample. Under equal weights (counts 10, 9, 9)
    every boundary rounds to the epoch's end at window 9: source 0, the largest, gives it one."""
    epochs = ScheduledEpochs(window_bounds([1, 1, 26], 3), window=3, epochs=1, changes=[(0, (1, 1, 1))])
    windows = [(hi - lo).tolist() for _, lo, hi in map(epochs.window_range, range(10))]
    assert windows[-3:] == [[1, 1, 1], [0, 1, 1], [1, 0, 0]] and sum(map(sum, windows)) == 28


def sweep_changes(draw_weights, samples: int):
    return st.lists(st.tuples(st.integers(0, samples), draw_weights), max_size=4).map(
        lambda xs: sorted({f: w for f, w in xs}.items()))


@st.composite
def schedules(draw):
    counts = draw(st.lists(st.integers(1, 300), min_size=1, max_size=4))
    window = draw(st.integers(len(counts), 80))
    epochs = draw(st.integers(1, 3))
    weights = st.lists(st.sampled_from([0, 0, 0.5, 1, 3]), min_size=len(counts), max_size=len(counts)).filter(any)
    changes = draw(sweep_changes(weights, epochs * sum(counts) + 20))
    return counts, window, epochs, changes


def build(counts, window, epochs, changes):
    return ScheduledEpochs(window_bounds(counts, window), window=window, epochs=epochs, changes=changes)


@settings(max_examples=300, deadline=None)
@given(case=schedules())
def test_windows_under_a_schedule_keep_the_contract(case):
    counts, window, epochs, changes = case
    try:
        plan = build(counts, window, epochs, changes)
    except ValueError as exc:  # only a stage's first window, of about W samples, can come out empty
        assert "empty" in str(exc) and window < 2 * len(counts)
        return
    base = window_bounds(counts, window)
    K, T, S = len(base) - 1, sum(counts), len(counts)
    ranges = [plan.window_range(k) for k in range(K * epochs)]
    # the windows stay where they are: K per epoch, T samples per epoch, every window non-empty
    for e in range(epochs):
        assert sum(int((hi - lo).sum()) for _, lo, hi in ranges[e * K:(e + 1) * K]) == T
    assert all((hi - lo).sum() > 0 and (hi >= lo).all() for _, lo, hi in ranges)
    # every source's positions run on without a gap, across stages and epochs
    for (_, _, hi), (_, lo, _) in zip(ranges, ranges[1:]):
        assert (hi == lo).all()
    # each change takes effect at the first window starting at or after it (or is overtaken)
    starts = [plan.window_start(k) for k in range(K * epochs)] + [epochs * T]
    for i, (f, _) in enumerate(changes):
        k = plan.effective_windows[i]
        first = next((j for j in range(K * epochs) if starts[j] >= f), K * epochs)
        assert k == first, (i, f, k, first)
    # within one sample of the stage's share in every window: the rest of the epoch shared out
    # by the stage's weights (largest remainder) and each boundary within 1/2 of its exact share
    for k, (e, lo, hi) in enumerate(ranges):
        stage = plan.stage_of(k)
        if stage:
            assert (hi - lo)[np.asarray(changes[stage - 1][1]) == 0].sum() == 0, "weight 0 pauses a source"
        j = k % K
        stage_start = max(e * K, plan.effective_windows[stage - 1] if stage else 0)
        if j == 0 or k == stage_start:
            continue
        run = plan.run_of(e)
        b0 = run.bounds[stage_start - e * K]
        p0 = int(b0.sum())
        c = apportion(T - p0, changes[stage - 1][1]) if stage else np.asarray(counts)
        if stage and changes[stage - 1][1]:
            exact = np.asarray(changes[stage - 1][1]) / sum(changes[stage - 1][1]) * (T - p0)
            assert (abs(c - exact) < 1).all()
        for s in range(S):
            got = int(run.bounds[j, s] - b0[s])
            exact = Fraction((j * window - p0) * int(c[s]), T - p0)
            if j == K - 1 and abs(got - exact) > Fraction(1, 2):  # the epoch's last window kept non-empty
                assert s == int(np.argmax(c)) and abs(got + 1 - exact) <= Fraction(1, 2), (k, s)
                assert (run.bounds[K] - run.bounds[K - 1]).sum() == 1
                continue
            assert abs(got - exact) <= Fraction(1, 2), (k, s)


@settings(max_examples=200, deadline=None)
@given(case=schedules())
def test_an_entry_changes_no_window_before_its_own(case):
    counts, window, epochs, changes = case
    try:
        full = build(counts, window, epochs, changes)
    except ValueError:
        return
    for i in range(len(changes)):
        before = build(counts, window, epochs, changes[:i])
        for k in range(full.effective_windows[i]):  # num_windows for an entry past the end
            a, b = full.window_range(k), before.window_range(k)
            assert a[0] == b[0] and (a[1] == b[1]).all() and (a[2] == b[2]).all(), (i, k)


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(1, 2_000_000), min_size=1, max_size=5), window=st.integers(64, 8192),
       epochs=st.integers(1, 4))
def test_no_schedule_is_the_plain_window_bounds_every_epoch(counts, window, epochs):
    """Counts of up to 2M per source: most examples stay under 20,000 windows and are checked
    (counts of 10^9 made every example a table of 10^5-10^7 windows, built and then skipped)."""
    if -(-sum(counts) // window) * epochs > 20_000:
        return
    base = window_bounds(counts, window)
    plan = build(counts, window, epochs, [])
    assert len(plan.runs) == 1 and plan.runs[0].bounds is plan.base_bounds
    k = len(base) - 2 + (len(base) - 1) * (epochs - 1)  # a window of the last epoch
    e, lo, hi = plan.window_range(k)
    assert (lo == (epochs - 1) * np.asarray(counts) + base[-2]).all() and (hi - lo == base[-1] - base[-2]).all()


def test_a_schedule_at_scale_is_cheap_and_exact():
    """10^11 samples per epoch in windows of 2^20 (95k an epoch): an entry in epoch 2 costs one
    table of that epoch; products of 10^11-sized counts stay exact integers."""
    counts = [6 * 10**10, 4 * 10**10]
    base = window_bounds(counts, 1 << 20)  # 95k windows
    plan = build(counts, 1 << 20, 3, [(15 * 10**10, (1, 3))])
    assert len(plan.runs) == 3 and np.array_equal(plan.runs[0].bounds, base)
    k = plan.effective_windows[0]
    assert plan.window_start(k) >= 15 * 10**10 > plan.window_start(k - 1)
    e, lo, hi = plan.window_range(k + 5)
    assert e == 1 and abs(int((hi - lo)[1]) - (1 << 20) * 3 / 4) < 1.5
    assert int(sum(r.num_epochs * r.bounds[-1].sum() for r in plan.runs)) == 3 * 10**11
