"""The driver's head start without Ray (packjob/head_start.py): the bundled corpus packed by
``HeadStart.run`` in a thread, the row ledger a dictionary with RowLedger's claim rule (the first
claim wins; the actors' holds for every actor). Checked: the files equal each window packed and
written on its own, numbered from the rows before it; nothing is written before ``release``;
the held rows stay under their bound; at the hand-over the driver keeps a prefix of the windows
and stops at the first an actor claimed, publishing where its last one ends; its pace, and the
share of a core it gets, decide whether Ray and actors start; a failure (of a window or of a
write) is raised, and published for the actor that would wait on it.
(The same with Ray and actors: tests/integration/pack/test_head_start.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from support.head_start import bundled_setup, start_head

from packfeed.client.rows import renumber_rows
from packfeed.service import faults
from packfeed.service.faults import FAULTS_ENV, FaultInjected
from packfeed.service.packed.writer import write_part
from packfeed.service.packjob.head_start import MIN_FREE_SHARE, free_share, ray_budget
from packfeed.service.packed.part_sink import part_name
from packfeed.service.pipeline.window import process_window, window_tokenizers


class MemoryLedger:
    """RowLedger's claim, publish and fail over a dictionary (what the GCS store holds)."""

    def __init__(self, claimed_by_actors=()) -> None:
        self.claims = {k: "actors" for k in claimed_by_actors}
        self.ends: dict[int, int | str] = {}
        self.lock = threading.Lock()

    def claim(self, window: int, who: str) -> bool:
        with self.lock:
            return self.claims.setdefault(window, who) == who

    def publish(self, window: int, end_row: int) -> None:
        self.ends[window] = end_row

    def fail(self, window: int, why: str) -> None:
        self.ends[window] = "failed: " + why


@pytest.fixture(scope="module")
def setup():
    return bundled_setup()


@pytest.fixture(scope="module")
def expected(setup, tmp_path_factory):
    """Every window packed and written on its own (what the actors write): file bytes by name,
    and where each window ends."""
    config, plan, shipped = setup
    out = tmp_path_factory.mktemp("expected")
    tokenizers = window_tokenizers(config, plan, shipped, threads=1)
    files, ends, first = {}, [], 0
    for k in range(plan.num_windows):
        rows, _ = process_window(plan.window(k), tokenizers, config, plan)
        write_part(str(out / part_name(k, plan.num_windows)), renumber_rows(rows, first), seq_len=config.seq_len,
                   config_hash=config.config_hash())
        first += rows.num_rows
        ends.append(first)
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    return files, ends


def test_alone_the_driver_writes_every_window_as_the_actors_would_and_only_once_released(setup, expected, tmp_path):
    _, plan, _ = setup
    head, thread = start_head(setup, tmp_path)
    with head._cond:
        head._cond.wait_for(lambda: head._packed == plan.num_windows, 60)
    assert not list(tmp_path.iterdir()), "nothing is written before every check passed"
    assert head.hand_over(MemoryLedger(), actors_start_s=60.0) is None, "done sooner than actors could start"
    head.release()
    windows = [head.window(k) for k in range(plan.num_windows)]
    thread.join(30)
    files, ends = expected
    assert {p.name: p.read_bytes() for p in sorted(tmp_path.iterdir())} == files
    assert [w.window for w in windows] == list(range(plan.num_windows))
    assert np.cumsum([w.num_rows for w in windows]).tolist() == ends
    assert sum(w.stats.rows for w in windows) == ends[-1] and all(w.written_at > 0 for w in windows)


def test_the_held_rows_stay_under_their_bound_until_released(setup, tmp_path):
    head, thread = start_head(setup, tmp_path, max_held_tokens=1)
    with head._cond:  # one window is over the bound: the driver waits after it
        assert head._cond.wait_for(lambda: head._packed == 1, 60)
        assert not head._cond.wait_for(lambda: head._next > 1, 1.0), "it claimed a window past the bound"
    head.release()
    head.window(setup[1].num_windows - 1)  # the rest, written as they are packed
    thread.join(30)


