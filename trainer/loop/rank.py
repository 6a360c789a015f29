"""The training loop every rank runs (``train_rank``), under Ray Train
(``train_loop_per_worker``) or torchrun (trainer/launch/torchrun.py): what differs is the
``Runtime`` (trainer/launch/ray_runtime.py) that gives the rank its rows and keeps its checkpoints.

The model is built and laid out first (trainer/model/parallelize.py: activation checkpointing, then
FSDP2 or DDP), then loaded from the runtime's checkpoint when it has one (a restarted worker
group, ``--resume``). Each step: this rank's micro-batches of the step (the next step is
already requested, so rows are read while the model computes; padding rows fill the last
step), ``to_model_inputs`` on the device, ``train_step`` (token mean over the whole step; with
``[train] objective = "dpo"``, ``dpo_micro_batch`` and the pair mean against a frozen reference
model, trainer/objective/dpo.py), the loss through the chunked head (trainer/objective/loss_head.py).
Every ``log_every`` steps every rank gives its figures and rank 0 writes a metrics record
(progress line + metrics.jsonl, with each rank's memory); every ``checkpoint_every`` steps and
at the last step every rank checkpoints (``_checkpoint``). At the end rank 0 saves the model
(a sharded one gathered first, one tensor at a time) into ``<output>/.final.partial``, which
the driver completes with the tokenizer and publishes as ``final/`` (run_dir.py).

When the run is stopped (SIGTERM, SIGINT), every rank gets ``STOP`` for the same step: each
checkpoints the steps it completed (unless that step was just checkpointed) and returns
without a final model.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from packfeed.client.model_inputs import to_model_inputs
from packfeed.client.rows import PAD_SAMPLE_ID
from packfeed.service.face import STOP, adopt_faults, fault_point
from packfeed.trainer.state.checkpoint import full_state_dict, load_checkpoint, save_checkpoint
from packfeed.trainer.run_config import INITIAL_REFERENCE, ModelConfig, RunConfig
from packfeed.trainer.objective.dpo import accumulate_dpo_gradients, check_pairs_trained, dpo_micro_batch, dpo_objective
from packfeed.trainer.loop.mixture_hook import MixtureStep, call_hook, load_hook
from packfeed.trainer.loop.evaluate import evaluate, load_eval_set, sft_objective
from packfeed.trainer.loop.interval import (
    MetricsWindow,
    append_jsonl,
    keep_records_until,
    peak_flops,
    per_source,
    progress_line,
)
from packfeed.trainer.loop.interval import read_jsonl, summarize
from packfeed.trainer.loop.trackers import Trackers, open_trackers
from packfeed.trainer.model.builder import build_model, flops_per_token, load_shards_from_rank0
from packfeed.trainer.model.lora import LoraSettings, adapter_names, apply_lora, write_final_extras
from packfeed.trainer.loop.optim import build_optimizer
from packfeed.trainer.model.parallelize import (
    apply_activation_checkpointing,
    apply_fsdp,
    apply_sharding,
    is_sharded,
    memory_figures,
    unwrapped,
)
from packfeed.trainer.state.run_dir import RunDir, save_final_model
from packfeed.trainer.launch.ray_runtime import RayRuntime, Runtime
from packfeed.trainer.state.train_state import TrainState
from packfeed.trainer.objective.step import accumulate_gradients, source_tokens, train_step

logger = logging.getLogger(__name__)

MEMORY_KEYS = ("peak_bytes", "param_bytes", "grad_bytes", "optimizer_bytes")  # parallelize.memory_figures


def train_loop_per_worker(config: dict) -> None:
    """Ray Train's entry on every rank. ``config``: {"run": RunConfig.to_dict(), "feeder":
    actor handle, "output": str, "resume_from": checkpoint dir or None, "pad_id": int,
    "vocab_size": int, "faults": the driver's fault injection settings}."""
    adopt_faults(config.get("faults"))
    runtime = RayRuntime(config["feeder"], resume_from=config.get("resume_from"))
    _quiet_ray_train_logs()
    run = RunConfig.from_dict(config["run"])
    train_rank(run, runtime, output=config["output"], vocab_size=config["vocab_size"], pad_id=config["pad_id"])


@dataclasses.dataclass
class _Trainee:
    """One rank's model and what trains it: ``model`` as built (what checkpoints save),
    ``trained`` what the step runs (DDP-wrapped under ddp), the optimizer and schedule, the
    objective's ``to_inputs`` and ``accumulate`` (trainer/objective/), the autocast dtype; DPO's
    ``reference`` (the frozen model, None: none or the LoRA base), for ``[eval]``."""

    model: Any
    trained: Any
    optimizer: Any
    scheduler: Any
    to_inputs: Callable[..., Any]
    accumulate: Callable[..., Any]
    autocast: Any
    reference: Any = None


