"""Where packfeed's actors run: node labels and custom resources, checked before anything waits.

Roles (docs/design.md, "On a cluster"): nodes labelled ``packfeed/role=packer`` run the
packing actors (CPU node group), nodes labelled ``packfeed/role=trainer`` run the train
workers (GPU node group), and the driver-side actor (``packfeed train``'s feeder) runs
anywhere but a trainer node. Those are the defaults, and they apply only
when some node of the cluster carries the ``packfeed/role`` label: on an unlabelled local Ray
nothing changes. Any of them can be set explicitly (``[scaling] packer_labels = {...}``; an
empty table turns a selector off).

Selectors use Ray's label-selector syntax: ``value``, ``!value`` (also matches a node without
the label), ``in(a,b)``, ``!in(a,b)``. ``check_fits`` applies the same rules to the nodes Ray
reports, so a request no node can ever satisfy fails at once with the numbers instead of
waiting forever.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
from typing import Any, Mapping, Sequence

ROLE_LABEL = "packfeed/role"
PACKER_DEFAULT = {ROLE_LABEL: "packer"}
TRAINER_DEFAULT = {ROLE_LABEL: "trainer"}
DRIVER_DEFAULT = {ROLE_LABEL: "!trainer"}


def check_selector(name: str, value: Any) -> dict[str, str]:
    """A label selector from config: a table of string keys and values (Ray's syntax)."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"{name} must be a table of label = \"value\" (e.g. {{\"{ROLE_LABEL}\" = \"packer\"}}), got {value!r}")
    return dict(value)


def check_resources(name: str, value: Any) -> dict[str, float]:
    """Custom resources from config: a table of names and positive amounts."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a table of resource = amount, got {value!r}")
    out = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            raise ValueError(f"{name}: {k} must be a finite number > 0, got {v!r}")
        out[str(k)] = float(v)
    return out


def label_matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    """True when a node with ``labels`` satisfies ``selector`` (Ray's semantics)."""
    for key, expr in selector.items():
        negate = expr.startswith("!")
        expr = expr[1:] if negate else expr
        if expr.startswith("in(") and expr.endswith(")"):
            ok = labels.get(key) in {v.strip() for v in expr[3:-1].split(",")}
        else:
            ok = labels.get(key) == expr
        if ok == negate:
            return False
    return True


def has_roles(nodes: Sequence[Mapping[str, Any]]) -> bool:
    return any(ROLE_LABEL in n["labels"] for n in nodes)


def resolve(configured: Mapping[str, str] | None, default: Mapping[str, str], nodes: Sequence[Mapping[str, Any]]) -> dict:
    """The selector to use: the configured one, else the role default when the cluster has roles."""
    if configured is not None:
        return dict(configured)
    return dict(default) if has_roles(nodes) else {}


def check_fits(what: str, request: Mapping[str, float], count: int, selector: Mapping[str, str],
               nodes: Sequence[Mapping[str, Any]]) -> None:
    """ValueError, with the numbers, when ``count`` actors each asking for ``request`` (e.g.
    {"CPU": 1}) can never all be placed on the nodes matching ``selector``."""
    matching = [n for n in nodes if label_matches(n["labels"], selector)]
    where = f"nodes matching {dict(selector)}" if selector else "nodes"
    if not matching:
        seen = sorted({f"{k}={v}" for n in nodes for k, v in n["labels"].items() if not k.startswith("ray.io/")})
        raise ValueError(
            f"{what}: no node matches the labels {dict(selector)} (node labels in the cluster: {', '.join(seen) or 'none'}); "
            "label the node group (`ray start --labels`, or the RayCluster's rayStartParams) or change [scaling]"
        )
    wanted = {k: float(v) for k, v in request.items() if float(v) > 0}
    fit = 0
    for n in matching:
        per_node = [float(n["resources"].get(k, 0)) // v for k, v in wanted.items()]
        fit += int(min(per_node)) if per_node else count
    if fit >= count:
        return
    have = ", ".join(
        f"{k}: largest node {max(float(n['resources'].get(k, 0)) for n in matching):g}, "
        f"all {sum(float(n['resources'].get(k, 0)) for n in matching):g}"
        for k in wanted
    )
    asked = ", ".join(f"{v:g} {k}" for k, v in wanted.items())
    raise ValueError(
        f"{what}: {count} x ({asked}) do not fit on the {len(matching)} {where} ({have}; room for {fit}): "
        "lower the count or the request, or add nodes"
    )


@dataclasses.dataclass(frozen=True)
class TrainPlacement:
    """Where a training run's actors go: the label selectors of the packing actors, the train
    workers and the driver-side actors (the feeder)."""

    packer: dict[str, str]
    trainer: dict[str, str]
    driver: dict[str, str]

    def driver_options(self) -> dict:
        """Ray actor options for the driver-side actors (the feeder)."""
        return {"label_selector": self.driver} if self.driver else {}

    def packing(self, packing: Any) -> Any:
        """The run's packing actors (a PackingScaling), placed where the packers go."""
        return dataclasses.replace(packing, labels=self.packer)


def check_train_placement(scaling: Any, *, use_gpu: bool, nodes: list | None = None) -> TrainPlacement:
    """A training run's selectors (``scaling``: its ``[scaling]`` table: ``num_workers``,
    ``cpus_per_worker``, ``trainer_resources``, ``trainer_labels``, ``driver_labels`` and the
    packing actors' PackingScaling ``packing``), after checking that train workers and packing
    actors fit, also together on the nodes they share. ``nodes``: as ``node_resources()`` (tests)."""
    nodes = node_resources() if nodes is None else nodes
    packing = scaling.packing
    chosen = TrainPlacement(
        packer=packing.placed(nodes).labels,
        trainer=resolve(scaling.trainer_labels, TRAINER_DEFAULT, nodes),
        driver=resolve(scaling.driver_labels, DRIVER_DEFAULT, nodes),
    )
    trainer_request = {"CPU": scaling.cpus_per_worker, **({"GPU": 1} if use_gpu else {}), **scaling.trainer_resources}
    packer_request = {"CPU": packing.cpus_per_worker, **packing.resources}
    check_fits("train workers", trainer_request, scaling.num_workers, chosen.trainer, nodes)
    check_fits("packing actors", packer_request, packing.num_workers, chosen.packer, nodes)
    check_fits("the feeder", {}, 1, chosen.driver, nodes)
    on_trainer_nodes = [n for n in nodes if label_matches(n["labels"], chosen.trainer)]
    shared = [n for n in on_trainer_nodes if label_matches(n["labels"], chosen.packer)]
    if shared and len(shared) == len(on_trainer_nodes):
        # Train workers and packers share every node: their CPUs add up (Ray deadlocks otherwise).
        need = scaling.num_workers * scaling.cpus_per_worker + packing.num_workers * packing.cpus_per_worker
        have = sum(float(n["resources"].get("CPU", 0)) for n in shared)
        if need > have + 1e-9:
            raise ValueError(
                f"{scaling.num_workers} train workers x {scaling.cpus_per_worker:g} CPU + {packing.num_workers} "
                f"packing actors x {packing.cpus_per_worker:g} CPU = {need:g} CPUs, the nodes they share have "
                f"{have:g}: lower [scaling] cpus_per_worker / packing_cpus_per_worker (fractions are fine) or the counts"
            )
    return chosen


def node_resources() -> list[dict[str, Any]]:
    """Alive nodes as {"id", "address", "resources", "labels"} (needs Ray initialised)."""
    import ray

    return [
        {"id": n["NodeID"], "address": n.get("NodeManagerAddress", ""), "resources": n.get("Resources", {}),
         "labels": dict(n.get("Labels", {}) or {})}
        for n in ray.nodes() if n.get("Alive")
    ]  # fmt: skip


# Resources Ray measures as it starts a node (no packfeed request names them): an embedded Ray's
# node before it starts holds only its CPUs and what $RAY_OVERRIDE_RESOURCES sets.
MEASURED_BY_RAY = ("memory", "object_store_memory", "node:", "accelerator_type:")


def embedded_node() -> dict[str, Any]:
    """The node an embedded Ray would start on this machine, as ``node_resources()`` would list
    it, read without Ray (a run may start none): its CPUs as Ray counts them (``ray_cpus``),
    and the resources and labels $RAY_OVERRIDE_RESOURCES and $RAY_OVERRIDE_LABELS give it (JSON,
    as Ray reads them). What Ray measures as it starts (``MEASURED_BY_RAY``, GPUs) is not in it."""
    resources = {k: float(v) for k, v in _json_env("RAY_OVERRIDE_RESOURCES").items()}
    resources.setdefault("CPU", float(ray_cpus()))
    labels = {str(k): str(v) for k, v in _json_env("RAY_OVERRIDE_LABELS").items()}
    return {"id": "embedded", "address": "127.0.0.1", "resources": resources, "labels": labels}


def ray_cpus(quota_files: tuple[str, str] = ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
             cpu_max_file: str = "/sys/fs/cgroup/cpu.max", cpuset_file: str = "/sys/fs/cgroup/cpuset/cpuset.cpus") -> int:
    """This machine's CPUs as Ray 2.x counts them for a node it starts (``ray._private.utils.
    get_num_cpus``, without importing Ray: 0.9 s): ``multiprocessing.cpu_count()``, or, in a
    container, the smaller of its CPU quota (cgroup v1's cfs quota / period, else v2's cpu.max;
    a quota of 0 counts 1) and its cpuset (cgroup v1), truncated; $RAY_USE_MULTIPROCESSING_CPU_COUNT
    skips the container's limits. Not the CPUs this process may run on (``sched_getaffinity``):
    Ray does not read them."""
    count = multiprocessing.cpu_count()
    if os.environ.get("RAY_USE_MULTIPROCESSING_CPU_COUNT"):
        return count
    quota = None
    try:
        if all(os.path.exists(f) for f in quota_files):
            with open(quota_files[0]) as q, open(quota_files[1]) as period:
                quota = float(q.read()) / float(period.read())
        elif os.path.exists(cpu_max_file):
            with open(cpu_max_file) as f:
                limit, period = f.read().split()
            quota = float(limit) / float(period) if limit.isnumeric() and period.isnumeric() else None
    except (OSError, ValueError):  # Ray logs it and counts without the quota
        quota = None
    if quota is not None and quota < 0:
        quota = None
    elif quota == 0:
        quota = 1.0
    cpuset = None
    try:
        if os.path.exists(cpuset_file):
            with open(cpuset_file) as f:
                ids = 0
                for part in f.read().strip().split(","):
                    start, _, end = part.partition("-")
                    ids += int(end) - int(start) + 1 if end else (1 if start else 0)
                cpuset = ids
    except (OSError, ValueError):
        cpuset = None
    limit = min(quota, cpuset) if quota and cpuset else quota or cpuset
    return int(limit) if limit else count


def _json_env(name: str) -> dict:
    text = os.environ.get(name)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        raise ValueError(f"${name} must be a JSON object (Ray reads it as one), got {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"${name} must be a JSON object (Ray reads it as one), got {text!r}")
    return value