@pytest.mark.parametrize("actors_from", [1, 3, 7])
def test_after_the_hand_over_the_driver_keeps_a_prefix_and_publishes_its_end(setup, expected, tmp_path, actors_from):
    """The actors claimed every window from ``actors_from`` on before the driver got there."""
    _, plan, _ = setup
    head, thread = start_head(setup, tmp_path, max_held_tokens=1)  # it waits after window 0: the hand-over finds it there
    with head._cond:
        assert head._cond.wait_for(lambda: head._packed == 1, 60)
    ledger = MemoryLedger(claimed_by_actors=range(actors_from, plan.num_windows))
    first_for_actors = head.hand_over(ledger, actors_start_s=0.0)
    assert first_for_actors == 1, "window 0 was the driver's before Ray was up"
    head.release()
    thread.join(60)
    files, ends = expected
    assert head._packed == actors_from, "the driver stops at the first window an actor claimed"
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == [part_name(k, plan.num_windows) for k in range(actors_from)]
    assert all((tmp_path / name).read_bytes() == files[name] for name in written)
    assert ledger.ends[actors_from - 1] == ends[actors_from - 1], "the actor after it gets the driver's end"
    assert {k for k, who in ledger.claims.items() if who == "driver"} == set(range(1, actors_from))


def test_a_failure_before_the_hand_over_is_raised_there(setup, tmp_path, monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, "packer-window:1")
    monkeypatch.setattr(faults, "_fired", set())  # a fault fires once per process
    head, thread = start_head(setup, tmp_path)
    thread.join(60)
    with pytest.raises(FaultInjected, match="packer-window:1"):
        head.hand_over(MemoryLedger())
    assert not list(tmp_path.iterdir())


def test_a_failure_after_the_hand_over_is_published_for_the_next_window(setup, tmp_path, monkeypatch):
    _, plan, _ = setup
    assert plan.num_windows > 3, "a window after the failed one, for an actor to wait on"
    monkeypatch.setenv(FAULTS_ENV, "packer-window:2")
    monkeypatch.setattr(faults, "_fired", set())
    head, thread = start_head(setup, tmp_path, max_held_tokens=1)
    with head._cond:
        assert head._cond.wait_for(lambda: head._packed == 1, 60)
    ledger = MemoryLedger()
    assert head.hand_over(ledger, actors_start_s=0.0) == 1
    head.release()
    thread.join(60)
    assert isinstance(head.error, FaultInjected)
    assert str(ledger.ends[2]).startswith("failed: the driver could not pack windows up to 2"), ledger.ends
    head.window(1)  # written before the failure
    with pytest.raises(FaultInjected):
        head.window(2)


def test_abandoned_it_packs_and_writes_no_more(setup, tmp_path):
    head, thread = start_head(setup, tmp_path, max_held_tokens=1)
    with head._cond:
        assert head._cond.wait_for(lambda: head._packed == 1, 60)
    head.abandon()
    thread.join(30)
    assert not thread.is_alive() and head._packed == 1 and not list(tmp_path.iterdir())


@pytest.mark.parametrize("budget_s, wants", [(0.0, True), (3600.0, False)])
def test_before_any_ray_its_pace_says_whether_ray_is_worth_starting(setup, tmp_path, budget_s, wants):
    _, plan, _ = setup
    head, thread = start_head(setup, tmp_path)
    assert head.wants_ray(budget_s) is wants
    if not wants:
        with head._cond:  # no Ray: the driver goes on with every window
            assert head._cond.wait_for(lambda: head._packed == plan.num_windows, 60)
    head.abandon()
    thread.join(30)


