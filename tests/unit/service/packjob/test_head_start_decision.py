"""When the head start starts Ray (packjob/head_start.py, ``actors_pay_off_after``): only when Ray
and packing actors end the run sooner than the driver alone, which packs on, slowed, while they
start, and then shares what is left with them. Pure: the machine is given as numbers.

Issue: a 15M-token corpus with the HF back-end started Ray (6.3 s of 2 cores) and the driver
still packed all 13 windows; the rule was "the driver would not be done before Ray and the actors
are up", as if the actors then packed everything left at once."""

from __future__ import annotations

import itertools
import math
import time

import pytest
from support.head_start import bundled_setup, start_head

from packfeed.service.packjob.head_start import (
    ACTORS_START_S,
    RAY_START_S,
    actors_pay_off_after,
)

IDLE_2 = {"cpus": 2, "free": 1.0, "driver_cores": 1.0, "actor_cpus": 2, "windows": 8}


@pytest.mark.parametrize("machine, start_s, after", [
    pytest.param(IDLE_2, 5.7, 35.625, id="2-idle-cores-fast-driver-on-one"),
    pytest.param({**IDLE_2, "cpus": 16, "actor_cpus": 16, "windows": 64}, 5.7, 5.7, id="16-idle-cores"),
    pytest.param({**IDLE_2, "free": 0.33, "driver_cores": 0.66}, 5.7, math.inf, id="a-busy-machine-leaves-no-cpu"),
    pytest.param({**IDLE_2, "driver_cores": 1.9}, 5.7, math.inf, id="a-driver-already-on-every-core"),
    pytest.param({**IDLE_2, "windows": 1}, 5.7, math.inf, id="one-window-left-is-one-process's"),
    pytest.param({**IDLE_2, "cpus": 4, "actor_cpus": 1}, 5.7, 10.6875, id="one-actor-on-4-cores-beside-a-freer-start"),
    pytest.param(IDLE_2, 0.0, 0.0, id="nothing-to-wait-for-the-drills"),
])
def test_golden_break_even(machine, start_s, after):
    assert actors_pay_off_after(start_s, **machine) == pytest.approx(after)


SWEEP = list(itertools.product([1.0, 2.7, 5.7, 30.0],  # start_s
                               [1, 2, 4, 16],  # cpus
                               [0.1, 0.5, 0.8, 1.0],  # free
                               [0.3, 1.0, 1.8],  # driver_cores
                               [0.5, 1, 2, 16],  # actor_cpus
                               [1, 3, 8, 100]))  # windows


def after(start_s, cpus, free, driver, actors, windows):
    return actors_pay_off_after(start_s, cpus=cpus, free=free, driver_cores=driver, actor_cpus=actors, windows=windows)


ROUNDING = 1 + 1e-9


def test_ray_never_starts_for_a_driver_done_before_the_actors_are_up():
    """Whatever the machine, the driver's seconds left must exceed the start itself."""
    finite = 0
    for start_s, cpus, free, driver, actors, windows in SWEEP:
        threshold = after(start_s, cpus, free, driver, actors, windows)
        assert threshold * ROUNDING >= start_s, (start_s, cpus, free, driver, actors, windows)
        finite += threshold < math.inf
    assert finite > len(SWEEP) // 10, "the sweep covers machines where actors pay off"


def test_more_of_the_machine_never_makes_actors_pay_off_later():
    for start_s, cpus, free, driver, actors, windows in SWEEP:
        base = after(start_s, cpus, free, driver, actors, windows)
        assert after(start_s * 2, cpus, free, driver, actors, windows) * ROUNDING >= base, "a slower start"
        assert after(start_s, cpus, min(1.0, free + 0.2), driver, actors, windows) <= base * ROUNDING, "a freer machine"
        assert after(start_s, cpus, free, driver, actors * 2, windows) <= base * ROUNDING, "more actors"
        assert after(start_s, cpus, free, driver, actors, windows + 1) <= base * ROUNDING, "more windows to share"


