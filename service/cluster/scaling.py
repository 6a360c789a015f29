"""The packing actors of pack, serve and train: how many, how many CPUs each, and where.

One type, ``PackingScaling``, whatever gives it: the ``[scaling]`` table of a config file
(``packing_workers = 4``; ``TABLE_KEYS`` maps its keys to the fields), the flags of ``packfeed
pack`` and ``serve`` (``--num-workers 4``), or ``packfeed train``'s ``TrainScaling.packing``.
Every value is checked by one rule per field, and the message names what the user wrote:
``{"num_workers": ("--num-workers", 0)}`` -> "--num-workers must be a whole number >= 1, got 0".

``labels`` None means the role default (``packfeed/role=packer`` on a cluster whose nodes carry
roles, no selector otherwise, see placement.py); ``placed(nodes)`` resolves it. Standard
library only: the config is read, and checked, before Ray is imported.

Whether the actors fit is a property of the flags and the Ray, never of the corpus:
``check_packing`` refuses, before anything starts, actors that could never all be placed, on
the Ray the run has joined or on the embedded Ray it would start (placement.embedded_node: this
machine's CPUs as Ray counts them), whether or not the driver's head start then starts that Ray
(packjob/head_start.py): ``--cpus-per-worker 64`` on 2 CPUs fails on the bundled corpus (which
the driver packs alone) as it would on a corpus large enough to start Ray. The count
checked is the one asked for, not the fewer actors a run of few windows starts (``num_actors``):
``--num-workers 4`` on 2 CPUs is refused for 1 window as for 100, as ``packfeed train`` refuses it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from packfeed.service.cluster import placement, raycluster

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
# PackingScaling field -> the flag of pack and serve that sets it
FLAGS = {"num_workers": "--num-workers", "cpus_per_worker": "--cpus-per-worker", "max_workers": "--max-workers",
         "labels": "--packer-label", "resources": "--packer-resource"}


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
        """Packing actors to start: ``wanted_actors``, never more than the windows to pack."""
        return max(1, min(self.wanted_actors(nodes), num_windows))

    def wanted_actors(self, nodes: Sequence[Mapping[str, Any]] | None = None) -> int:
        """The actors asked for: ``num_workers``, or one per CPU of the nodes packing may use
        (``nodes``, read from Ray when None), at least one."""
        if self.num_workers is not None:
            return self.num_workers
        nodes = placement.node_resources() if nodes is None else nodes
        selector = self.placed(nodes).labels
        cpus = sum(float(n["resources"].get("CPU", 0)) for n in nodes if placement.label_matches(n["labels"], selector))
        return max(1, int(cpus // self.cpus_per_worker))


def flags_set(scaling: PackingScaling) -> list[str]:
    """The settings of ``scaling`` other than the defaults, as the flags that give them (for a
    line saying they went unused): ["--num-workers 4", "--packer-label zone=a"]."""
    out = []
    for f in dataclasses.fields(scaling):
        value = getattr(scaling, f.name)
        if value == (f.default_factory() if f.default is dataclasses.MISSING else f.default):
            continue
        if isinstance(value, Mapping):
            out += [f"{FLAGS[f.name]} {k}={v:g}" if isinstance(v, float) else f"{FLAGS[f.name]} {k}={v}"
                    for k, v in value.items()] or [f"{FLAGS[f.name]} (none)"]
        else:
            out.append(f"{FLAGS[f.name]} {value:g}" if isinstance(value, float) else f"{FLAGS[f.name]} {value}")
    return out


def place_packing(scaling: PackingScaling, *, num_windows: int | None = None) -> PackingScaling:
    """After Ray started: ``scaling`` with its selector resolved against the nodes, checked to
    fit (a request no node can satisfy fails here, with the numbers, instead of waiting forever:
    ``check_packing``; ``num_windows`` does not change what fits)."""
    nodes = placement.node_resources()
    check_packing(scaling, nodes)
    return scaling.placed(nodes)


def check_packing(scaling: PackingScaling, nodes: Sequence[Mapping[str, Any]] | None = None) -> None:
    """ValueError, with the numbers, when the actors ``scaling`` asks for (``wanted_actors``,
    whatever the windows) could never all be placed on ``nodes``: by default the Ray this
    process has (joined, or its own), else the embedded Ray it would start
    (``placement.embedded_node()``, read without Ray). Before anything starts, so that the same
    flags fail the same way (one line, exit 2) whether or not a Ray is started after all. On
    the embedded node a resource Ray measures as it starts (``placement.MEASURED_BY_RAY``) is
    left to the check once it is up."""
    embedded = False
    if nodes is None:
        embedded = not raycluster.ray_initialised()
        nodes = [placement.embedded_node()] if embedded else placement.node_resources()
    placed = scaling.placed(nodes)
    request = {"CPU": placed.cpus_per_worker, **{k: v for k, v in placed.resources.items()
                                                 if not (embedded and k.startswith(placement.MEASURED_BY_RAY))}}
    placement.check_fits("packing actors", request, placed.wanted_actors(nodes), placed.labels, nodes)


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
    resources = placement.check_resources(name, value)
    for own in ("CPU", "GPU") & resources.keys():  # Ray refuses them in an actor's custom resources
        raise ValueError(f"{name}: {own} is not a custom resource; packing actors ask for CPUs by "
                         "--cpus-per-worker ([scaling] packing_cpus_per_worker) and take no GPU")
    return resources


def _check_pool(num_workers: int | None, max_workers: int | None, num_name: str, max_name: str) -> None:
    if max_workers is not None and max_workers < (num_workers or 1):
        raise ValueError(f"{max_name} ({max_workers}) must be >= {num_name} ({num_workers or 1})")
