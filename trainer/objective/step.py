"""One optimizer step on packed rows: the loss is the token mean over the WHOLE step.

The step's trained tokens are counted over every gradient-accumulation micro-batch and every
data-parallel rank (one ``all_reduce`` of a scalar) BEFORE any backward, and each micro-batch
backpropagates ``sum of its token losses * world_size / tokens of the step``. DDP averages
gradients over ranks (divides by world_size), so the gradient is exactly that of

    sum over all ranks and micro-batches of token losses / trained tokens of the step,

which does not depend on how samples were packed into rows, split into micro-batches or
spread over ranks (tests/integration/train/test_train_ddp_loss.py checks it against samples run one
at a time). Averaging per-micro-batch means instead would weight a token of a short
micro-batch more than one of a long micro-batch.

The token losses come from the model's full logits (``chunk_tokens`` 0: B x L x V float32,
as Hugging Face's loss) or from the chunked loss head (``chunk_tokens`` > 0,
trainer/objective/loss_head.py: the trained positions only, ``chunk_tokens`` x V logits at a time, the
same sum to float rounding).

Pure torch: no Ray. ``torch.distributed`` is used when it is initialised (DDP), else the step
is single-process.

Worked example, 2 ranks x 2 micro-batches with 3, 5 (rank 0) and 4, 0 (rank 1) trained
tokens: the step has 12 tokens; rank 0's first micro-batch backpropagates loss_sum * 2 / 12.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from packfeed.client.model_inputs import num_trained_tokens
from packfeed.client.rows import IGNORE_INDEX
from packfeed.client.sources import source_index
from packfeed.trainer.objective.loss_head import NON_MODEL_KEYS, trained_token_logps


@dataclass(frozen=True)
class StepResult:
    loss: float  # token mean over the whole step, all ranks (DPO: pair mean)
    trained_tokens: int  # over the whole step, all ranks
    grad_norm: float = float("nan")
    lr: float = float("nan")
    pairs: int = 0  # preference pairs of the step, all ranks (DPO only)
    rewards: Mapping[str, float] = field(default_factory=dict)  # DPO: chosen, rejected, margin, accuracy
    # SFT with a source table: per source (index into the stream's sources), the summed token
    # losses and the trained tokens of the step, all ranks (``source_loss``: their ratio)
    source_sums: tuple[float, ...] = ()
    source_tokens: tuple[int, ...] = ()


def token_losses(model: Any, inputs: dict, *, chunk_tokens: int = 0) -> tuple[Any, Any]:
    """(losses, slots) of one micro-batch: the causal-LM loss of every trained target (fp32
    [N]) and the slot predicting it (int64 [N], ``r * L + t`` for ``labels[r, t + 1]``),
    row-major, as ``trained_token_logps`` gives them.

    Token t predicts ``labels[t + 1]`` inside each row (Hugging Face's shift); positions whose
    label is IGNORE_INDEX (prompts, padding, first token of every sample) are not trained.
    ``chunk_tokens`` 0: from the model's full logits (a B x L x V float32 copy and its
    gradient); > 0: through the chunked loss head, at most ``chunk_tokens`` positions' logits
    alive at a time.
    """
    import torch
    import torch.nn.functional as F

    if chunk_tokens:
        logps, slots = trained_token_logps(model, inputs, chunk_tokens=chunk_tokens)
        return -logps, slots
    labels = inputs["labels"]
    logits = model(**{key: value for key, value in inputs.items() if key not in NON_MODEL_KEYS}).logits
    row, t = torch.nonzero(labels[:, 1:] != IGNORE_INDEX, as_tuple=True)
    losses = F.cross_entropy(logits[row, t].float(), labels[row, t + 1].long(), reduction="none")
    return losses, row * labels.shape[1] + t


def token_loss_sum(model: Any, inputs: dict, *, chunk_tokens: int = 0) -> Any:
    """Sum of the causal-LM token losses of one micro-batch (fp32 scalar tensor, ``token_losses``)."""
    return token_losses(model, inputs, chunk_tokens=chunk_tokens)[0].sum()


def loss_figures(model: Any, inputs: dict, *, chunk_tokens: int = 0, token_sources: Any = None,
                 num_sources: int = 0) -> tuple[Any, Any]:
    """(the micro-batch's loss sum, its figures: [loss sum, trained tokens, then with
    ``token_sources`` (int64 [B, L], the source of every token, -1 for padding; ``num_sources``
    S) the summed losses of each source (S), then its trained tokens (S)]). The figures are
    detached float64; summed over micro-batches and ranks they give the step's (or the eval
    set's) token mean per source."""
    import torch

    losses, slots = token_losses(model, inputs, chunk_tokens=chunk_tokens)
    loss_sum = losses.sum()
    figures = [losses.detach().double().sum().reshape(1),  # in float64, as the per-source sums
               torch.tensor([float(len(slots))], dtype=torch.float64, device=losses.device)]
    if token_sources is not None:
        sources = token_sources.to(losses.device).reshape(-1)[slots + 1]  # the target token's source
        keep = sources >= 0
        figures.append(torch.zeros(num_sources, dtype=torch.float64, device=losses.device)
                       .index_add_(0, sources[keep], losses.detach().double()[keep]))
        figures.append(torch.bincount(sources[keep], minlength=num_sources).double())
    return loss_sum, torch.cat(figures)