def train_rank(run: RunConfig, runtime: Runtime, *, output: str, vocab_size: int, pad_id: int) -> None:
    """The training loop of one rank (see the module docstring), under any launcher:
    ``runtime`` (trainer/launch/ray_runtime.py) gives its rank, device, rows, checkpoints;
    ``pad_id`` fills the padding rows of the eval set's last step."""
    import torch

    rank, device = runtime.rank, runtime.device
    _quiet_rank_logs(rank)
    if device.type == "cpu":
        # Workers share the CPUs with the packing actors: one intra-op thread each.
        torch.set_num_threads(max(1, int(run.scaling.cpus_per_worker)))
    trainee, start = _set_up(run, runtime, vocab_size=vocab_size)
    if rank == 0:
        keep_records_until(RunDir(output).metrics, start)
    # [train] report_to: rank 0's trackers (loop/trackers.py), closed as failed if the loop raises
    trackers = open_trackers(run.train.report_to, output=output, start=start, config=run.to_dict()) \
        if rank == 0 else Trackers()
    with trackers:
        step, stopped = _train_steps(run, runtime, trainee, start=start, output=output, pad_id=pad_id, trackers=trackers)
    if not stopped:
        _save_final(run, trainee, output=output, step=step, rank=rank, vocab_size=vocab_size)
    if rank == 0 and run.train.report_to:  # the final model's path (the launcher publishes it next); a stop: none
        trackers.finish(None if stopped else RunDir(output).final, summarize(read_jsonl(RunDir(output).metrics)))


def _save_final(run: RunConfig, trainee: _Trainee, *, output: str, step: int, rank: int, vocab_size: int) -> None:
    """The model after the last step, saved aside by rank 0 (every rank takes part in gathering
    a sharded one); with ``[lora]`` the adapter as peft saves it, a tiny model's base and, with
    ``merge``, the merged model beside it (trainer/model/lora.py)."""
    whole = full_state_dict(trainee.model)  # a sharded model's: gathered on rank 0 (every rank takes part)
    if rank != 0:
        return
    extras = None
    if run.lora is not None:  # a tiny model's base, the merged model: beside the adapter
        extras = functools.partial(write_final_extras, lora=run.lora, state_dict=whole, tiny=run.model.is_tiny,
                                   build_base=lambda: build_model(run.model, vocab_size=vocab_size,
                                                                  seed=run.train.seed))
    with adapter_names(trainee.model):
        save_final_model(trainee.model, output, step, state_dict=whole if is_sharded(trainee.model) else None,
                         extras=extras)


def _set_up(run: RunConfig, runtime: Runtime, *, vocab_size: int) -> tuple[_Trainee, int]:
    """(the rank's model laid out, its optimizer and objective, restored from the runtime's
    checkpoint when it has one; the step it starts at)."""
    train, device = run.train, runtime.device
    model, reference = _build_models(run, vocab_size=vocab_size, device=device, rank=runtime.rank)
    to_inputs, accumulate = to_model_inputs, accumulate_gradients
    if train.objective == "dpo":
        to_inputs = dpo_micro_batch
        accumulate = functools.partial(accumulate_dpo_gradients, reference=reference, loss=train.dpo_loss)
    accumulate = functools.partial(accumulate, chunk_tokens=train.loss_chunk_tokens)
    optimizer, scheduler = build_optimizer(model, train)
    step = 0
    with runtime.restore() as directory:
        if directory is not None:
            record = load_checkpoint(directory, model=model, optimizer=optimizer, scheduler=scheduler)
            step = TrainState.from_dict(record).step
    ddp = train.sharding == "ddp"
    trained = apply_sharding(model, "ddp", device=device) if ddp else model
    autocast = _autocast_dtype(train.precision, device) if ddp else None
    return _Trainee(model, trained, optimizer, scheduler, to_inputs, accumulate, autocast, reference), step