def test_what_started_ray_still_starts_the_actors_at_the_hand_over():
    """``wants_ray`` asks about Ray's start and the actors' (RAY_START_S + ACTORS_START_S); at the
    hand-over the driver has packed on through Ray's start, slowed, and the question is asked of
    the actors alone (ACTORS_START_S). A driver whose pace held would not find them too late: Ray
    is never started for actors the hand-over then does without (the issue's 13 windows)."""
    from packfeed.service.packjob.head_start import START_CPUS, ray_budget

    checked = 0
    for _, cpus, free, driver, actors, windows in SWEEP:
        before = after(RAY_START_S + ACTORS_START_S, cpus, free, driver, actors, windows)
        if before == math.inf:
            continue
        drivers = min(cpus * min(1.0, max(0.25, free)), max(0.1, driver))
        ray_s = ray_budget(RAY_START_S * max(1.0, (drivers + START_CPUS) / cpus), free)
        slowed = min(1.0, cpus * min(1.0, max(0.25, free)) / (drivers + START_CPUS))
        for margin in (1.001, 1.5, 4.0):  # driver seconds left when wants_ray decided
            left_s = before * margin
            pace = left_s / windows
            packed_meanwhile = min(windows - 1, int(slowed * ray_s / pace))  # whole windows only
            later = left_s - packed_meanwhile * pace
            assert later > after(ACTORS_START_S, cpus, free, driver, actors, windows - packed_meanwhile), \
                (cpus, free, driver, actors, windows, margin)
            checked += 1
    assert checked > 100


# ---- the driver's pace: window 0 carries the run's one-time costs -----------------------------------
@pytest.fixture(scope="module")
def bundled():
    return bundled_setup()


def started(bundled, out, monkeypatch, slow_s: dict[int, float], threshold_s: float, **kwargs):
    """A head start whose windows ``k`` sleep ``slow_s[k]`` first, and whose actors pay off above
    ``threshold_s`` of the driver's seconds, whatever the machine."""
    from packfeed.service.packjob import head_start
    from packfeed.service.pipeline import window

    pack_window = window.process_window

    def slow(spec, *args, **kw):
        time.sleep(slow_s.get(spec.index, slow_s.get(-1, 0.0)))
        return pack_window(spec, *args, **kw)

    monkeypatch.setattr(window, "process_window", slow)
    monkeypatch.setattr(head_start, "actors_pay_off_after", lambda start_s, **machine: threshold_s)
    monkeypatch.setattr(head_start, "FIRST_WINDOW_EXTRA_S", 2.0)  # window 0's bound says nothing within its 1 s
    return start_head(bundled, out, **kwargs)


def test_a_slow_first_window_alone_does_not_start_ray(bundled, tmp_path, monkeypatch):
    """Window 0 takes 1 s, the others their own time (~0.05 s): at window 0's pace the 14 windows
    left would take 14 s (> 12 s: yes), at the pace of those after it under 1 s (no)."""
    head, thread = started(bundled, tmp_path, monkeypatch, {0: 1.0}, threshold_s=12.0)
    assert head.wants_ray() is False
    assert head._packed >= 2, "decided on window 1's pace, not window 0's"
    head.abandon()
    thread.join(30)


def test_windows_as_slow_as_the_first_start_ray_on_the_second(bundled, tmp_path, monkeypatch):
    head, thread = started(bundled, tmp_path, monkeypatch, {-1: 1.0}, threshold_s=12.0)
    assert head.wants_ray() is True
    assert head._began[0] >= 1, "window 1's pace (or its lower bound) confirmed window 0's"
    head.abandon()
    thread.join(30)


def test_a_driver_waiting_on_its_held_rows_decides_on_window_0(bundled, tmp_path, monkeypatch):
    """Over ``max_held_tokens`` the driver packs no window 1 before the output is released: the
    decision cannot wait for it."""
    head, thread = started(bundled, tmp_path, monkeypatch, {0: 1.0}, threshold_s=12.0, max_held_tokens=1)
    assert head.wants_ray() is True and head._packed == 1
    head.abandon()
    thread.join(30)
