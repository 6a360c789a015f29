"""Direct preference optimisation on packed pairs: the loss is the pair mean over the WHOLE step.

A pair is one sample with two segments in one packed row (client/rows.py, ``pair_roles``). The
policy and the reference run once each on the packed micro-batch; ``segment_logps`` turns their
logits into per-segment sums (with ``chunk_tokens`` > 0, the chunked loss head's per-token
log-probs, trainer/objective/loss_head.py, and ``segment_sums``: never the full logits) and
``pair_logps`` gathers them per pair, so a pair's log-ratio is exactly what it would be run
alone (tests/models/test_dpo_packed.py checks it, gradients too).

The losses (sigmoid, ipo) are ``DpoLoss``'s, in trainer/objective/dpo_loss.py. With ``[lora]``
and ``dpo_reference = "initial"`` there is no reference model: the policy runs once more with its
adapter disabled (``disable_adapter()``), i.e. as the frozen weights it started from.

Normalisation, as the SFT step's (trainer/objective/step.py): the step's pairs are counted over every
micro-batch and rank (one all_reduce) BEFORE any backward, and each micro-batch backpropagates
``sum of its pair losses * world_size / pairs of the step``; DDP's gradient mean over ranks
then gives exactly the gradient of the mean over all the step's pairs, however they were packed,
split into micro-batches or spread over ranks. Worked example, 2 ranks x 2 micro-batches with 3,
1 (rank 0) and 4, 0 (rank 1) pairs: 8 pairs; rank 0's first micro-batch backpropagates
loss_sum * 2 / 8.

Rewards, logged: ``beta * log-ratio`` per side; the margin is chosen - rejected, the accuracy
the fraction of pairs whose chosen reward is the higher. Segments outside pairs (plain samples,
padding) add nothing.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from packfeed.client.model_inputs import to_model_inputs
from packfeed.client.pair_logps import pair_logps, pair_segments, segment_logps, segment_sums
from packfeed.client.rows import PackedRows
from packfeed.trainer.loop.evaluate import EvalObjective
from packfeed.trainer.objective.dpo_loss import DpoLoss
from packfeed.trainer.objective.loss_head import trained_token_logps
from packfeed.trainer.model.builder import build_model
from packfeed.trainer.model.parallelize import unwrapped
from packfeed.trainer.objective.step import StepResult, backward_micro_batches
from packfeed.trainer.run_config import INITIAL_REFERENCE, ModelConfig

logger = logging.getLogger(__name__)

PAIR_KEYS = ("chosen_segments", "rejected_segments")  # in the micro-batch dicts; not model inputs


def dpo_micro_batch(rows: PackedRows, *, device: Any = None) -> dict:
    """``to_model_inputs(rows)`` plus the segment indices of the rows' pairs (``PAIR_KEYS``)."""
    import torch

    chosen, rejected = pair_segments(rows.pair_roles, rows.sample_ids, rows.segment_splits)
    inputs = to_model_inputs(rows, device=device)
    inputs["chosen_segments"] = torch.from_numpy(chosen).to(inputs["input_ids"].device)
    inputs["rejected_segments"] = torch.from_numpy(rejected).to(inputs["input_ids"].device)
    return inputs


def batch_pair_logps(model: Any, inputs: Mapping[str, Any], *, chunk_tokens: int = 0) -> dict[str, Any]:
    """``pair_logps`` of one packed micro-batch (a ``dpo_micro_batch`` dict) under ``model``.
    ``chunk_tokens`` 0: from the full logits (``segment_logps``); > 0: through the chunked loss
    head (``trained_token_logps`` then ``segment_sums``), the same sums to float rounding."""
    if chunk_tokens:
        logps, slots = trained_token_logps(model, inputs, chunk_tokens=chunk_tokens)
        sums, counts = segment_sums(logps, slots, inputs["cu_seq_lens_q"])
        return pair_logps(sums, counts, inputs["chosen_segments"], inputs["rejected_segments"])
    kwargs = {key: value for key, value in inputs.items() if key != "labels" and key not in PAIR_KEYS}
    logits = model(**kwargs).logits
    sums, counts = segment_logps(logits, inputs["labels"], inputs["cu_seq_lens_q"])
    return pair_logps(sums, counts, inputs["chosen_segments"], inputs["rejected_segments"])


def accumulate_dpo_gradients(
    model: Any, micro_batches: Sequence[dict], *, reference: Any, loss: DpoLoss, autocast_dtype: Any = None,
    chunk_tokens: int = 0,
) -> StepResult:
    """Forward (policy and reference) and backward every micro-batch of one step.

    ``micro_batches``: this rank's ``dpo_micro_batch`` dicts on the model's device; every rank
    must pass the same number (DDP syncs on the last backward). ``reference``: the frozen model
    (eval mode, no gradients), or None for a LoRA policy (trainer/model/lora.py): the policy
    itself with its adapter disabled, i.e. the frozen weights it started from. Returns the pair
    mean loss over the whole step (all ranks), ``trained_tokens`` (the pairs' trained tokens, 0
    when the step holds no pair), ``pairs`` and the reward figures. ``chunk_tokens``: the loss
    head's chunk, for the policy and the
    reference alike (``batch_pair_logps``; 0: full logits). Cost: 2 all_reduces of a few
    scalars, a reference forward per micro-batch.
    """
    def micro_loss(inputs: dict) -> tuple[Any, Any]:
        return dpo_figures(model, inputs, reference=reference, loss=loss, chunk_tokens=chunk_tokens)

    local = sum(len(mb["chosen_segments"]) for mb in micro_batches)
    step_pairs, totals = backward_micro_batches(model, micro_batches, local_count=local, micro_loss=micro_loss,
                                                autocast_dtype=autocast_dtype)
    figures = pair_means(totals)
    return StepResult(
        loss=figures["loss"], trained_tokens=figures["tokens"], pairs=step_pairs,
        rewards={name.removeprefix("reward_"): figures[name] for name in DPO_REWARDS},
    )