def _train_steps(run: RunConfig, runtime: Runtime, trainee: _Trainee, *, start: int, output: str,
                 pad_id: int, trackers: Trackers) -> tuple[int, bool]:
    """Train from step ``start`` to the last step, the stream's end or the stop: (the steps
    completed, whether the run was stopped). Checkpoints where the loop ended when that step has
    none yet."""
    train, rank = run.train, runtime.rank
    hook = load_hook(train.mixture_hook)
    sources = runtime.sources()
    table = _source_table(runtime, sources)
    log = _interval_logger(run, runtime, trainee, output=output, trackers=trackers, sources=[n for n, _ in table])
    evaluate_at = _evaluator(run, runtime, trainee, pad_id=pad_id)
    step, last, reported, stopped = start, train.last_step, -1, False
    if step < last:
        runtime.request_rows(step)
    window, lr = MetricsWindow(), float(trainee.optimizer.param_groups[0]["lr"])
    while step < last:
        wait_start = time.perf_counter()
        rows = runtime.rows(step)
        wait = time.perf_counter() - wait_start
        if rows is None or rows == STOP:
            # The stream ended, or the run stops: every rank sees it at the same step.
            stopped = rows == STOP
            evaluated = evaluate_at(step, ended=True) if not stopped and step > start else None
            if window.steps or evaluated:
                log(window, step=step, lr=lr, evaluated=evaluated)
            if rank == 0 and not stopped:
                logger.warning("stopped_early: data exhausted at step %d of %d", step, last)
            break
        if step + 1 < last:
            runtime.request_rows(step + 1)
        lr = float(trainee.optimizer.param_groups[0]["lr"])
        result, micro = _step(run, runtime, trainee, rows, table)
        step += 1
        if train.objective == "dpo":
            check_pairs_trained(result, rows, step)
        if hook is not None:  # every rank: the step's change is made once
            call_hook(hook, runtime, MixtureStep(
                step=step, rank=rank, world_size=runtime.world_size, loss=result.loss, rows=rows, inputs=micro,
                model=trainee.model, sources=tuple(name for name, _ in sources),
                first_ids=tuple(first for _, first in sources),
                source_loss=per_source([n for n, _ in table], result.source_sums, result.source_tokens)["source_loss"]))
        window.add(loss=result.loss, real_tokens=sum(r.num_real_tokens for r in rows),
                   slots=sum(r.num_rows for r in rows) * run.data.seq_len, data_wait=wait, pairs=result.pairs,
                   rewards=result.rewards, grad_norm=result.grad_norm, source_sums=result.source_sums,
                   source_tokens=result.source_tokens)
        if train.record_rows:
            _record_rows(output, rank=rank, step=step, loss=result.loss, rows=rows)
        evaluated = evaluate_at(step)
        if step % train.log_every == 0 or step == last or evaluated:
            log(window, step=step, lr=lr, evaluated=evaluated)
            window = MetricsWindow()
        if step == last or (train.checkpoint_every and step % train.checkpoint_every == 0):
            _checkpoint(trainee, runtime, step=step, run=run, loss=result.loss)
            reported = step
        fault_point("train-step", step, rank=rank)
    if step > start and reported != step:
        # The stream ended or the run was stopped before the last step: checkpoint where it stopped.
        _checkpoint(trainee, runtime, step=step, run=run, loss=float("nan"))
    return step, stopped


def _step(run: RunConfig, runtime: Runtime, trainee: _Trainee, rows: list, sources: list[tuple[str, int]]) -> tuple:
    """One optimizer step on this rank's ``rows``: (its ``StepResult``, the micro-batches' model
    inputs). Under objective "sft" with a source table (``sources``), the result holds the
    step's loss per source: every token attributed to the source of its sample."""
    import torch

    train = run.train
    micro = [trainee.to_inputs(r, device=runtime.device) for r in rows]
    accumulate = trainee.accumulate
    if sources and train.objective == "sft":
        first_ids = [first for _, first in sources]
        accumulate = functools.partial(accumulate, num_sources=len(sources), token_sources=[
            torch.from_numpy(source_tokens(r, first_ids)) for r in rows])
    result = train_step(trainee.trained, trainee.optimizer, trainee.scheduler, micro, grad_clip=train.grad_clip,
                        autocast_dtype=trainee.autocast, accumulate=accumulate)
    return result, micro


