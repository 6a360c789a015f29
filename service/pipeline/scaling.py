"""The packing actors of pack, serve and train: how many, how many CPUs each, and where.

One type, ``PackingScaling``, whatever gives it: the ``[scaling]`` table of a config file
(``packing_workers = 4``; ``TABLE_KEYS`` maps its keys to the fields), the flags of ``packfeed
pack`` and ``serve`` (``--num-workers 4``), or ``packfeed train``'s ``TrainScaling.packing``.
Every value is checked by one rule per field, and the message names what the user wrote:
``{"num_workers": ("--num-workers", 0)}`` -> "--num-workers must be a whole number >= 1, got 0".

``labels`` None means the role default (``packfeed/role=packer`` on a cluster whose nodes carry
roles, no selector otherwise, see placement.py); ``placed(nodes)`` resolves it. Standard
library only: the config is read, and checked, before Ray is imported.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from packfeed.service.pipeline import placement

# [scaling] key -> PackingScaling field
TABLE_KEYS = {
    "packing_workers": "num_workers",
    "packing_cpus_per_worker": "cpus_per_worker",
    "packing_max_workers": "max_workers",
    "packer_labels": "labels",
    "packer_resources": "resources",
}
# how a message names the selector and the resources, whether a flag or a key gave them
LABELS_NAME, RESOURCES_NAME = "packer labels", "packer resources"


@dataclass(frozen=True, kw_only=True)
class PackingScaling:
    """Packing actors: ``num_workers`` of ``cpus_per_worker`` CPUs each (fractional is fine).

    ``num_workers`` None: one per CPU of the nodes packing may use. ``max_workers`` above
    ``num_workers`` lets the pool autoscale between the two. ``labels``: node labels every
    packing actor's node must carry (Ray's label selectors, e.g. {"packfeed/role": "packer"};
    None: the role default, an empty table: none); ``resources``: custom resources each asks for.
    """

    num_workers: int | None = None
    cpus_per_worker: float = 1.0
    max_workers: int | None = None
    labels: Mapping[str, str] | None = None
    resources: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _checked(f.name, f.name, getattr(self, f.name)))
        _check_pool(self.num_workers, self.max_workers, "num_workers", "max_workers")

    @classmethod
    def from_table(cls, table: Mapping[str, Any], given: Mapping[str, tuple[str, Any]] | None = None,
                   **defaults: Any) -> PackingScaling:
        """From the packing keys of a ``[scaling]`` table (its other keys are left to the caller),
        then ``given`` (field -> (the name the user gave it by, value): flags, which win over the
        table); a field neither sets takes ``defaults``, else its own default. Errors name the
        key or the flag."""
        names = {"labels": LABELS_NAME, "resources": RESOURCES_NAME}
        named = {f: (f, v) for f, v in defaults.items()}
        named.update({f: (names.get(f, f"[scaling] {key}"), table[key])
                      for key, f in TABLE_KEYS.items() if key in table})
        named.update(given or {})
        values = {f: _checked(f, name, value) for f, (name, value) in named.items()}
        if "max_workers" in named:
            _check_pool(values.get("num_workers"), values["max_workers"],
                        named.get("num_workers", ("num_workers", None))[0], named["max_workers"][0])
        return cls(**values)

    def to_table(self) -> dict[str, Any]:
        """The ``[scaling]`` keys that give this (``from_table(to_table())`` is itself)."""
        out = {key: getattr(self, f) for key, f in TABLE_KEYS.items()}
        out["packer_labels"] = None if self.labels is None else dict(self.labels)
        out["packer_resources"] = dict(self.resources)
        return out

    def placed(self, nodes: Sequence[Mapping[str, Any]]) -> PackingScaling:
        """With ``labels`` resolved against ``nodes`` (``placement.node_resources()``)."""
        return dataclasses.replace(self, labels=placement.resolve(self.labels, placement.PACKER_DEFAULT, nodes))

    def num_actors(self, num_windows: int, nodes: Sequence[Mapping[str, Any]] | None = None) -> int:
        """Packing actors to start: the request, or one per CPU of the nodes packing may use
        (``nodes``, read from Ray when None); never more than the windows to pack."""
        if self.num_workers is not None:
            wanted = self.num_workers
        else:
            nodes = placement.node_resources() if nodes is None else nodes
            selector = self.placed(nodes).labels
            cpus = sum(float(n["resources"].get("CPU", 0)) for n in nodes
                       if placement.label_matches(n["labels"], selector))
            wanted = max(1, int(cpus // self.cpus_per_worker))
        return max(1, min(wanted, num_windows))


def place_packing(scaling: PackingScaling, *, num_windows: int) -> PackingScaling:
    """After Ray started: ``scaling`` with its selector resolved against the nodes, checked to
    fit (a request no node can satisfy fails here, with the numbers, instead of waiting forever)."""
    nodes = placement.node_resources()
    placed = scaling.placed(nodes)
    request = {"CPU": placed.cpus_per_worker, **placed.resources}
    placement.check_fits("packing actors", request, placed.num_actors(num_windows, nodes), placed.labels, nodes)
    return placed


def _checked(f: str, name: str, value: Any) -> Any:
    """``value`` of field ``f`` as the field holds it; ValueError naming ``name`` when wrong."""
    if f in ("num_workers", "max_workers"):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        return value
    if f == "cpus_per_worker":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        return float(value)
    if f == "labels":
        return None if value is None else placement.check_selector(name, value)
    return placement.check_resources(name, value)


def _check_pool(num_workers: int | None, max_workers: int | None, num_name: str, max_name: str) -> None:
    if max_workers is not None and max_workers < (num_workers or 1):
        raise ValueError(f"{max_name} ({max_workers}) must be >= {num_name} ({num_workers or 1})")
