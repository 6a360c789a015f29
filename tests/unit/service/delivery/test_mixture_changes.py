"""Online mixture changes (service/delivery/mixture_changes.py) over a real plan of small files.

Checked, over sweeps of where the readers and a previous server are:

* a change starts at the first window not yet planned (one past the highest window handed out
  or known to the manifest), at ``from_sample`` = that window's start; the windows before it are
  the same, and the plan is exactly the plan of the config with the change as a
  ``[[data.schedule]]`` entry (what ``packfeed pack --config`` packs);
* the calls of one step make one change and all get its answer, also concurrently;
* bad weights raise ValueError and change nothing (no plan, no record);
* a reader packing with a stale plan starts again at the change's window with the new plan,
  with continuous row numbers, and never hands out a stale window;
* the manifest records the change atomically and a restarted server replays it; one that
  cannot be recorded is not made; a client's recorded changes are checked.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from types import SimpleNamespace

import pytest

from packfeed.service.data.config import DataConfig, ScheduleEntry, SourceConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.delivery.manifest import Manifest
from packfeed.service.delivery.mixture_changes import (
    MixtureChange,
    MixtureRefused,
    merged_schedule,
    read_with_changes,
)
from packfeed.service.delivery.row_stream import mixture_control

WINDOW, ROWS, EPOCHS = 10, 60, 2  # two sources of 60 rows, repeat 1: 12 windows per epoch, 24 in all
NEW = {"web": 0.0, "code": 1.0}


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sources")
    sources = []
    for name in ("web", "code"):
        path = directory / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"text": f"{name}-{i}"}) + "\n" for i in range(ROWS)))
        sources.append(SourceConfig(name=name, paths=(str(path),)))
    config = DataConfig(sources=tuple(sources), tokenizer="-", seq_len=8, epochs=EPOCHS, window_samples=WINDOW,
                        block_samples=4)
    return config, build_plan(config)


def control_at(planned, *, started: int, known: int, path=None):
    """A MixtureControl whose readers handed out windows 0..started and whose manifest knows
    windows 0..known (a previous server's)."""
    config, plan = planned
    control = mixture_control(config, plan)
    manifest = Manifest("key", path)
    for w in range(known + 1):
        manifest.record(w, 100 * w)
    control.attach(manifest)
    for w in range(started + 1):
        assert control.admit(w, 0)
    return control, manifest


def windows(plan) -> list:
    return [plan.window(k) for k in range(plan.num_windows)]


@pytest.mark.parametrize("started,known", [(-1, 0), (0, 0), (3, 0), (3, 7), (11, 2), (15, 15), (0, 20)])
def test_a_change_starts_at_the_first_window_not_planned_and_is_the_scheduled_plan(planned, started, known):
    config, plan = planned
    control, manifest = control_at(planned, started=started, known=known)
    change = control.change(7, NEW)
    window = max(started, known) + 1
    assert (change.step, change.window, dict(change.weights)) == (7, window, NEW)
    assert change.from_sample == plan.window_start_sample(window) == window * WINDOW
    _, new_config, new_plan = control.current()
    old, new = windows(plan), windows(new_plan)
    assert new[:window] == old[:window], "no window already planned changes"
    assert all(new_plan.window_counts(k)[0] == 0 for k in range(window, plan.num_windows)), "web paused from there"
    assert any(plan.window_counts(k)[0] > 0 for k in range(window, plan.num_windows)), "a change that changes nothing"
    scheduled = dataclasses.replace(config, schedule=(ScheduleEntry(from_sample=change.from_sample, weights=NEW),))
    assert new_config == scheduled and windows(build_plan(scheduled)) == new, "what packfeed pack --config packs"
    assert manifest.mixture == [change.to_dict()] and manifest.to_dict()["mixture"] == [change.to_dict()]


def test_the_calls_of_one_step_make_one_change_with_one_answer(planned):
    control, _ = control_at(planned, started=2, known=0)
    answers, start = [], threading.Barrier(8)

    def rank(r: int) -> None:
        start.wait()
        answers.append(control.change(5, {"web": float(r), "code": 1.0}))  # each rank its own idea

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 8 and len(set(map(repr, answers))) == 1 and control.changes == [answers[0]]
    assert control.change(5, NEW) == answers[0], "a late rank of the same step gets the same answer"
    later = control.change(6, NEW)  # the reader did not move: the same window, the later weights win there
    assert later.window == answers[0].window and control.changes == [answers[0], later]
    assert [dict(e.weights) for e in control.schedule] == [NEW] and control.index_of(later) == 0


@pytest.mark.parametrize("weights,match", [
    pytest.param({"web": 1.0, "cod": 1.0}, "unknown sources", id="unknown-source"),
    pytest.param({"web": -1.0, "code": 1.0}, ">= 0", id="negative"),
    pytest.param({"web": math.nan, "code": 1.0}, "finite", id="nan"),
    pytest.param({"web": math.inf, "code": 1.0}, "finite", id="inf"),
    pytest.param({"web": 0.0, "code": 0.0}, "every weight is 0", id="all-zero"),
    pytest.param({"web": 1.0}, "have no weight", id="a-source-left-out"),
    pytest.param({"web": "1", "code": 1.0}, "finite number", id="not-a-number"),
    pytest.param({}, "non-empty", id="empty"),
])
def test_bad_weights_raise_and_change_nothing(planned, weights, match):
    control, manifest = control_at(planned, started=1, known=0)
    before = control.current()
    with pytest.raises(ValueError, match=match):
        control.change(3, weights)
    assert control.current() == before and control.changes == [] and manifest.mixture == []
    made = control.change(3, NEW)
    assert made.window == 2, "the stream goes on and the step can still change it"
    with pytest.raises(ValueError, match=match):
        control.change(3, weights)  # also at a step already changed: an error, not the earlier answer
    assert control.changes == [made]


def test_no_change_once_every_window_is_planned(planned):
    _, plan = planned
    control, _ = control_at(planned, started=plan.num_windows - 1, known=0)
    with pytest.raises(MixtureRefused, match="every window of the stream is planned"):
        control.change(1, NEW)
    ended, manifest = control_at(planned, started=0, known=0)
    manifest.record_end(1000)
    with pytest.raises(MixtureRefused):
        ended.change(1, NEW)
    with pytest.raises(ValueError, match="step must be an integer >= 0"):
        ended.change(-1, NEW)


class Reader:
    """A fake pipeline per plan: yields (window, rows) with rows of the window's sample count,
    in two blocks, reading ahead of what it hands out as a pipeline does; records its starts."""

    def __init__(self) -> None:
        self.starts, self.closed = [], 0

    def __call__(self, config, plan, window, first_row):
        self.starts.append((plan, window, first_row))
        try:
            for k in range(window, plan.num_windows):
                n = int(plan.window_counts(k).sum())
                for part in (n // 2, n - n // 2):
                    yield k, SimpleNamespace(num_rows=part, plan=plan, counts=tuple(plan.window_counts(k)))
        finally:
            self.closed += 1


@pytest.mark.parametrize("after", [0, 1, 2, 5, 23])
def test_a_stale_reader_starts_again_at_the_change_window_with_the_new_plan(planned, after):
    """``after`` blocks are handed out before the change (two blocks per window)."""
    _, plan = planned
    control, _ = control_at(planned, started=-1, known=0)
    reader = Reader()
    stream = read_with_changes(control, reader, 0, 0)
    got = [next(stream) for _ in range(after)]
    change = control.change(9, NEW)
    got += list(stream)
    _, _, new_plan = control.current()
    # a window partly handed out is planned; window 0 always is (the config sets the start's weights)
    assert change.window == max(1, (after + 1) // 2)
    assert [w for w, _ in got] == [k for k in range(plan.num_windows) for _ in (0, 1)], "every block once, in order"
    assert all(rows.plan is new_plan for w, rows in got if w >= change.window), "never a stale window"
    assert all(rows.counts == tuple(new_plan.window_counts(w)) for w, rows in got)
    if after == 0:  # not started yet: the first reader has the new plan
        assert [(p is new_plan, w, r) for p, w, r in reader.starts] == [(True, 0, 0)]
        return
    assert [(p is new_plan, w) for p, w, _ in reader.starts] == [(False, 0), (True, change.window)]
    assert reader.starts[1][2] == sum(rows.num_rows for w, rows in got if w < change.window), "rows keep counting"
    assert reader.closed == 2


def test_the_manifest_records_the_change_and_a_restarted_server_replays_it(planned, tmp_path):
    path = tmp_path / "state" / "key.json"
    control, manifest = control_at(planned, started=4, known=2, path=path)
    first = control.change(11, NEW)
    second = control.change(12, {"web": 2.0, "code": 1.0})  # same window: replaces the first's weights there
    manifest.record(9, 900)  # windows learnt later are appended after the whole-file write
    with open(path, "a") as f:
        f.write('{"w": 10, "r"')  # a torn last line (a killed server)
    again = Manifest("key", path)
    assert again.mixture == [first.to_dict(), second.to_dict()] and again.first_row[9] == 900
    config, plan = planned
    replayed = mixture_control(config, plan)
    replayed.attach(again)
    assert replayed.changes == [first, second] and replayed.schedule == control.schedule
    assert windows(replayed.current()[2]) == windows(control.current()[2])
    assert replayed.change(12, NEW) == second, "a step already recorded keeps its answer after a restart"
    assert replayed.change(13, NEW).window == 10, "windows the killed server reached count as planned"
    assert Manifest("other-stream", path).mixture == [], "another stream's file is not trusted"


def test_a_change_that_cannot_be_recorded_is_not_made(planned, tmp_path):
    (tmp_path / "file").write_text("")
    control, manifest = control_at(planned, started=0, known=0, path=tmp_path / "file" / "key.json")
    before = control.current()
    with pytest.raises(OSError):
        control.change(1, NEW)
    assert control.current() == before and control.changes == [] and manifest.mixture == []


def test_a_client_record_must_be_one_the_stream_made(planned):
    control, _ = control_at(planned, started=0, known=0)
    made = control.change(4, NEW)
    control.check_recorded([])
    control.check_recorded([MixtureChange.from_dict(made.to_dict())])
    for other in (dataclasses.replace(made, step=5), dataclasses.replace(made, from_sample=made.from_sample + 10),
                  dataclasses.replace(made, weights={"web": 1.0, "code": 1.0})):
        with pytest.raises(ValueError, match="restart the server with the state dir"):
            control.check_recorded([other])


def test_golden_merged_schedule():
    """Config entries at 0 and 5000, changes at 3000 then 5000 (the docstring's example)."""
    def entry(f, w):
        return ScheduleEntry(from_sample=f, weights=w)

    base = [entry(0, {"a": 1}), entry(5000, {"a": 2})]
    changes = [MixtureChange(1, 3000, 3, {"a": 3}), MixtureChange(2, 5000, 5, {"a": 4})]
    got = merged_schedule(base, changes, entry)
    assert [(e.from_sample, dict(e.weights)) for e in got] == [(0, {"a": 1}), (3000, {"a": 3}), (5000, {"a": 4})]
    # a later change that starts earlier (the consumers were behind the first's window) supersedes it
    later_first = [MixtureChange(1, 6000, 6, {"a": 3}), MixtureChange(2, 4000, 4, {"a": 4})]
    got = merged_schedule(base, later_first, entry)
    assert [(e.from_sample, dict(e.weights)) for e in got] == [(0, {"a": 1}), (4000, {"a": 4}), (5000, {"a": 2})]
    from packfeed.client.mixture_record import schedule_toml

    assert "from_sample = 6000" not in schedule_toml([c.to_dict() for c in later_first]), "the TOML says the same"


@pytest.mark.parametrize("record,match", [
    pytest.param([], "a mixture change is a dict", id="not-a-dict"),
    pytest.param({"step": 1, "from_sample": 2, "window": 0, "weights": {}}, "'weights'", id="no-weights"),
    pytest.param({"step": -1, "from_sample": 2, "window": 0, "weights": {"a": 1}}, "'step'", id="negative-step"),
    pytest.param({"step": 1, "from_sample": 2.0, "window": 0, "weights": {"a": 1}}, "'from_sample'", id="float"),
    pytest.param({"step": 1, "from_sample": 2, "window": 0, "weights": {"a": 1}, "x": 1}, "unknown", id="extra"),
])
def test_a_bad_change_record_is_refused_naming_the_field(record, match):
    with pytest.raises(ValueError, match=match):
        MixtureChange.from_dict(record)
