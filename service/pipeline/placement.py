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

import math
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


def node_resources() -> list[dict[str, Any]]:
    """Alive nodes as {"id", "address", "resources", "labels"} (needs Ray initialised)."""
    import ray

    return [
        {"id": n["NodeID"], "address": n.get("NodeManagerAddress", ""), "resources": n.get("Resources", {}),
         "labels": dict(n.get("Labels", {}) or {})}
        for n in ray.nodes() if n.get("Alive")
    ]  # fmt: skip
