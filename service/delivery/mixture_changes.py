"""Online mixture changes: new source weights asked for during a run, recorded, replayed exactly.

A training loop asks for new weights (``PackedStream.set_mixture``, the ``SetMixture`` RPC, or
the ``packfeed train`` hook). The change becomes a schedule entry of the stream (the
``[[data.schedule]]`` of data/config.py) that starts at the first window no consumer has
received: the first window starting at or after the callers' cursor (``apply_change``), so at
most one window after the rows they consumed. Every rank of a data-parallel loop asks at the
same step, after the same batch; the change is keyed by that step, so the calls of one step make
one change and all get the same answer (the first call's).

What was packed ahead of the consumers with the old weights is dropped (issue 41: the reader
and gRPC's send-ahead had planned the whole stream, and a change landed at its end or was
refused): the hub forgets its rows from the change's window on and its reader starts again
there (``RowHub.rewind``), the manifest forgets those windows' first rows and the end, a gRPC
call that had sent such rows ends with ABORTED, and the calling clients drop their read-ahead
and read on from their cursor. Cost: the windows packed ahead (at most the hub's buffer and the
pipeline's read-ahead) are packed again. Windows below the change's are the same under the old
plan and the new one (a schedule entry only replaces weights from its window on).

Without a cursor (an older client) the change starts at the first window not yet *planned*:
every reader asks ``admit(window, version)`` before it hands out a window's rows, the catch-up
path ``plan_for(window)``, and the manifest knows the windows a previous server reached (at
least window 0: the first window's weights are the config's); nothing packed is dropped, and a
reader still packing with the old plan starts again at the change's window (``admit`` returns
False, ``read_with_changes``).

Worked example: windows of 200 samples, ~40 rows each; the ranks consumed 160 rows (inside
window 3) while the reader and gRPC got to window 47 of 48: the change starts at window 4,
from_sample 800, and windows 4..47 are packed again with the new weights. A second call for
the step (another rank) returns that answer; a later step's change at an earlier window
supersedes the earlier change from there (``merged_schedule``).

Every change is written to the stream manifest (delivery/manifest.py) before it is applied,
so a restarted server (``attach``) and a resumed run replay it; its record is
``MixtureChange.to_dict()``. Pure Python: the plan is rebuilt by the injected ``plan_with``.
"""

from __future__ import annotations

