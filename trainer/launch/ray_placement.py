"""Placement of a training run: resolve the selectors of [scaling] against the cluster and
check, before anything is started, that every actor can be placed (service/pipeline/placement.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from packfeed.service.face import (
    DRIVER_DEFAULT,
    TRAINER_DEFAULT,
    PackingScaling,
    check_fits,
    label_matches,
    node_resources,
    resolve_selector,
)
from packfeed.trainer.run_config import TrainScaling


@dataclass(frozen=True)
class Placement:
    packer: dict[str, str]
    trainer: dict[str, str]
    driver: dict[str, str]

    def driver_options(self) -> dict:
        """Ray actor options for the driver-side actors (the feeder)."""
        return {"label_selector": self.driver} if self.driver else {}


def check_placement(scaling: TrainScaling, *, use_gpu: bool, nodes: list | None = None) -> Placement:
    """The run's selectors, after checking that train workers and packing actors fit (also
    together, on the nodes they share). ``nodes``: as ``node_resources()`` (tests)."""
    nodes = node_resources() if nodes is None else nodes
    packing = scaling.packing
    chosen = Placement(
        packer=packing.placed(nodes).labels,
        trainer=resolve_selector(scaling.trainer_labels, TRAINER_DEFAULT, nodes),
        driver=resolve_selector(scaling.driver_labels, DRIVER_DEFAULT, nodes),
    )
    trainer_request = {"CPU": scaling.cpus_per_worker, **({"GPU": 1} if use_gpu else {}), **scaling.trainer_resources}
    packer_request = {"CPU": packing.cpus_per_worker, **packing.resources}
    check_fits("train workers", trainer_request, scaling.num_workers, chosen.trainer, nodes)
    check_fits("packing actors", packer_request, packing.num_workers, chosen.packer, nodes)
    check_fits("the feeder", {}, 1, chosen.driver, nodes)
    shared = [n for n in nodes if label_matches(n["labels"], chosen.trainer)
              and label_matches(n["labels"], chosen.packer)]
    if shared and len(shared) == len([n for n in nodes if label_matches(n["labels"], chosen.trainer)]):
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


def packing_scaling(scaling: TrainScaling, chosen: Placement) -> PackingScaling:
    """The run's packing actors, placed where ``check_placement`` chose."""
    return dataclasses.replace(scaling.packing, labels=chosen.packer)
