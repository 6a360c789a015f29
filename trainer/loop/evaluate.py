"""Held-out evaluation: the ``[eval]`` table, each rank's eval rows, the eval loss of the model.

The eval set is a packed directory (``packfeed pack`` of held-out files, with the run's tokenizer
and ``seq_len``): the same rows at every evaluation, packed the same way as the training rows.
Every rank reads it at set-up by the serve contract the training rows follow (``packed_dir_feeder``,
one micro-batch of ``micro_batch_rows`` rows a rank per eval step, padding rows filling the last
one), so every rank runs the same number of forwards: FSDP2 gathers the weights of each layer
on every rank at once. ``max_rows`` keeps the first rows of the directory: a row past it is
still computed (the ranks stay in step) but its labels are masked, so it counts for nothing.

``evaluate`` runs the objective's own loss under ``torch.no_grad`` in eval mode, sums the figures
of every micro-batch and every rank (one all_reduce) and returns them as a record. SFT
(``sft_objective``: ``loss_figures``, the token losses of the trained targets, the chunked head
when the run uses it): the token mean over the whole eval set, and per source of the eval set (a
row mixes sources: each token is attributed to the sample it belongs to); the loss of
``final/`` computed directly on the same rows is the same number
(tests/integration/train/test_eval.py). DPO (``dpo_objective``: ``dpo_figures``, against the
run's reference): the pair-mean loss, reward margin and accuracy of the held-out pairs.

Worked example, 2 ranks, micro_batch_rows 2, an eval set of 5 rows, max_rows 0: eval step 0
gives rank 0 rows 0, 2 and rank 1 rows 1, 3; step 1 gives rank 0 row 4 and a padding row, rank 1
two padding rows. Each rank runs 2 forwards; the loss is (sum of the token losses of rows 0-4) /
(their trained tokens).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from packfeed.client.model_inputs import to_model_inputs
from packfeed.client.rows import IGNORE_INDEX, PackedRows
from packfeed.service.face import display, find_packed_dir, packed_dir_feeder
from packfeed.trainer.loop.interval import per_source
from packfeed.trainer.objective.step import loss_figures, micro_batch_contexts, source_tokens


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """The ``[eval]`` table. ``packed``: the eval set, a packed directory (a path or a URI) of
    the held-out samples, packed with the run's tokenizer and ``seq_len``; ``every_steps``:
    evaluate after every that many steps (0: only after the last step, which is always
    evaluated); ``max_rows``: evaluate on the first that many rows of it (0: all of them)."""

    packed: str
    every_steps: int = 0
    max_rows: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.packed, str) or not self.packed:
            raise ValueError(f"[eval] packed must be a packed directory (packfeed pack of the held-out files), got "
                             f"{self.packed!r}")
        for name in ("every_steps", "max_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"[eval] {name} must be an integer >= 0, got {value!r}")

    def due(self, step: int, last: int) -> bool:
        """Whether the model is evaluated after ``step`` of a run whose last step is ``last``."""
        return step == last or bool(self.every_steps and step % self.every_steps == 0)


def check_eval_set(config: EvalConfig, *, seq_len: int) -> Any:
    """The eval set's ``PackedDir``; ValueError in one line when ``config.packed`` is not a
    finished packed directory or holds rows of another length than the run's."""
    packed = find_packed_dir([config.packed])
    if packed is None:
        raise ValueError(f"[eval] packed: {display(config.packed)} is not a packed directory: pack the held-out files "
                         "with `packfeed pack` (the run's tokenizer and seq_len) and name its output")
    if packed.seq_len != seq_len:
        raise ValueError(f"[eval] packed: {display(config.packed)} holds rows of {packed.seq_len} tokens, the run's "
                         f"seq_len is {seq_len}: pack the eval set with seq_len = {seq_len}")
    return packed


@dataclass(frozen=True)
class EvalSet:
    """One rank's eval micro-batches (the same count on every rank) and the eval set's sources
    (name, first global sample id), whose token losses ``evaluate`` reports apart."""

    batches: list[PackedRows]
    sources: list[tuple[str, int]]


