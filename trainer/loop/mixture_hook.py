"""The training loop's mixture hook: ``[train] mixture_hook = "my_module:reweight"``.

Every rank calls the hook after each optimizer step with a ``MixtureStep`` (the step, its loss,
this rank's rows and model inputs, the model, the sources); it returns new weights (every source
named, 0 pauses one) or None to keep them. Weights ask the feeder for the change of that step
(``RowFeeder.set_mixture``): the calls of all ranks make one change, from the first window no
rank has received (at most one window after the step's rows: rows packed ahead with the old
weights are packed again), recorded in the next checkpoint and replayed by a resumed run. The hook runs on
every rank, so it may use collectives (an ``all_reduce`` of per-source losses, so that every rank
computes the same weights); if ranks return different weights, the first to ask sets them.

A hook that does not return the same thing for the same step after a resume changes the run's
data only from where it differs: the steps before the checkpoint are replayed exactly. Weights
that come when no window of the stream is left are not applied (a warning; the run goes on); bad weights (an unknown source, all zero...) fail the run, as a bug in the hook.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from packfeed.client.sources import source_index
from packfeed.service.face import MixtureRefused

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MixtureStep:
    """What the hook sees after optimizer step ``step`` (1-based count of completed steps).

    ``rows``: this rank's micro-batches (``PackedRows``; ``sample_ids`` say which sample each
    segment is), ``inputs``: their model inputs (``to_model_inputs``), ``model``: the model being
    trained (not DDP-wrapped: a forward under ``torch.no_grad()`` costs no gradient sync),
    ``sources``: the source names in config order, ``first_ids``: the stream's source table
    (each source's first global sample id: ``source_of``, packfeed.client.sources),
    ``source_loss``: the step's token-mean loss of every source it trained a token of, over every
    rank (objective "sft"): an adaptive mixture needs no collective of its own."""

    step: int
    rank: int
    world_size: int
    loss: float
    rows: list
    inputs: list
    model: Any
    sources: tuple[str, ...]
    first_ids: tuple[int, ...]
    source_loss: Mapping[str, float] = field(default_factory=dict)

    def source_of(self, sample_ids: Any) -> Any:
        """Source index of each global sample id (-1 for padding's -1), as numpy int64."""
        return source_index(sample_ids, self.first_ids)


MixtureHook = Callable[[MixtureStep], "Mapping[str, float] | None"]


def load_hook(spec: str | None) -> MixtureHook | None:
    """The function ``spec`` ("module:function") names, or None for None; ValueError saying what
    is wrong with a spec that names none (checked by the config, before Ray starts)."""
    if spec is None:
        return None
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ValueError(f"mixture_hook must be 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"mixture_hook {spec!r}: cannot import {module_name!r} ({exc})") from None
    hook = getattr(module, name, None)
    if not callable(hook):
        raise ValueError(f"mixture_hook {spec!r}: {module_name} has no function {name!r}")
    return hook


def call_hook(hook: MixtureHook, runtime: Any, info: MixtureStep) -> dict | None:
    """Run the hook for one step and, when it returns weights, make the step's change through
    the rank's ``runtime`` (trainer/launch/ray_runtime.py; rank 0 says it once). Returns the change
    (client/mixture_record.py record + ``schedule_index``) or None."""
    weights = hook(info)
    if weights is None:
        return None
    try:
        change = runtime.set_mixture(info.step, dict(weights))
    except MixtureRefused as exc:  # every window is planned: the run goes on with the weights it has
        if info.rank == 0:
            logger.warning("step %d: the mixture hook's weights were not applied: %s", info.step, exc)
        return None
    if info.rank == 0:
        near = f"; the ranks are in window {change['consumer_window']}" if "consumer_window" in change else ""
        logger.info("step %d: the mixture changes from sample %s (window %d%s) to %s", info.step,
                    f"{change['from_sample']:,}", change["window"], near, change["weights"])
    return change
