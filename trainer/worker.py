"""The per-worker training loop that Ray Train runs on every rank (``train_loop_per_worker``).

It starts from ``ray.train.get_checkpoint()`` when there is one (after a worker died and Ray
Train restarted the group: the latest checkpoint reported), else from the checkpoint of
``--resume`` (``config["resume_from"]``), else from scratch. Each step:
take this rank's micro-batches of the step from the RowFeeder (the next step is already
requested, so packing overlaps compute; padding rows already fill the last step),
``to_model_inputs`` on the device, ``train_step`` (token mean over the whole step, DDP; with
``[train] objective = "dpo"``, ``dpo_micro_batch`` and the pair mean against a frozen reference
model, trainer/dpo.py).
Every ``log_every`` steps rank 0 writes a metrics record (progress line + metrics.jsonl);
every ``checkpoint_every`` steps and at the last step every rank calls ``ray.train.report``
(rank 0 with the checkpoint). At the end rank 0 saves the model into ``<output>/.final.partial``,
which the driver completes with the tokenizer and publishes as ``final/`` (run_dir.py: on disk or
on an object store).

When the driver stops the run (SIGTERM, SIGINT), the feeder answers ``STOP`` for the same step
on every rank: each rank checkpoints the steps it completed (unless that step was just
checkpointed) and returns without a final model.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from packfeed.client.model_inputs import to_model_inputs
from packfeed.client.rows import PAD_SAMPLE_ID
from packfeed.service import faults
from packfeed.trainer.checkpoint import load_checkpoint, local_copy, save_checkpoint
from packfeed.trainer.config import RunConfig
from packfeed.trainer.dpo import accumulate_dpo_gradients, build_reference, check_pairs_trained, dpo_micro_batch
from packfeed.trainer.feeder import STOP
from packfeed.trainer.mixture_hook import MixtureStep, call_hook, load_hook
from packfeed.trainer.metrics import MetricsWindow, append_jsonl, keep_records_until, peak_flops, progress_line
from packfeed.trainer.model import build_model, flops_per_token
from packfeed.trainer.optim import build_optimizer
from packfeed.trainer.run_dir import path, save_final_model
from packfeed.trainer.step import accumulate_gradients, train_step

logger = logging.getLogger(__name__)


def train_loop_per_worker(config: dict) -> None:
    """``config``: {"run": RunConfig.to_dict(), "feeder": actor handle, "output": str,
    "resume_from": checkpoint dir or None, "pad_id": int, "vocab_size": int}."""
    import ray.train
    import ray.train.torch
    import torch

    faults.adopt(config.get("faults"))
    run = RunConfig.from_dict(config["run"])
    train, seq_len = run.train, run.data.seq_len
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    _quiet_worker_logs(rank)
    device = ray.train.torch.get_device()
    if device.type == "cpu":
        # Workers share the CPUs with the packing actors: one intra-op thread each.
        torch.set_num_threads(max(1, int(run.scaling.cpus_per_worker)))
    output = config["output"]  # a local directory or a URI
    feeder = config["feeder"]

    model = build_model(run.model, vocab_size=config["vocab_size"], device=device, seed=train.seed)
    to_inputs, accumulate = to_model_inputs, accumulate_gradients
    if train.objective == "dpo":  # the reference is built before a checkpoint loads into the policy
        reference = build_reference(run.model, train.dpo_reference, vocab_size=config["vocab_size"], device=device,
                                    seed=train.seed)
        to_inputs = dpo_micro_batch
        accumulate = functools.partial(accumulate_dpo_gradients, reference=reference, loss=train.dpo_loss)
    optimizer, scheduler = build_optimizer(model, train)
    step = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            step = int(load_checkpoint(Path(directory), model=model, optimizer=optimizer, scheduler=scheduler)["step"])
    elif config.get("resume_from"):
        with local_copy(config["resume_from"]) as directory:
            step = int(load_checkpoint(directory, model=model, optimizer=optimizer, scheduler=scheduler)["step"])
    ddp = ray.train.torch.prepare_model(model)
    autocast = _autocast_dtype(train.precision, device)
    fpt = flops_per_token(model, seq_len)
    peak = peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    peak_total = peak * world if peak else None

    last, start_step = train.last_step, step
    hook = load_hook(train.mixture_hook)
    sources = ray.get(feeder.sources.remote()) if hook is not None else []
    if rank == 0:
        keep_records_until(path(output, "metrics.jsonl"), start_step)
    pending = feeder.get_step.remote(rank, step) if step < last else None
    window = MetricsWindow()
    lr = float(optimizer.param_groups[0]["lr"])
    reported, stopped = -1, False
    while step < last:
        wait_start = time.perf_counter()
        rows = ray.get(pending)
        wait = time.perf_counter() - wait_start
        if rows is None or rows == STOP:
            # The stream ended, or the driver stops the run: every rank sees it at the same step.
            if window.steps:
                _log(window, step=step, lr=lr, rank=rank, output=output, max_steps=train.max_steps,
                     device=device, flops_per_token=fpt, peak_total=peak_total)
            stopped = rows == STOP
            if rank == 0 and not stopped:
                logger.warning("stopped_early: data exhausted at step %d of %d", step, last)
            break
        if step + 1 < last:
            pending = feeder.get_step.remote(rank, step + 1)
        micro = [to_inputs(r, device=device) for r in rows]
        lr = float(optimizer.param_groups[0]["lr"])
        result = train_step(ddp, optimizer, scheduler, micro, grad_clip=train.grad_clip, autocast_dtype=autocast,
                            accumulate=accumulate)
        step += 1
        if hook is not None:  # every rank: the step's change is made once
            call_hook(hook, feeder, MixtureStep(
                step=step, rank=rank, world_size=world, loss=result.loss, rows=rows, inputs=micro, model=model,
                sources=tuple(name for name, _ in sources), first_ids=tuple(first for _, first in sources)))
        if train.objective == "dpo":
            check_pairs_trained(result, rows, step)
        window.add(loss=result.loss, real_tokens=sum(r.num_real_tokens for r in rows),
                   slots=sum(r.num_rows for r in rows) * seq_len, data_wait=wait, pairs=result.pairs,
                   rewards=result.rewards)
        if train.record_rows:
            append_jsonl(path(output, "rows", f"rank{rank}.jsonl"), {
                "step": step, "rank": rank, "loss": result.loss, "pid": os.getpid(),
                "row_index": [int(i) for r in rows for i in r.row_index],
                "sample_ids": [int(s) for r in rows for s in r.sample_ids if s != PAD_SAMPLE_ID],
            })
        final = step == last
        if step % train.log_every == 0 or final:
            _log(window, step=step, lr=lr, rank=rank, output=output, max_steps=train.max_steps,
                 device=device, flops_per_token=fpt, peak_total=peak_total)
            window = MetricsWindow()
        if final or (train.checkpoint_every and step % train.checkpoint_every == 0):
            _report(model, optimizer, scheduler, feeder, step=step, rank=rank, run=run, loss=result.loss)
            reported = step
        faults.point("train-step", step, rank=rank)
    if step > start_step and reported != step:
        # The stream ended or the run was stopped before the last step: checkpoint where it stopped.
        _report(model, optimizer, scheduler, feeder, step=step, rank=rank, run=run, loss=float("nan"))
    if rank == 0 and not stopped:
        save_final_model(model, output, step)


def _log(window: MetricsWindow, *, step: int, lr: float, rank: int, output: str, max_steps: int, device: Any,
         flops_per_token: float, peak_total: float | None) -> None:
    """Close a metrics interval on every rank (one all_reduce); rank 0 writes and prints it."""
    import torch
    import torch.distributed as dist

    totals = torch.tensor([window.real_tokens, window.slots], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(totals)
    record = window.close(step=step, lr=lr, world_totals=(int(totals[0]), int(totals[1])),
                          flops_per_token=flops_per_token, peak_flops_total=peak_total)
    if rank == 0:
        append_jsonl(path(output, "metrics.jsonl"), record)
        logger.info(progress_line(record, max_steps))


def _report(model: Any, optimizer: Any, scheduler: Any, feeder: Any, *, step: int, rank: int, run: RunConfig,
            loss: float) -> None:
    """ray.train.report on every rank (a collective); rank 0 attaches the checkpoint."""
    import ray
    import ray.train

    metrics = {"step": step, "loss": loss}
    if rank != 0:
        ray.train.report(metrics)
        return
    state = {"step": step, **ray.get(feeder.state.remote(step)), "config": run.to_dict()}
    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(Path(tmp), model=model, optimizer=optimizer, scheduler=scheduler, state=state)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp),
                         checkpoint_dir_name=f"checkpoint_{step:06d}")


def _quiet_worker_logs(rank: int) -> None:
    """Ray Train's per-step INFO lines (moving the model, wrapping it in DDP, every report) and
    transformers' save progress bars say nothing to a packfeed user: warnings only. The model
    and attention lines are the same on every rank: rank 0 says them."""
    from transformers.utils import logging as hf_logging

    if rank != 0:
        for name in ("packfeed.trainer.model", "packfeed.trainer.attention", "packfeed.trainer.dpo"):
            logging.getLogger(name).setLevel(logging.WARNING)

    logging.getLogger("ray.train").setLevel(logging.WARNING)
    try:  # the per-report line's logger is named after its file, outside "ray.train"
        from ray.train.v2._internal.execution import context as train_context

        train_context.logger.setLevel(logging.WARNING)
    except (ImportError, AttributeError):
        pass  # moved in another Ray: the lines stay, nothing breaks
    hf_logging.disable_progress_bar()


def _autocast_dtype(precision: str, device: Any) -> Any:
    import torch

    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        if device.type != "cuda":
            raise ValueError("precision bf16 is for GPUs; on CPU use fp32 (or auto)")
        return torch.bfloat16
    return None