def load_eval_set(config: EvalConfig, *, seq_len: int, rank: int, world_size: int, micro_rows: int, pad_id: int,
                  capacity: int) -> EvalSet:
    """Rank ``rank``'s rows of the eval set (module docstring), read once at set-up."""
    packed = check_eval_set(config, seq_len=seq_len)
    feeder, sources = packed_dir_feeder(packed, saved_manifest=None, world_size=world_size, grad_accum=1,
                                        micro_rows=micro_rows, pad_id=pad_id, state=None, capacity=capacity)
    steps = math.ceil(config.max_rows / (world_size * micro_rows)) if config.max_rows else None
    batches: list[PackedRows] = []
    try:
        while steps is None or len(batches) < steps:
            step = feeder.get_step(rank, len(batches))
            if step is None:
                break
            batches.extend(_first_rows(rows, config.max_rows) for rows in step)
    finally:
        feeder.hub.close()
    return EvalSet(batches=batches, sources=list(sources))


def _first_rows(rows: PackedRows, max_rows: int) -> PackedRows:
    """``rows`` with the labels of every row past the eval set's first ``max_rows`` masked (0: none)."""
    past = rows.row_index >= max_rows if max_rows else None
    if past is None or not past.any():
        return rows
    labels = rows.labels.copy()
    labels[past] = IGNORE_INDEX
    return dataclasses.replace(rows, labels=labels)


@dataclass(frozen=True)
class EvalObjective:
    """What an evaluation computes per micro-batch, for the run's objective: ``to_inputs(rows,
    device=)`` (the objective's micro-batch dict), ``figures(inputs, rows)`` (a 1-D float64
    tensor of ``size`` sums), ``record(totals, names)`` (the eval record of their sums over the
    whole eval set). ``sft_objective`` and ``dpo_objective`` build them."""

    to_inputs: Callable[..., dict]
    figures: Callable[[dict, PackedRows], Any]
    size: Callable[[int], int]  # of the number of the eval set's sources
    record: Callable[[Sequence[float], Sequence[str]], dict]


def sft_objective(model: Any, *, chunk_tokens: int, first_ids: Sequence[int]) -> EvalObjective:
    """The token-mean loss, per source of the eval set (``loss_figures``, ``eval_record``)."""
    import torch

    def figures(inputs: dict, rows: PackedRows) -> Any:
        return loss_figures(model, inputs, chunk_tokens=chunk_tokens, num_sources=len(first_ids),
                            token_sources=torch.from_numpy(source_tokens(rows, first_ids)))[1]

    return EvalObjective(to_inputs=to_model_inputs, figures=figures, size=lambda sources: 2 + 2 * sources,
                         record=lambda totals, names: eval_record(totals, names=names))


def evaluate(model: Any, eval_set: EvalSet, objective: EvalObjective, *, device: Any, autocast_dtype: Any = None) -> dict:
    """The eval record of ``model`` (module docstring; every rank calls it, a collective): for
    SFT ``loss`` (the token mean over the whole eval set, all ranks), ``tokens`` (its trained
    tokens), ``source_loss`` and ``source_tokens`` (per source of the eval set); for DPO the
    pair means (``pair_means``: loss, pairs, reward margin and accuracy, ...)."""
    import torch
    import torch.distributed as dist

    totals = torch.zeros(objective.size(len(eval_set.sources)), dtype=torch.float64, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for rows in eval_set.batches:
                _, autocast = micro_batch_contexts(model, last=True, device=device, autocast_dtype=autocast_dtype)
                with autocast:
                    totals += objective.figures(objective.to_inputs(rows, device=device), rows).to(device)
    finally:
        model.train(was_training)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals)
    return objective.record(totals.tolist(), [name for name, _ in eval_set.sources])


def eval_record(totals: Sequence[float], *, names: Sequence[str]) -> dict:
    """The record of summed figures ``[loss sum, tokens, per-source sums, per-source tokens]``."""
    loss_sum, tokens, rest = totals[0], int(totals[1]), totals[2:]
    return {"loss": loss_sum / tokens if tokens else float("nan"), "tokens": tokens,
            **per_source(names, rest[:len(names)], [int(n) for n in rest[len(names):]])}
