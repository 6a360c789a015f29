"""The start-up phases on the command's one clock (startup.py): each boundary rounded from the
start, so the phases add up to the first row's own rounding and none is negative, whatever
the instants; ``StartupClock.wall`` maps the driver's perf_counter instants onto it."""

from __future__ import annotations

import random

import pytest

from packfeed.service.pipeline.startup import ACTOR_PHASES, StartupClock, startup_phases


def test_phases_of_under_a_millisecond_still_add_up_to_the_first_row():
    # 13 phases of 0.4 ms: each rounded alone is 0.0 (the sum said 0.000 for a first row at 0.005)
    marks = [(f"p{i}", 100.0 + 0.0004 * (i + 1)) for i in range(12)]
    phases = startup_phases(100.0, marks, None, 100.0052)
    assert sum(phases.values()) == pytest.approx(0.005, abs=1e-12)
    assert all(v >= 0 for v in phases.values())


@pytest.mark.parametrize("seed", range(20))
def test_random_instants_add_up_exactly_and_never_go_negative(seed):
    rng = random.Random(seed)
    start = 1.8e9 + rng.random()
    marks = [(f"d{i}", start + rng.uniform(-0.1, 3.0)) for i in range(6)]  # two threads mark: any order
    actor = {key: start + rng.uniform(0.0, 6.0) for key, _ in ACTOR_PHASES}  # another node's clock: any order
    first_row = start + rng.uniform(0.0, 7.0)
    phases = startup_phases(start, marks, actor, first_row)
    assert sum(phases.values()) == pytest.approx(round(first_row - start, 3), abs=1e-9)
    assert all(v >= 0 for v in phases.values()), phases


def test_the_clock_maps_its_perf_counter_instants_onto_the_wall_clock():
    clock = StartupClock()
    assert clock.wall(clock.began) == clock.start
    assert clock.wall(clock.began + 2.5) == pytest.approx(clock.start + 2.5)
    clock.mark("plan")
    phases = clock.phases(None, clock.wall(clock.began + 1.0))
    assert sum(phases.values()) == pytest.approx(1.0, abs=1e-9)
