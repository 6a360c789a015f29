"""Online mixture changes: new source weights asked for during a run, recorded, replayed exactly.

A training loop asks for new weights (``PackedStream.set_mixture``, the ``SetMixture`` RPC, or
the ``packfeed train`` hook). The change becomes a schedule entry of the stream (the
``[[data.schedule]]`` of data/config.py) that starts at the first window not yet planned:
no row already packed or delivered changes. Every rank of a data-parallel loop asks at the same
step; the change is keyed by that step, so the calls of one step make one change and all get
the same answer (the first call's).

"Not yet planned" is tracked here: every reader asks ``admit(window, version)`` before it hands
out a window's rows, the catch-up path ``plan_for(window)``, and the stream manifest knows the
windows a previous server reached (at least window 0: the first window's weights are the
config's). A change takes effect at one past the highest of them, so windows below it are the
same under the old plan and the new one (the schedule only replaces weights from its window
on), and a reader that still packs with the old plan is told to start again at that window
with the new one (``admit`` returns False, ``read_with_changes``). Read-ahead packing that the
change makes stale is thrown away: at most the pipeline's read-ahead (a few windows) is packed
twice.

Worked example: windows of 1000 samples, the reader has handed out windows 0..3, a previous
server reached window 5 (manifest): a change at step 40 starts at window 6, from_sample 6000.
A second call for step 40 (another rank) returns that answer; a call for step 41 before the
reader moved on starts at window 6 too and replaces the weights of the first from there.

Every change is written to the stream manifest (delivery/manifest.py) before it is applied,
so a restarted server (``attach``) and a resumed run replay it; its record is
``MixtureChange.to_dict()``. Pure Python: the plan is rebuilt by the injected ``plan_with``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from packfeed.client.mixture_record import check_change

logger = logging.getLogger("packfeed")

# plan_with(schedule) -> (the data config with that schedule, its plan): windows below an
# entry's window must stay as they are (data/plan.py).
PlanWith = Callable[[tuple], tuple[Any, Any]]


class MixtureRefused(Exception):
    """The stream cannot change its mixture (a packed directory, or every window is planned)."""


@dataclass(frozen=True)
class MixtureChange:
    """One online change: asked at the caller's ``step``; applies from global sample
    ``from_sample``, the start of ``window``, with ``weights`` (source name -> weight)."""

    step: int
    from_sample: int
    window: int
    weights: Mapping[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "from_sample": self.from_sample, "window": self.window,
                "weights": dict(self.weights)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MixtureChange":
        """ValueError naming the field at fault for a record that is not one."""
        return cls(**check_change(d))

    def same_as(self, other: "MixtureChange") -> bool:
        return (self.step, self.from_sample, dict(self.weights)) == (other.step, other.from_sample, dict(other.weights))


def merged_schedule(base: Sequence[Any], changes: Sequence[MixtureChange], entry: Callable[[int, dict], Any]) -> tuple:
    """The schedule in effect: the config's entries ``base`` and the changes, by ``from_sample``;
    where two start at the same sample the later one wins (a change replaces a configured entry
    or an earlier change there). ``entry(from_sample, weights)`` makes a schedule entry.

    Config entries at 0 and 5000, changes at 3000 then 5000: entries 0, 3000 (change),
    5000 (the change: it came later)."""
    at: dict[int, Any] = {int(e.from_sample): e for e in base}
    for change in changes:
        at[change.from_sample] = entry(change.from_sample, dict(change.weights))
    return tuple(at[k] for k in sorted(at))


class MixtureControl:
    """The plan a stream's readers pack with, and the online changes made to it (see the module
    docstring). ``config``/``plan``: the served data config and its plan; ``plan_with``: see
    PlanWith; ``check_weights(weights)``: the weights as floats, or ValueError; ``entry``: makes a
    schedule entry (data/config.py's ScheduleEntry)."""

    def __init__(self, config: Any, plan: Any, *, plan_with: PlanWith,
                 check_weights: Callable[[Mapping[str, float]], dict[str, float]],
                 entry: Callable[[int, dict], Any]) -> None:
        self._base_schedule = tuple(getattr(config, "schedule", ()) or ())
        self._config, self._plan = config, plan
        self._plan_with, self._check_weights, self._entry = plan_with, check_weights, entry
        self._lock = threading.Lock()
        self._changes: list[MixtureChange] = []
        self._started = -1  # the highest window whose rows a reader handed out
        self._manifest: Any = None

    @property
    def changes(self) -> list[MixtureChange]:
        with self._lock:
            return list(self._changes)

    @property
    def schedule(self) -> tuple:
        """The schedule in effect (config entries and changes)."""
        with self._lock:
            return merged_schedule(self._base_schedule, self._changes, self._entry)

    def current(self) -> tuple[int, Any, Any]:
        """(version, config, plan) for a reader to start with."""
        with self._lock:
            return len(self._changes), self._config, self._plan

    def admit(self, window: int, version: int) -> bool:
        """May a reader packing with the plan of ``version`` hand out ``window``'s rows? True
        (and the window counts as planned) unless a later change starts at or below it: then
        the reader starts again at ``window`` with ``current()``."""
        with self._lock:
            if any(c.window <= window for c in self._changes[version:]):
                return False
            self._started = max(self._started, window)
            return True

    def plan_for(self, window: int) -> tuple[Any, Any]:
        """(config, plan) to pack ``window`` with on the catch-up path (the window counts as planned)."""
        with self._lock:
            self._started = max(self._started, window)
            return self._config, self._plan

    def attach(self, manifest: Any) -> None:
        """Replay the changes ``manifest`` recorded (a restarted server, a resumed run), and
        record every later one there; its windows count as planned."""
        with self._lock:
            self._manifest = manifest
            recorded = [MixtureChange.from_dict(d) for d in manifest.mixture]
            if recorded:
                self._apply(recorded)

    def change(self, step: int, weights: Mapping[str, float]) -> MixtureChange:
        """The change of ``step``: made now (first call of the step) or the one made earlier.

        ValueError for bad weights (unknown source, negative, not finite, all zero: nothing
        changes); MixtureRefused when every window is planned; OSError (or a storage error) when
        the manifest cannot record it (nothing changes)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        checked = self._check_weights(weights)  # bad weights raise, also at a step already changed
        with self._lock:
            for done in self._changes:
                if done.step == step:
                    return done
            known = self._manifest.last_window() if self._manifest is not None else 0
            window = max(self._started, known) + 1
            ended = self._manifest is not None and self._manifest.total_rows is not None
            if ended or window >= self._plan.num_windows:
                raise MixtureRefused(f"every window of the stream is planned already (the next would be window {window} "
                                     f"of {self._plan.num_windows}): a change has no samples left to apply to")
            change = MixtureChange(step, int(self._plan.window_start_sample(window)), window, checked)
            config, plan = self._plan_with(merged_schedule(self._base_schedule, [*self._changes, change], self._entry))
            if self._manifest is not None:
                self._manifest.record_mixture(change.to_dict())
            self._changes.append(change)
            self._config, self._plan = config, plan
            return change

    def index_of(self, change: MixtureChange) -> int:
        """``change``'s index in the schedule in effect (config entries and changes)."""
        return [int(e.from_sample) for e in self.schedule].index(change.from_sample)

    def _apply(self, changes: list[MixtureChange]) -> None:
        """Replay recorded changes (caller holds the lock)."""
        everything = [*self._changes, *changes]
        self._config, self._plan = self._plan_with(merged_schedule(self._base_schedule, everything, self._entry))
        self._changes = everything

    def check_recorded(self, recorded: Sequence[MixtureChange]) -> None:
        """ValueError unless every change a client's state recorded is one this stream made
        (the same step, from_sample and weights): otherwise its cursor points into another
        stream (a server whose state dir was lost or replaced)."""
        with self._lock:
            mine = {c.step: c for c in self._changes}
        for change in recorded:
            have = mine.get(change.step)
            if have is None or not have.same_as(change):
                found = "none" if have is None else f"from sample {have.from_sample:,} with {dict(have.weights)}"
                raise ValueError(
                    f"the client's state records a mixture change at step {change.step} (from sample "
                    f"{change.from_sample:,}, weights {dict(change.weights)}); this server's stream has {found}: "
                    "restart the server with the state dir (--state-dir) it recorded the change in")


# plan_reader(config, plan, window, first_row) -> (window, rows) from ``window`` on, rows numbered
# from ``first_row``: the packing pipeline of one plan (row_stream.py).
PlanReader = Callable[[Any, Any, int, int], Iterable[tuple[int, Any]]]


def read_with_changes(control: MixtureControl, plan_reader: PlanReader, window: int,
                      first_row: int) -> Iterator[tuple[int, Any]]:
    """The stream from ``window`` (whose first row is ``first_row``) on, as the hub reads it:
    ``plan_reader`` of the current plan until a change makes its plan stale from a window it
    has not handed out yet, then a new one from that window with the new plan. The rows are
    those of the recorded schedule's stream whenever the changes come."""
    while True:
        version, config, plan = control.current()
        outputs = iter(plan_reader(config, plan, window, first_row))
        try:
            for w, rows in outputs:
                if not control.admit(w, version):  # changed from this window on: its rows are not handed out
                    window = w
                    break
                yield w, rows
                first_row += rows.num_rows
            else:
                return
        finally:
            getattr(outputs, "close", lambda: None)()  # a generator: stops the pipeline behind it
        logger.info("the mixture changed from window %d on: packing from there with the new weights", window)
