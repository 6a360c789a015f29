"""Online mixture changes as the client keeps them: the record in ``StreamState`` and the wire message.

A change (``PackedStream.set_mixture``, the server's ``SetMixture``) is the dict::

    {"step": 120, "from_sample": 6000, "window": 6, "weights": {"web": 0.0, "code": 1.0, "math": 3.0}}

``step``: the caller's step it was asked at (one change per step); ``from_sample``: the global
sample position it applies from (the start of packing window ``window``); ``weights``: every
source's weight from there on. The same record is a ``[[data.schedule]]`` entry (``from_sample``
and ``weights``), so ``packfeed pack --config`` with the recorded entries reproduces the served
stream. Standard library only (the generated messages are imported where converted).
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping

from packfeed.client.v1 import packfeed_pb2

CHANGE_FIELDS = ("step", "from_sample", "window", "weights")


def check_change(record: Any) -> dict[str, Any]:
    """``record`` as a change dict (ints, float weights); ValueError naming the field at fault."""
    if not isinstance(record, Mapping):
        raise ValueError(f"a mixture change is a dict, got {type(record).__name__}")
    unknown = sorted(set(record) - set(CHANGE_FIELDS))
    if unknown:
        raise ValueError(f"unknown mixture change field(s) {unknown}; a change holds {list(CHANGE_FIELDS)}")
    out: dict[str, Any] = {}
    for name in CHANGE_FIELDS[:3]:
        value = record.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"mixture change field {name!r} must be an integer >= 0, got {value!r}")
        out[name] = int(value)
    weights = record.get("weights")
    if (not isinstance(weights, Mapping) or not weights or not all(
            isinstance(k, str) and not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
            for k, v in weights.items())):
        raise ValueError(f"mixture change field 'weights' must map source names to numbers, got {weights!r}")
    out["weights"] = {k: float(v) for k, v in weights.items()}
    return out


def change_message(record: Mapping[str, Any], schedule_index: int = 0) -> Any:
    """The ``packfeed.v1.MixtureChange`` message of a record."""
    return packfeed_pb2.MixtureChange(step=record["step"], from_sample=record["from_sample"], window=record["window"],
                                      weights=dict(record["weights"]), schedule_index=schedule_index)


def change_record(message: Any) -> dict[str, Any]:
    """The record of a wire message (weights in name order)."""
    return {"step": int(message.step), "from_sample": int(message.from_sample), "window": int(message.window),
            "weights": {k: float(message.weights[k]) for k in sorted(message.weights)}}


def with_change(changes: tuple[dict, ...], record: Mapping[str, Any]) -> tuple[dict, ...]:
    """``changes`` plus ``record`` unless a change of its step is there already."""
    if any(c["step"] == record["step"] for c in changes):
        return changes
    return (*changes, check_change(record))


def schedule_toml(changes: Iterable[Mapping[str, Any]]) -> str:
    """The changes as ``[[data.schedule]]`` entries (TOML), to add to the served data config:
    ``packfeed pack --config`` then packs the served stream. Two changes at the same position
    are one entry, the later's weights, and a change drops the earlier ones that start after it
    (as the server applies them); with entries of its own, the config's list must stay in
    increasing ``from_sample``."""
    at: dict[int, Mapping[str, Any]] = {}
    for change in changes:
        start = int(change["from_sample"])
        at = {k: c for k, c in at.items() if k < start}
        at[start] = change
    entries = []
    for change in (at[k] for k in sorted(at)):
        weights = ", ".join(f"{json.dumps(name)} = {float(w)!r}" for name, w in change["weights"].items())
        entries.append(f"[[data.schedule]]  # step {change['step']}\nfrom_sample = {int(change['from_sample'])}\n"
                       f"weights = {{ {weights} }}\n")
    return "\n".join(entries)