def accumulate_gradients(
    model: Any, micro_batches: Sequence[dict], *, autocast_dtype: Any = None, chunk_tokens: int = 0,
    token_sources: Sequence[Any] | None = None, num_sources: int = 0,
) -> StepResult:
    """Forward and backward every micro-batch of one step; leaves the step's gradients in .grad.

    ``micro_batches``: this rank's model inputs (from ``to_model_inputs``), all already on the
    model's device. Every rank must call this with the same number of micro-batches (DDP
    synchronises on the last backward). ``autocast_dtype``: e.g. torch.bfloat16 on GPU, None
    for fp32. ``chunk_tokens``: the loss head's chunk (``token_losses``; 0: full logits).
    ``token_sources``: one int64 [B, L] per micro-batch, the source of every token (-1: padding;
    ``source_tokens``), of ``num_sources`` sources: the result then has the step's loss per source.
    Cost: one all_reduce of 1 scalar before and one of 2 + 2S figures after, plus DDP's gradient sync.
    """
    sources = iter(token_sources or ())

    def micro_loss(inputs: dict) -> tuple[Any, Any]:
        return loss_figures(model, inputs, chunk_tokens=chunk_tokens, token_sources=next(sources, None),
                            num_sources=num_sources)

    local = sum(num_trained_tokens(mb) for mb in micro_batches)
    step_tokens, totals = backward_micro_batches(model, micro_batches, local_count=local, micro_loss=micro_loss,
                                                 autocast_dtype=autocast_dtype)
    by_source = totals[2:] if token_sources else []
    return StepResult(loss=float(totals[0]) / max(step_tokens, 1), trained_tokens=step_tokens,
                      source_sums=tuple(by_source[:num_sources]),
                      source_tokens=tuple(int(n) for n in by_source[num_sources:]))


def source_tokens(rows: Any, first_ids: Sequence[int] | Any) -> Any:
    """The source of every token of ``rows`` (``PackedRows``; int64 numpy [B, L], -1 for
    padding): each segment's source (``source_index`` of its sample id in the stream's source
    table ``first_ids``) repeated over its tokens. A row's segments cover it whole, padding included."""
    per_segment = source_index(rows.sample_ids, first_ids)
    return np.repeat(per_segment, rows.seq_lens).reshape(rows.num_rows, rows.seq_len)