def test_a_slow_first_window_starts_ray_before_it_ends(setup, tmp_path, monkeypatch):
    """Window 0 takes 3 s: after ~budget / (windows - 1) the windows after it would already
    take longer than the budget, so Ray is wanted while window 0 still packs. The rest of the
    machine is read as idle here: on a machine others keep busy actors never pay off, and the
    head start rightly waits for the window (test_beside_busy_processes... holds that case)."""
    from packfeed.service.packjob import head_start
    from packfeed.service.pipeline import window

    _, plan, _ = setup
    monkeypatch.setattr(head_start, "others_cpu_seconds", lambda: 0.0)
    slow_done = threading.Event()

    def slow(spec, *args, **kwargs):
        if spec.index == 0:
            slow_done.wait(3.0)
        return process_window(spec, *args, **kwargs)

    monkeypatch.setattr(window, "process_window", slow)
    head, thread = start_head(setup, tmp_path)
    budget_s = 0.2 * (plan.num_windows - 1)  # wanted once window 0 has taken 0.2 s
    assert head.wants_ray(budget_s) is True
    assert head._packed == 0 and not slow_done.is_set(), "decided before the first window ended"
    slow_done.set()
    head.abandon()
    thread.join(30)


def test_the_budget_grows_as_the_rest_of_the_machine_leaves_less_free():
    frees = [1.2, 1.0, 0.9, 0.5, 0.3, 0.25, 0.1, 0.0, -0.5]  # less and less of the machine free
    budgets = [ray_budget(9.0, free) for free in frees]
    assert budgets == sorted(budgets), "never smaller on a busier machine"
    assert budgets[0] == budgets[1] == 9.0 < budgets[2], "an idle machine: the budget as measured"
    assert ray_budget(9.0, 0.5) == pytest.approx(18.0), "half the machine free: twice as long"
    assert budgets[-1] == budgets[-4] == 9.0 / MIN_FREE_SHARE, "bounded: a busy machine still decides"


def test_the_free_share_counts_what_other_processes_used():
    cores = os.cpu_count()
    assert free_share(0.0, 2.0) == 1.0 and free_share(2.0 * cores, 2.0) == 0.0
    assert free_share(cores, 2.0) == pytest.approx(0.5)


def test_beside_busy_processes_the_driver_wants_no_ray_sooner(setup, tmp_path):
    """Busy loops on every core while the driver packs window 0 (then it waits: the held rows'
    bound): the rest of the machine left under half of it free, so a budget of 0.6 x the time
    the windows left would take at its pace is grown past it (no Ray), and one under
    MIN_FREE_SHARE of that is not (Ray)."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.5)  # they run
        head, thread = start_head(setup, tmp_path, max_held_tokens=1)
        with head._cond:
            assert head._cond.wait_for(lambda: head._packed == 1, 60)
    finally:
        for p in busy:
            p.kill()
    assert free_share(head._pack_others, head._pack_seconds) < 0.5, "the busy loops were seen"
    left = (setup[1].num_windows - 1) * head._pack_seconds  # the windows left at its pace
    assert head.wants_ray(0.6 * left) is False  # beside busy loops no CPU is left for actors: no Ray, ever
    assert head.wants_ray(0.9 * MIN_FREE_SHARE * 0.6 * left) is False  # (measured: 50 s with Ray, 16 s without)
    head.abandon()
    thread.join(30)


def test_a_failed_first_window_wants_no_ray_and_keeps_its_error(setup, tmp_path, monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, "packer-window:0")
    monkeypatch.setattr(faults, "_fired", set())
    head, thread = start_head(setup, tmp_path)
    assert head.wants_ray(3600.0) is False and isinstance(head.error, FaultInjected)
    thread.join(30)
    assert not list(tmp_path.iterdir())


def test_a_failed_write_stops_the_packing_and_is_raised(setup, tmp_path, monkeypatch):
    """The writes run in their own thread: one that fails ends the driver's packing too."""
    from packfeed.service.packjob import head_start

    _, plan, _ = setup
    write = head_start.write_part

    def failing(uri, rows, **kwargs):
        if uri.endswith(part_name(1, plan.num_windows)):
            raise OSError("disk full")
        return write(uri, rows, **kwargs)

    monkeypatch.setattr(head_start, "write_part", failing)
    head, thread = start_head(setup, tmp_path, max_held_tokens=1)
    head.release()
    head.window(0)
    with pytest.raises(OSError, match="disk full"):
        head.window(1)
    thread.join(30)
    assert not thread.is_alive() and head._claim() is None, "the driver claims no more windows"
