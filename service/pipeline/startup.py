"""Where the seconds before a run's first row go: the start-up by phase (``packfeed pack``).

The driver marks the end of each of its phases (plan, tokenizer, probe, Ray start, the
pipeline built; with a head start, head_start.py, its own first window packed: the last phase is
then the driver's write of it); the actor that packed the first window says, with it, when its process
started, when its imports and tokenizers were done, when the window's call began, when its
rows were packed and when they were written (``WindowActor.timings``); the driver marks the
first row's arrival. The phases are the gaps between these instants in that order, each
boundary clamped to the one before (a process Ray started ahead of time counts from when the
pipeline asked for it), so they add up to ``first_row_seconds`` (each boundary rounded to the
millisecond from the start: the sum is the total's own rounding, no phase is negative). Wall-clock instants:
on a cluster the actor's clock is another node's (a small skew moves time between the actor
phases and the driver's; the total is the driver's own).
"""

from __future__ import annotations

import time
from typing import Any

# the actor's instants (WindowActor.timings) in order, each with the phase that ends at it.
# ``actor_imports_s`` is the actor class's load: Ray Data's _MapWorker (ray.data, pandas,
# pyarrow), then packfeed's ray_pipeline, from the process's start or, for a worker Ray started
# ahead of time, from the pipeline's ask. An import trace of such a worker (a Ray without
# ``preload_python_modules``, as a cluster started by ``ray start`` is; 2 busy cores): of the
# phase's 6.5 s, 0.25 s passed from the ask to ray.data's import, 5.9 s importing it (beside Ray
# Data's own three actors importing it too), then ray_pipeline's (0.4 s alone, ``python -X
# importtime``). A joined cluster's 5.56 s there is its workers importing Ray Data, not a
# mis-measure: a cluster's nodes preload nothing unless told (``RAY_preload_python_modules``,
# raycluster.WORKER_PRELOAD_MODULES).
ACTOR_PHASES = (
    ("process_created", "actor_process_s"),  # Ray Data asks for the actor, Ray starts its process
    ("init_start", "actor_imports_s"),  # the worker's own imports (Ray, pyarrow), the actor class
    ("imports_done", "actor_packfeed_imports_s"),  # packfeed's tokenize modules
    ("tokenizer_done", "actor_tokenizer_s"),  # the tokenizers, the fast back-end's import and proof
    ("call_start", "window_dispatch_s"),  # the actor ready, its first window not yet begun
    ("packed", "first_window_pack_s"),  # read, tokenize, pack, assemble
    ("written", "first_window_write_s"),  # numbered and written to its part file
)


class StartupClock:
    """The driver's side: ``mark(phase)`` at the end of each phase, in order.

    The command's one clock: made first thing in ``run_pack``, its start is where every figure
    of the report counts from (``seconds``, ``first_row_seconds`` and its phases, Ray up ->
    first row), whichever Ray the run uses (embedded, this process's own, a cluster joined
    before the plan). ``start`` is that instant on the wall clock (the actors' instants are
    another process's wall clock), ``began`` on ``time.perf_counter`` (durations on the driver);
    ``wall`` maps a perf_counter instant onto the wall clock."""

    def __init__(self) -> None:
        self.start, self.began = time.time(), time.perf_counter()
        self.marks: list[tuple[str, float]] = []

    def mark(self, phase: str) -> None:
        self.marks.append((phase, time.time()))

    def wall(self, at: float) -> float:
        """The perf_counter instant ``at`` on the wall clock, from this clock's start."""
        return self.start + (at - self.began)

    def phases(self, actor: dict[str, float] | None, first_row_at: float,
               last: str = "actors_and_first_window_s") -> dict[str, float]:
        """The start-up by phase (module docstring), in seconds, rounded to the millisecond;
        ``actor``: the first window's actor timings (None: not known, or the driver packed it:
        the rest is one phase, ``last``)."""
        return startup_phases(self.start, self.marks, actor, first_row_at, last)


def startup_phases(start: float, marks: list[tuple[str, float]], actor: dict[str, Any] | None,
                   first_row_at: float, last: str = "actors_and_first_window_s") -> dict[str, float]:
    """``StartupClock.phases`` as a pure function (``marks``: the driver's (phase, end))."""
    ends = [(f"{name}_s", at) for name, at in sorted(marks, key=lambda mark: mark[1])]  # two threads mark
    if actor is not None and all(key in actor for key, _ in ACTOR_PHASES):
        ends += [(phase, float(actor[key])) for key, phase in ACTOR_PHASES]
        ends.append(("to_driver_s", first_row_at))
    else:
        ends.append((last, first_row_at))
    # each phase is the difference of its boundaries rounded from the start (not itself rounded):
    # the phases then add up to round(first_row_at - start, 3) exactly, none below 0
    phases, previous, done = {}, start, 0.0
    for phase, at in ends:
        at = min(max(at, previous), first_row_at)
        upto = round(at - start, 3)
        phases[phase] = round(upto - done, 3)
        previous, done = at, upto
    return phases