def backward_micro_batches(model: Any, micro_batches: Sequence[dict], *, local_count: int,
                           micro_loss: Callable[[dict], tuple[Any, Any]], autocast_dtype: Any = None) -> tuple[int, Any]:
    """The micro-batch loop of every objective (SFT here, DPO in trainer/objective/dpo.py): (what the
    step holds over every rank of what ``local_count`` counts on this one, the sums of the
    micro-batches' figures over every rank, float64).

    ``micro_loss(inputs)`` -> (the micro-batch's loss sum, a 1-D tensor of figures to report);
    each loss sum backpropagates times ``world_size / step count`` (``step_count_and_scale``),
    under the micro-batch's sync and autocast contexts (``micro_batch_contexts``). Every rank
    must pass the same number of micro-batches. Cost: one all_reduce of a scalar before the
    first backward, one of the figures after the last.
    """
    import torch.distributed as dist

    if not micro_batches:
        raise ValueError("a step needs at least one micro-batch")
    device = micro_batches[0]["input_ids"].device
    count, scale = step_count_and_scale(local_count, device)
    totals = None
    last = len(micro_batches) - 1
    for i, inputs in enumerate(micro_batches):
        sync, autocast = micro_batch_contexts(model, last=i == last, device=device, autocast_dtype=autocast_dtype)
        with sync:
            with autocast:
                loss_sum, figures = micro_loss(inputs)
            (loss_sum * scale).backward()
        figures = figures.detach().double()
        totals = figures if totals is None else totals + figures
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals)
    return count, totals.tolist()


def step_count_and_scale(local_count: int, device: Any) -> tuple[int, float]:
    """(what a step holds over every rank: trained tokens, pairs; the scale of each micro-batch's
    loss sum). One all_reduce BEFORE any backward: a micro-batch backpropagates ``sum * world_size
    / count``, and DDP's mean of the ranks' gradients is the gradient of the step's mean."""
    import torch
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    total = torch.tensor([float(local_count)], dtype=torch.float64, device=device)
    if distributed:
        dist.all_reduce(total)
    count = int(total.item())
    return count, (dist.get_world_size() if distributed else 1) / max(count, 1)


def micro_batch_contexts(model: Any, *, last: bool, device: Any, autocast_dtype: Any) -> tuple[Any, Any]:
    """(gradient sync, autocast) for one micro-batch: DDP syncs gradients on the step's last
    micro-batch only; autocast to ``autocast_dtype`` when one is given."""
    import torch

    sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
    autocast = (torch.autocast(device_type=device.type, dtype=autocast_dtype) if autocast_dtype is not None
                else contextlib.nullcontext())
    return sync, autocast


def optimizer_step(model: Any, optimizer: Any, scheduler: Any, *, grad_clip: float) -> tuple[float, float]:
    """Clip, step, advance the schedule, zero the gradients. Returns (grad norm, lr used)."""
    import torch

    lr = float(optimizer.param_groups[0]["lr"])
    # max_norm inf measures without clipping; a sharded model's norm is a DTensor over every rank's shards
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, lr


def train_step(
    model: Any, optimizer: Any, scheduler: Any, micro_batches: Sequence[dict], *,
    grad_clip: float, autocast_dtype: Any = None, accumulate: Callable[..., StepResult] = accumulate_gradients,
) -> StepResult:
    """``accumulate`` (the objective's forwards and backwards: the SFT token mean by default,
    ``trainer/objective/dpo.py``'s pair mean for DPO) then ``optimizer_step``. A step with no trained token
    anywhere (possible only at the very end of the data) leaves the weights and the schedule alone."""
    result = accumulate(model, micro_batches, autocast_dtype=autocast_dtype)
    if result.trained_tokens == 0:
        optimizer.zero_grad(set_to_none=True)
        return result
    norm, lr = optimizer_step(model, optimizer, scheduler, grad_clip=grad_clip)
    return replace(result, grad_norm=norm, lr=lr)
