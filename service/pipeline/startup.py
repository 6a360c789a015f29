"""Where the seconds before a run's first row go: the start-up by phase (``packfeed pack``).

The driver marks the end of each of its phases (plan, tokenizer, probe, Ray start, the
pipeline built; with a head start, head_start.py, its own first window packed: the last phase is
then the driver's write of it); the actor that packed the first window says, with it, when its process
started, when its imports and tokenizers were done, when the window's call began, when its
rows were packed and when they were written (``WindowActor.timings``); the driver marks the
first row's arrival. The phases are the gaps between these instants in that order, each
boundary clamped to the one before (a process Ray started ahead of time counts from when the
pipeline asked for it), so they add up to ``first_row_seconds`` (to the rounding of each to the millisecond). Wall-clock instants:
on a cluster the actor's clock is another node's (a small skew moves time between the actor
phases and the driver's; the total is the driver's own).
"""

from __future__ import annotations

import time
from typing import Any

# the actor's instants (WindowActor.timings) in order, each with the phase that ends at it
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
    """The driver's side: ``mark(phase)`` at the end of each phase, in order."""

    def __init__(self) -> None:
        self.start = time.time()
        self.marks: list[tuple[str, float]] = []

    def mark(self, phase: str) -> None:
        self.marks.append((phase, time.time()))

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
    phases, previous = {}, start
    for phase, at in ends:
        at = min(max(at, previous), first_row_at)
        phases[phase] = round(at - previous, 3)
        previous = at
    return phases
