"""The checks before any rank starts, written once for both launchers.

A mistake a user can fix is one line before training, not a failure in every rank. Ray's driver
(ray_driver.py) makes these checks before Ray starts (inside the plan's preflight when it packs
the data itself); torchrun's rank 0 makes them while the other ranks wait, and broadcasts the
``Prechecked`` value they return (torchrun.py).

* ``open_output``: what ``--output`` holds and what ``--resume`` / ``--overwrite`` make of it
  (``Opened``: the checkpoint to resume from, its trainer state, the function that clears a
  previous run once every check has passed), the tokenizer, the mixture hook's import;
* ``check_run``: the resume against what the run trains on (a packed directory or the plan of
  its inputs; a server checks the stream state it is given itself), a finished run (nothing to
  do: its saved summary), the model and a DPO reference by name and vocabulary, the loss head's
  family, the eval set (a packed directory of the run's seq_len), the memory plan, the trackers of
  ``[train] report_to`` (installed, somewhere to write).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable

from packfeed.service.face import PackedDir, display, load_tokenizer_for
from packfeed.trainer.loop.evaluate import check_eval_set
from packfeed.trainer.loop.mixture_hook import load_hook
from packfeed.trainer.loop.optim import lr_factor
from packfeed.trainer.loop.trackers import check_trackers
from packfeed.trainer.model.builder import check_model
from packfeed.trainer.model.memory_plan import check_memory_plan
from packfeed.trainer.objective.loss_head import check_loss_head
from packfeed.trainer.run_config import INITIAL_REFERENCE, ModelConfig, RunConfig
from packfeed.trainer.state.resume import check_resume, finished, prepare_output, read_train_state, saved_summary
from packfeed.trainer.state.train_state import TrainState

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Opened:
    """What the output and the config say before the data is looked at (the driver's own:
    the tokenizer and ``clear_previous`` do not cross processes)."""

    resume_from: str | Path | None
    state: TrainState | None
    tokenizer: Any  # SampleTokenizer
    clear_previous: Callable[[], None] | None


@dataclasses.dataclass(frozen=True)
class Prechecked:
    """What every rank needs from the checks: where to resume (None: the start), the trainer
    state there, the tokenizer's vocabulary and pad id; ``done``: a finished run's saved
    summary (nothing to train), else None."""

    resume_from: str | None
    state: TrainState | None
    vocab_size: int
    pad_id: int
    done: dict[str, Any] | None = None


def open_output(run: RunConfig, output: str | Path, *, resume: bool | str, overwrite: bool) -> Opened:
    """``--output`` against ``--resume`` / ``--overwrite`` (trainer/state/resume.py), the
    checkpoint's trainer state, the tokenizer, the mixture hook's import (a hook that cannot be
    imported fails here, not in every rank)."""
    resume_from, clear_previous = prepare_output(output, resume=resume, overwrite=overwrite)
    state = read_train_state(resume_from) if resume_from is not None else None
    tokenizer = load_tokenizer_for(run.data, snapshot=False)
    load_hook(run.train.mixture_hook)
    return Opened(resume_from=resume_from, state=state, tokenizer=tokenizer, clear_previous=clear_previous)


def check_run(run: RunConfig, opened: Opened, *, output: str | Path, packed_or_plan: Any = None,
              no_memory_check: bool = False) -> Prechecked:
    """The run's checks against what it trains on: ``packed_or_plan`` a PackedDir, the
    StreamPlan of its inputs, or None (rows from a server, which checks the stream state
    itself). A resumed run that is finished says so (``Prechecked.done``: nothing to train)."""
    check_trackers(run.train.report_to, output)
    state, tokenizer = opened.state, opened.tokenizer
    checked = Prechecked(resume_from=None if opened.resume_from is None else str(opened.resume_from), state=state,
                      vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id)
    if state is not None:
        if packed_or_plan is not None:
            packed = isinstance(packed_or_plan, PackedDir)
            check_resume(state, run, packed=packed_or_plan.info if packed else None,
                         plan=None if packed else packed_or_plan)
        done = finished(state, run)
        if done is not None:
            logger.info("%s is finished, nothing to do: %s (checkpoint %s); %s", display(str(output)), done[0],
                        display(str(opened.resume_from)), done[1])
            return dataclasses.replace(checked, done=saved_summary(output, state))
        print(f"resuming from {display(str(opened.resume_from))} at step {state.step}, stream cursor "
              f"{state.cursor}", flush=True)
        for line in resume_changes(state, run):
            logger.warning(line)
    model_config = check_model(run.model, vocab_size=tokenizer.vocab_size)
    longer = context_warning(model_config, seq_len=run.data.seq_len, name=run.model.name)
    if longer:
        logger.warning(longer)
    check_loss_head(model_config, chunk_tokens=run.train.loss_chunk_tokens)
    if run.train.objective == "dpo" and run.train.dpo_reference != INITIAL_REFERENCE:
        check_model(ModelConfig(name=run.train.dpo_reference, attn=run.model.attn), vocab_size=tokenizer.vocab_size)
    if run.eval is not None:
        check_eval_set(run.eval, seq_len=run.data.seq_len)
    check_memory_plan(run, no_memory_check=no_memory_check, vocab_size=tokenizer.vocab_size)
    return checked


def resume_changes(state: TrainState, run: RunConfig) -> list[str]:
    """One line for each change a resume makes that a user may not mean, against the run the
    checkpoint was written by (its ``config``; none for a checkpoint without one): the rows of a
    step (another world size or batch: the same rows, in other steps; how to keep the global
    batch), and the learning-rate schedule (another ``max_steps`` or ``warmup_steps`` stretches
    the cosine again from the step resumed: the rate jumps there)."""
    try:
        before = RunConfig.from_dict(state.config) if state.config else None
    except (ValueError, TypeError, KeyError):  # a checkpoint of an older packfeed: check_resume says what matters
        before = None
    if before is None:
        return []
    lines = []
    rows = {name: r.scaling.num_workers * r.train.grad_accum * r.train.micro_batch_rows for name, r in
            (("before", before), ("now", run))}
    if rows["before"] != rows["now"]:
        per_rank = run.scaling.num_workers * run.train.micro_batch_rows
        keep = (f"; to keep {rows['before']}, set grad_accum = {rows['before'] // per_rank}"
                if rows["before"] % per_rank == 0 else "")
        lines.append(f"resume: {rows['now']} rows a step (num_workers x grad_accum x micro_batch_rows), the run had "
                     f"{rows['before']}: every row still comes once, in steps of another size{keep}")
    schedule = [(name, getattr(before.train, name), getattr(run.train, name)) for name in ("max_steps", "warmup_steps")]
    changed = [f"{name} {a} -> {b}" for name, a, b in schedule if a != b]
    if changed and state.step < run.train.max_steps:
        old, new = (lr_factor(state.step, warmup_steps=t.warmup_steps, max_steps=t.max_steps,
                              min_lr_ratio=t.min_lr_ratio) * t.lr for t in (before.train, run.train))
        lines.append(f"resume: {', '.join(changed)} re-stretches the learning-rate schedule: at step {state.step + 1} "
                     f"the rate is {new:.3g} (the run's schedule had {old:.3g}); keep the run's values to keep it")
    return lines


def context_warning(model_config: Any, *, seq_len: int, name: str) -> str | None:
    """One line when rows are longer than the model's context (``max_position_embeddings``):
    the positions past it were never trained, and a RoPE model without scaling degrades there.
    A warning, not an error: a config with RoPE scaling (``rope_scaling``) may mean to extend it."""
    context = getattr(model_config, "max_position_embeddings", None)
    if not isinstance(context, int) or seq_len <= context:
        return None
    scaling = getattr(model_config, "rope_scaling", None) or {}
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
    extended = f" (rope_scaling {kind!r} is set)" if kind not in (None, "default") else ""
    return (f"seq_len {seq_len:,} is longer than {name}'s context, max_position_embeddings {context:,}{extended}: "
            f"positions past {context:,} were never trained; pack at seq_len <= {context:,} or extend the context "
            "on purpose")


def training_line(run: RunConfig, *, on: str, start_step: int, output: str | Path) -> str:
    """The line both launchers print as training starts; ``on``: where the ranks run."""
    rows = run.scaling.num_workers * run.train.grad_accum * run.train.micro_batch_rows
    lora = f" with LoRA r {run.lora.r} (the adapter trains, the model is frozen)" if run.lora is not None else ""
    return (f"training {run.model.name}{lora} on {on}, {rows} rows of {run.data.seq_len} per step, "
            f"steps {start_step}->{run.train.last_step} -> {display(str(output))}")