DPO_REWARDS = ("reward_chosen", "reward_rejected", "reward_margin", "reward_accuracy")


def dpo_figures(model: Any, inputs: dict, *, reference: Any, loss: DpoLoss, chunk_tokens: int = 0) -> tuple[Any, Any]:
    """(the micro-batch's summed pair losses, its figures: [loss sum, chosen reward sum, rejected
    reward sum, pairs whose chosen reward is the higher, the pairs' trained tokens, pairs]) of
    one ``dpo_micro_batch`` dict: the policy's log-probs against the reference's (no gradient).
    Summed over micro-batches and ranks, ``pair_means`` turns the figures into the pair means."""
    import torch

    frozen, view = _reference_view(model, reference)
    with torch.no_grad(), view:
        ref = batch_pair_logps(frozen, inputs, chunk_tokens=chunk_tokens)
    policy = batch_pair_logps(model, inputs, chunk_tokens=chunk_tokens)
    losses, chosen_rewards, rejected_rewards = loss.pair_losses(policy, ref)
    loss_sum = losses.sum()
    return loss_sum, torch.stack([
        loss_sum.detach(), chosen_rewards.sum(), rejected_rewards.sum(), (chosen_rewards > rejected_rewards).sum(),
        (policy["chosen_tokens"] + policy["rejected_tokens"]).sum(),
        torch.tensor(float(len(losses)), device=losses.device),
    ]).double()


def pair_means(totals: Sequence[float]) -> dict[str, Any]:
    """The pair means of summed ``dpo_figures``: ``loss``, ``pairs``, ``tokens`` (0 without a
    pair), ``reward_chosen``, ``reward_rejected``, ``reward_margin``, ``reward_accuracy``."""
    loss_total, chosen, rejected, correct, tokens, pairs = totals
    n = max(int(pairs), 1)
    return {"loss": loss_total / n, "pairs": int(pairs), "tokens": int(tokens) if pairs else 0,
            "reward_chosen": chosen / n, "reward_rejected": rejected / n, "reward_margin": (chosen - rejected) / n,
            "reward_accuracy": correct / n}


def _reference_view(model: Any, reference: Any) -> tuple[Any, Any]:
    """(the module the reference log-probs come from, the context they are computed in): the
    frozen ``reference``; None: the LoRA policy (the module a DDP wrapper holds: no gradient
    sync for a forward without backward) under ``disable_adapter()``."""
    import contextlib

    if reference is not None:
        return reference, contextlib.nullcontext()
    policy = unwrapped(model)
    return policy, policy.disable_adapter()


def build_reference(model: Any, reference: str, *, vocab_size: int, device: Any, seed: int) -> Any:
    """The frozen reference model: ``reference`` "initial" builds ``model`` (a ``ModelConfig``)
    again, so it holds the weights the run started from even when the policy is then loaded from
    a checkpoint; else the model named ``reference``, with the policy's attention back-end. In
    eval mode, without gradients. Cost: the memory of a second copy of the weights."""
    config = model if reference == INITIAL_REFERENCE else ModelConfig(name=reference, attn=model.attn)
    frozen = build_model(config, vocab_size=vocab_size, device=device, seed=seed)
    frozen.eval()
    frozen.requires_grad_(False)
    logger.info("DPO reference (frozen): %s", f"the initial weights of {model.name}" if config is model else reference)
    return frozen


def check_pairs_trained(result: StepResult, rows: Sequence[PackedRows], step: int) -> None:
    """ValueError when a step of objective "dpo" held real samples but no preference pair on any
    rank: the inputs are not preference data (a step of padding alone, at the end, passes)."""
    if result.pairs == 0 and any(r.num_real_tokens for r in rows):
        raise ValueError(f"objective = \"dpo\" but step {step} holds no preference pair: give inputs in a preference "
                         "format (prompt, chosen, rejected) or train with objective = \"sft\"")


def dpo_objective(model: Any, *, reference: Any, loss: Any, chunk_tokens: int) -> EvalObjective:
    """What ``[eval]`` computes under DPO (trainer/loop/evaluate.py): the pair-mean loss, reward
    margin and accuracy of the held-out pairs (``dpo_figures``, against the run's ``reference``:
    a frozen model, or None for the LoRA base)."""
    def figures(inputs: dict, rows: PackedRows) -> Any:
        return dpo_figures(model, inputs, reference=reference, loss=loss, chunk_tokens=chunk_tokens)[1]

    return EvalObjective(to_inputs=dpo_micro_batch, figures=figures, size=lambda sources: 6,
                         record=lambda totals, names: {**pair_means(totals),
                                                       **({} if totals[5] else {"loss": float("nan")})})