def _source_table(runtime: Runtime, sources: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The stream's ``sources`` (name, first global sample id), or [] when their first ids are
    not a source table (a packed directory from before source tables: every first id 0); the
    loss is then not split by source."""
    firsts = [first for _, first in sources]
    if sources and (firsts[0] != 0 or any(b <= a for a, b in zip(firsts, firsts[1:]))):
        if runtime.rank == 0:
            logger.warning("the stream reports no source table (first sample ids %s): no loss per source", firsts)
        return []
    return sources


def _evaluator(run: RunConfig, runtime: Runtime, trainee: _Trainee, *, pad_id: int) -> Callable[..., dict | None]:
    """``evaluate_at(step, ended=False)``: the eval record of the model after ``step`` when
    ``[eval]`` says to evaluate there (or ``ended``: the stream ended, the model is final), else
    None; every rank calls it after every step (a collective when it evaluates). The eval rows
    are read once, here."""
    if run.eval is None:
        return lambda step, ended=False: None
    eval_set = load_eval_set(run.eval, seq_len=run.data.seq_len, rank=runtime.rank, world_size=runtime.world_size,
                             micro_rows=run.train.micro_batch_rows, pad_id=pad_id, capacity=run.feeder_buffer_rows)
    chunk = run.train.loss_chunk_tokens
    objective = (dpo_objective(trainee.model, reference=trainee.reference, loss=run.train.dpo_loss, chunk_tokens=chunk)
                 if run.train.objective == "dpo" else
                 sft_objective(trainee.model, chunk_tokens=chunk, first_ids=[first for _, first in eval_set.sources]))
    done: set[int] = set()

    def evaluate_at(step: int, ended: bool = False) -> dict | None:
        if step in done or not (ended or run.eval.due(step, run.train.last_step)):
            return None
        done.add(step)
        return evaluate(trainee.model, eval_set, objective, device=runtime.device, autocast_dtype=trainee.autocast)

    return evaluate_at


def _record_rows(output: str, *, rank: int, step: int, loss: float, rows: list) -> None:
    """``[train] record_rows``: the step's row indices and sample ids of this rank, for tests
    and audits (``rows/rank<k>.jsonl``)."""
    append_jsonl(RunDir(output).rows(rank), {
        "step": step, "rank": rank, "loss": loss, "pid": os.getpid(),
        "row_index": [int(i) for r in rows for i in r.row_index],
        "sample_ids": [int(s) for r in rows for s in r.sample_ids if s != PAD_SAMPLE_ID],
    })


def _interval_logger(run: RunConfig, runtime: Runtime, trainee: _Trainee, *, output: str,
                     trackers: Trackers, sources: list[str]) -> Callable[..., None]:
    """``log(window, step=, lr=)``: close a metrics interval with this rank's memory figures
    (``_log``), its throughput against the model's FLOPs per token and the GPUs' peak, the loss
    of each of ``sources`` (the source table's names); rank 0's ``trackers`` get each record."""
    import torch

    device = runtime.device
    peak = peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    flops = flops_per_token(trainee.model, run.data.seq_len)

    def log(window: MetricsWindow, *, step: int, lr: float, evaluated: dict | None = None) -> None:
        _log(window, step=step, lr=lr, rank=runtime.rank, output=output, max_steps=run.train.max_steps,
             device=device, flops_per_token=flops, peak_total=peak * runtime.world_size if peak else None,
             memory=memory_figures(trainee.model, trainee.optimizer, device), sources=sources,
             evaluated=evaluated, trackers=trackers)

    return log


def _build_models(run: RunConfig, *, vocab_size: int, device: Any, rank: int) -> tuple[Any, Any]:
    """(the model to train, laid out by ``[train] sharding`` and ``activation_checkpointing``
    (trainer/model/parallelize.py); the frozen DPO reference, sharded the same way, or None). Under
    fsdp a pretrained model is read by rank 0 alone and every other rank receives its shards
    (``load_shards_from_rank0``); a tiny model is built whole on every rank, from the same seed.
    With ``[lora]`` the model is a peft model (trainer/model/lora.py ``apply_lora``) and DPO's
    "initial" reference is None: the policy with its adapter disabled (trainer/objective/dpo.py).
    Under ddp the model stays unwrapped here: a checkpoint loads into it first."""
    import torch

    train = run.train
    fsdp = train.sharding == "fsdp"
    param_dtype = _autocast_dtype(train.precision, device) if fsdp else None

    def build(config: Any, *, checkpointing: str, lora: LoraSettings | None = None) -> Any:
        streams = fsdp and not config.is_tiny  # rank 0 reads, the others receive shards
        model = build_model(config, vocab_size=vocab_size, device=device, seed=train.seed, empty=streams)
        whole = None
        if streams:
            whole = build_model(config, vocab_size=vocab_size, device="cpu", seed=train.seed) if rank == 0 else None
        if lora is not None:  # before checkpointing and sharding wrap the layers; the same adapter on every rank
            model = apply_lora(model, lora, seed=train.seed, frozen_dtype=_autocast_dtype(train.precision, device))
            if whole is not None:
                whole = apply_lora(whole, lora, seed=train.seed)
        apply_activation_checkpointing(model, checkpointing)
        if fsdp:
            apply_fsdp(model, param_dtype=param_dtype)
        if streams:
            load_shards_from_rank0(model, whole, device=device)
            del whole
        return model

    model = build(run.model, checkpointing=train.activation_checkpointing, lora=run.lora)
    reference = None
    initial = train.dpo_reference == INITIAL_REFERENCE
    if train.objective == "dpo" and initial and run.lora is not None:
        logger.info("DPO reference: %s with its LoRA adapter disabled (no second model)", run.model.name)
    elif train.objective == "dpo":  # built before a checkpoint loads into the policy: its initial weights
        reference = build(run.model if initial else ModelConfig(name=train.dpo_reference, attn=run.model.attn),
                          checkpointing="off")
        reference.eval()
        reference.requires_grad_(False)
        logger.info("DPO reference (frozen): %s", f"the initial weights of {run.model.name}" if initial
                    else train.dpo_reference)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return model, reference


def _log(window: MetricsWindow, *, step: int, lr: float, rank: int, output: str, max_steps: int, device: Any,
         flops_per_token: float, peak_total: float | None, memory: dict[str, int], sources: list[str],
         evaluated: dict | None, trackers: Trackers) -> None:
    """Close a metrics interval on every rank (one all_reduce, one all_gather of this rank's
    ``memory`` figures); rank 0 writes and prints it, with the eval record of the step when it
    was evaluated (``evaluated``), and gives it to its ``trackers``. A step evaluated after an
    interval just closed (the stream ended right after a record) gets a record of its
    evaluation alone."""
    import torch
    import torch.distributed as dist

    totals = torch.tensor([window.real_tokens, window.slots], dtype=torch.float64, device=device)
    mine = torch.tensor([memory[key] for key in MEMORY_KEYS], dtype=torch.int64, device=device)
    ranks = [mine]
    if dist.is_initialized():
        dist.all_reduce(totals)
        ranks = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(ranks, mine)
    record = window.close(step=step, lr=lr, world_totals=(int(totals[0]), int(totals[1])),
                          flops_per_token=flops_per_token, peak_flops_total=peak_total, sources=sources)
    record["memory"] = {"ranks": [dict(zip(MEMORY_KEYS, (int(x) for x in r.tolist()))) for r in ranks]}
    if not window.steps:
        record = {"step": step, "time": record["time"]}
    if evaluated is not None:
        record["eval"] = evaluated
    if rank == 0:
        append_jsonl(RunDir(output).metrics, record)
        trackers.log(record)
        logger.info(progress_line(record, max_steps))


def _checkpoint(trainee: _Trainee, runtime: Runtime, *, step: int, run: RunConfig, loss: float) -> None:
    """A checkpoint of ``step``, on every rank (a collective): rank 0 writes the whole model or
    its shards, the scheduler and the trainer state (with the stream state after the step);
    under fsdp every other rank its own shards; then each reports what it wrote."""
    metrics = {"step": step, "loss": loss}
    model = trainee.model
    if runtime.rank != 0 and not is_sharded(model):
        runtime.report(step, metrics, None)
        return
    state = None
    if runtime.rank == 0:
        stream = runtime.stream_state(step)  # {"stream": the StreamState record, "manifest": ...}
        state = TrainState(step=step, stream=stream["stream"], manifest=stream["manifest"], config=run.to_dict())
    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(Path(tmp), model=unwrapped(model), optimizer=trainee.optimizer, scheduler=trainee.scheduler,
                        state=None if state is None else state.to_dict())
        runtime.report(step, metrics, Path(tmp))


def _quiet_rank_logs(rank: int) -> None:
    """transformers' save progress bars say nothing to a packfeed user, and the model and
    attention lines are the same on every rank: rank 0 says them."""
    from transformers.utils import logging as hf_logging

    if rank != 0:
        for name in ("packfeed.trainer.model.builder", "packfeed.trainer.model.attention", "packfeed.trainer.objective.dpo",
                     "packfeed.trainer.model.memory_plan", "packfeed.trainer.model.lora"):
            logging.getLogger(name).setLevel(logging.WARNING)
    hf_logging.disable_progress_bar()


def _quiet_ray_train_logs() -> None:
    """Ray Train's per-step INFO lines (moving the model, wrapping it, every report): warnings only."""
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    try:  # the per-report line's logger is named after its file, outside "ray.train"
        from ray.train.v2._internal.execution import context as train_context

        train_context.logger.setLevel(logging.WARNING)
    except (ImportError, AttributeError):
        pass  # moved in another Ray: the lines stay, nothing breaks


def _autocast_dtype(precision: str, device: Any) -> Any:
    import torch

    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        if device.type != "cuda":
            raise ValueError("precision bf16 is for GPUs; on CPU use fp32 (or auto)")
        return torch.bfloat16
    return None