import bisect
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
    or an earlier change there), and a change drops the earlier changes that start after it (it
    came later and starts before them). ``entry(from_sample, weights)`` makes a schedule entry.

    Config entries at 0 and 5000, changes at 3000 then 5000: entries 0, 3000 (change),
    5000 (the change: it came later). Changes at 6000 then 4000: entries 0, 4000, 5000."""
    kept: list[MixtureChange] = []
    for change in changes:
        kept = [c for c in kept if c.from_sample < change.from_sample] + [change]
    at: dict[int, Any] = {int(e.from_sample): e for e in base}
    for change in kept:
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
        self._rewound: set[int] = set()  # steps of the changes that made handed-out windows stale
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

    def superseded(self, version: int) -> bool:
        """A change after ``version`` made windows a reader had handed out stale: the hub
        forgot them and started a reader of its own (``apply_change``), so the reader of
        ``version`` just ends."""
        with self._lock:
            return any(c.step in self._rewound for c in self._changes[version:])

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

    def change(self, step: int, weights: Mapping[str, float], *, window: int | None = None) -> MixtureChange:
        """The change of ``step``: made now (first call of the step) or the one made earlier.
        It starts at ``window`` (the first no consumer has received: ``apply_change``; at least
        1, window 0 keeps the config's weights), or, when None, at the first window not planned.

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
            why = ("every window of the stream is planned already" if window is None
                   else "the consumers are in the stream's last window")
            if window is None:
                known = self._manifest.last_window() if self._manifest is not None else 0
                window = max(self._started, known) + 1
                ended = self._manifest is not None and self._manifest.total_rows is not None
            else:
                window, ended = max(window, 1), False
            if ended or window >= self._plan.num_windows:
                raise MixtureRefused(f"{why} (the next would be window {window} of {self._plan.num_windows}): "
                                     "a change has no samples left to apply to")
            change = MixtureChange(step, int(self._plan.window_start_sample(window)), window, checked)
            config, plan = self._plan_with(merged_schedule(self._base_schedule, [*self._changes, change], self._entry))
            if self._manifest is not None:
                self._manifest.record_mixture(change.to_dict())
            self._changes.append(change)
            self._config, self._plan = config, plan
            if self._started >= window:  # handed out under the old plan: the hub forgets them
                self._rewound.add(step)
                self._started = window - 1
            return change

    def rewound(self, change: MixtureChange) -> bool:
        """Did ``change`` make windows a reader had handed out stale?"""
        with self._lock:
            return change.step in self._rewound

    def planned(self) -> int:
        """The highest window a reader handed out or the manifest knows (-1: none)."""
        with self._lock:
            return max(self._started, self._manifest.last_window() if self._manifest is not None else -1)

    def window_start_sample(self, window: int) -> int:
        """The first sample of ``window`` (the same under every plan of the stream up to it)."""
        with self._lock:
            return int(self._plan.window_start_sample(window))

    def index_of(self, change: MixtureChange) -> int:
        """``change``'s index in the schedule in effect (config entries and changes); for a change
        a later one superseded, where it would be."""
        return bisect.bisect_left([int(e.from_sample) for e in self.schedule], change.from_sample)

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


@dataclass(frozen=True)
class ChangeAnswer:
    """A change and how far it is from the consumers: ``consumer_window`` holds the callers'
    cursor, ``consumer_sample`` is its first sample (both 0 without a cursor), so the change
    applies ``change.from_sample - consumer_sample`` samples (at most one window) after it."""

    change: MixtureChange
    consumer_window: int = 0
    consumer_sample: int = 0
    planned: int = -1  # the highest window planned before it: from change.window to there, packed again


def apply_change(control: MixtureControl, hub: Any, step: int, weights: Mapping[str, float],
                 cursor: int | None) -> ChangeAnswer:
    """The change of ``step`` from the first window no consumer has received: the first that
    starts at or after ``cursor``, the rows the callers consumed (what they read ahead beyond
    it they drop and ask for again). The rows ``hub`` (a RowHub) holds or packs from that window
    on, packed with the old weights, are forgotten and packed again (``hub.rewind``); the
    manifest forgets those windows. Without a cursor, or with one the hub cannot place yet (a
    restarted server before its reader got there), the change starts at the first window not
    planned. Cost: the windows packed ahead of the consumers are packed again (at most the
    hub's buffer and one window); gain: a lag of at most one window instead of the read-ahead.

    Windows of 200 samples, ~40 rows each, cursor 160 (inside window 3): from window 4,
    sample 800; consumer_window 3, consumer_sample 600."""
    with hub.changing():
        placed = None if cursor is None else hub.window_from(cursor)
        made, planned = len(control.changes), control.planned()
        change = control.change(step, weights, window=None if placed is None else placed[1])
        if len(control.changes) > made and control.rewound(change):
            hub.rewind(change.window, cursor)
    if cursor is None:
        return ChangeAnswer(change, planned=planned)
    holding = placed[0] if placed is not None else hub.manifest.locate(cursor)[0]  # or the last known before
    return ChangeAnswer(change, holding, control.window_start_sample(holding), planned)


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
                    if control.superseded(version):  # the hub started a reader of its own
                        return
                    window = w
                    break
                yield w, rows
                first_row += rows.num_rows
            else:
                return
        finally:
            getattr(outputs, "close", lambda: None)()  # a generator: stops the pipeline behind it
        logger.info("the mixture changed from window %d on: packing from there with the new weights", window)
