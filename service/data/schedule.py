"""Mixture schedules: source weights that change at given positions of the stream.

A schedule is a list of entries ``[[data.schedule]]``, each ``from_sample`` (a position in the
stream's samples, counted across epochs from 0) and ``weights`` (source name -> weight). An
entry replaces the weights from the first window that starts at or after ``from_sample``
(windows are never split: a window holds one mixture). A weight of 0 pauses a source; it
resumes where it stopped when a later entry gives it a weight again. How the plan turns this
into windows is in epochs.py (``ScheduledEpochs``).

Every entry names every source (give 0 to pause one): a source left out is an error, not a
silent pause or a silently kept weight, so a typo or a forgotten source is caught when the
config is read. Entries come in strictly increasing ``from_sample``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence


@dataclass(frozen=True, kw_only=True)
class ScheduleEntry:
    """From the first window starting at or after ``from_sample``, the sources' ``weights``.

    ``weights`` (a mapping or (name, weight) pairs) is stored as a tuple of pairs sorted by
    name, so entries compare and hash by value; ``dict(entry.weights)`` is the mapping. The weights are checked here
    (numbers, finite, >= 0, not all 0); that they name the config's sources is checked by the
    config (``check_schedule_weights``).
    """

    from_sample: int
    weights: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        if isinstance(self.from_sample, bool) or not isinstance(self.from_sample, int) or self.from_sample < 0:
            raise ValueError(f"schedule: from_sample must be an integer >= 0 (a position in the stream's samples), "
                             f"got {self.from_sample!r}")
        pairs = self.weights.items() if isinstance(self.weights, Mapping) else self.weights
        try:
            pairs = [(name, weight) for name, weight in pairs]
        except (TypeError, ValueError):
            raise ValueError(f"schedule at {self.from_sample}: weights must be a table of source name = weight, "
                             f"got {self.weights!r}") from None
        checked = check_weight_values(dict(pairs), f"schedule at {self.from_sample}")
        object.__setattr__(self, "weights", tuple(sorted(checked.items())))

    def to_dict(self) -> dict[str, Any]:
        return {"from_sample": self.from_sample, "weights": dict(self.weights)}

    @classmethod
    def from_dict(cls, d: Any) -> "ScheduleEntry":
        """From a ``[[data.schedule]]`` table (or the dict ``to_dict`` gives), with clear errors."""
        if isinstance(d, ScheduleEntry):
            return d
        if not isinstance(d, Mapping):
            raise ValueError(f"a [[data.schedule]] entry must be a table, got {type(d).__name__}")
        unknown = sorted(set(d) - {"from_sample", "weights"})
        if unknown:
            raise ValueError(f"[[data.schedule]]: unknown keys {unknown}; known keys: ['from_sample', 'weights']")
        for key in ("from_sample", "weights"):
            if key not in d:
                raise ValueError(f"[[data.schedule]]: missing `{key}`")
        if not isinstance(d["weights"], Mapping):
            raise ValueError(f"schedule at {d['from_sample']!r}: weights must be a table of source name = weight "
                             f"(weights = {{ web = 1, code = 2 }}), got {d['weights']!r}")
        return cls(from_sample=d["from_sample"], weights=d["weights"])


def check_weight_values(weights: Mapping[Any, Any], what: str) -> dict[str, float]:
    """``weights`` as {name: float}: names non-empty strings, weights finite numbers >= 0, at
    least one > 0. ValueError starting with ``what`` otherwise."""
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(f"{what}: weights must be a non-empty table of source name = weight, got {weights!r}")
    out: dict[str, float] = {}
    for name, w in weights.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{what}: a source name must be a non-empty string, got {name!r}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ValueError(f"{what}: the weight of {name!r} must be a finite number >= 0 (0 pauses the source), "
                             f"got {w!r}")
        out[name] = float(w)
    if not any(out.values()):
        raise ValueError(f"{what}: every weight is 0; at least one source needs a weight > 0")
    return out


def check_schedule_weights(weights: Mapping[str, Any], source_names: Sequence[str]) -> dict[str, float]:
    """The weights of a schedule entry or an online change, checked against the sources.

    Returns {name: weight} in the sources' order. ValueError, naming the fix, for an unknown
    source name (with the closest known one), a source left out (every source must be named;
    0 pauses it), a weight that is not a number, negative or not finite, or all weights 0.
    """
    checked = check_weight_values(weights, "mixture weights")
    unknown = [n for n in checked if n not in source_names]
    if unknown:
        raise ValueError(f"mixture weights: unknown sources {unknown}; the sources are {list(source_names)}")
    missing = [n for n in source_names if n not in checked]
    if missing:
        raise ValueError(f"mixture weights: sources {missing} have no weight; name every source "
                         f"(a weight of 0 pauses one)")
    return {n: checked[n] for n in source_names}


def check_schedule(entries: Iterable[Any], source_names: Sequence[str]) -> tuple[ScheduleEntry, ...]:
    """Entries (``ScheduleEntry`` or tables) as a tuple, each naming every source, strictly
    increasing in ``from_sample``."""
    if isinstance(entries, (str, bytes, Mapping)) or not isinstance(entries, (list, tuple)):
        raise ValueError(f"schedule must be a list of tables ([[data.schedule]] in TOML), got {entries!r}")
    out = tuple(ScheduleEntry.from_dict(e) for e in entries)
    for entry in out:
        try:
            check_schedule_weights(dict(entry.weights), source_names)
        except ValueError as exc:
            raise ValueError(f"schedule at {entry.from_sample}: {exc}") from None
    for a, b in zip(out, out[1:]):
        if b.from_sample <= a.from_sample:
            raise ValueError(f"schedule entries must come in strictly increasing from_sample: {b.from_sample} "
                             f"follows {a.from_sample}")
    return out


def weight_vector(entry: ScheduleEntry, source_names: Sequence[str]) -> list[float]:
    """The entry's weights in the sources' order."""
    weights = dict(entry.weights)
    return [weights[n] for n in source_names]
