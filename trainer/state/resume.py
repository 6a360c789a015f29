"""What ``packfeed train`` checks and prepares before Ray starts: the output, and what a run may
continue from.

* ``prepare_output``: whether ``--output`` holds a run, and what ``--resume`` / ``--overwrite``
  make of it (the checkpoint to resume from; a function that clears the previous run, called
  only once every other check has passed);
* ``read_train_state``: a checkpoint's ``TrainState`` (trainer/state/train_state.py);
* ``check_resume``: a checkpoint continues this run only on the same stream, model, ``[lora]`` and objective;
* ``finished``: a checkpoint with nothing left to train, and ``saved_summary``, what such a
  run wrote;
* ``check_packed_dir``: a packed directory trains this run only if its rows fit it.

Each is a ValueError a user can act on, raised before Ray starts (not in the feeder or every
worker). Cost: a listing of the output and a read of one small JSON file each (on an object
store, a few requests); finding the latest checkpoint reads Ray Train's run snapshot
(checkpoint.py ``latest_checkpoint``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from packfeed.service.face import display, join, read_text
from packfeed.trainer.state.checkpoint import STATE_FILE, latest_checkpoint, read_state
from packfeed.trainer.run_config import RunConfig
from packfeed.trainer.state.run_dir import RunDir
from packfeed.trainer.state.train_state import TrainState


def prepare_output(output: str | Path, *, resume: bool | str,
                   overwrite: bool) -> tuple[str | Path | None, Callable[[], None] | None]:
    """(the checkpoint to resume from or None, a function that clears the previous run or None).
    The caller clears only once every other check has passed: a mistake never costs a run.
    ``resume="auto"`` resumes when there is a checkpoint, and otherwise starts afresh (clearing
    what an attempt that died before its first checkpoint left)."""
    run = RunDir(output)
    has_run = run.holds_a_run()
    found = latest_checkpoint(output) if resume else None
    if resume == "auto":
        if found is not None:
            return found, None
        overwrite = True
    elif resume:
        if found is None:
            fix = "pass --overwrite (or --resume auto) to start it again" if has_run else "run without --resume first"
            raise ValueError(f"--resume: no checkpoint under {display(run.file(RunDir.RAY))}; {fix}")
        return found, None
    if not has_run:
        return None, None
    if not overwrite:
        raise ValueError(f"{display(str(output))} already holds a training run: pass --resume to continue it "
                         "or --overwrite")
    return None, run.clear_run


def read_train_state(checkpoint: str | Path) -> TrainState:
    """The trainer state of the checkpoint directory ``checkpoint`` (a path or a URI);
    ValueError saying which file is damaged and which field, and what to do."""
    record = read_state(checkpoint)
    try:
        return TrainState.from_dict(record)
    except ValueError as exc:
        where = display(join(os.fspath(checkpoint), STATE_FILE))
        raise ValueError(f"{where} is damaged ({exc}): resume from another checkpoint or pass --overwrite") from None


def finished(state: TrainState, run: RunConfig) -> tuple[str, str] | None:
    """(why, what would train on) when the run whose latest checkpoint holds ``state`` has nothing
    left to train: the checkpoint is at the run's last step, or its stream cursor at the stream's
    end; else None."""
    step, last = state.step, run.train.last_step
    if step >= last:
        knob = "--max-steps" if last == run.train.max_steps else "--stop-at-step"
        return f"it trained step {step} of {last}", f"raise {knob} to train on, or pass --overwrite to start again"
    total = state.total_rows
    if total is not None and state.cursor >= total:
        return f"its data ran out at step {step} ({total:,} rows)", "pass --overwrite to start again"
    return None


def saved_summary(output: str | Path, state: TrainState) -> dict[str, Any]:
    """The summary a finished run wrote (``{"steps": ...}`` of its checkpoint when it has none)."""
    text = read_text(RunDir(output).summary)
    return json.loads(text) if text is not None else {"steps": state.step}


def check_resume(state: TrainState, run: RunConfig, *, packed: dict | None, plan: Any) -> None:
    """A checkpoint continues this run only on the same stream, model and objective; ValueError
    saying what differs. ``packed``: the packed directory's info the run trains on, or None;
    ``plan``: the run's StreamPlan (its inputs' fingerprint), or None."""
    expected = packed["config"]["config_hash"] if packed is not None else run.data.config_hash()
    state.stream_state.check_matches(expected, run.data.seq_len, fix="start a new run (--overwrite)")
    key = state.manifest_key
    if plan is not None and key and key.startswith(f"{expected}-") and key != f"{expected}-{plan.fingerprint()}":
        raise ValueError("the input files changed since the checkpoint (same data config, other files, sizes or "
                         "rows): its cursor would point into another stream; restore the inputs or start a new run")
    saved = state.model_config
    now = run.to_dict()["model"]
    for field in ("name", "overrides"):
        if saved is not None and saved.get(field) != now.get(field):
            raise ValueError(f"the checkpoint holds model {field} {saved.get(field)!r}, this run's is {now.get(field)!r}: "
                             "resume with the same model, or start a new run (--overwrite)")
    lora = (state.config or {}).get("lora")
    if state.config is not None and lora != run.to_dict().get("lora"):
        raise ValueError(f"the checkpoint trained [lora] {lora}, this run's is {run.to_dict().get('lora')}: resume with "
                         "the same [lora] table (its checkpoints hold the adapter alone), or start a new run (--overwrite)")
    objective = state.objective
    if objective is not None and objective != run.train.objective:
        raise ValueError(f"the checkpoint trained objective {objective!r}, this run's is "
                         f"{run.train.objective!r}: resume with the same objective, or start a new run (--overwrite; "
                         "DPO after SFT: a new run whose [model] name is the SFT run's final/ directory)")


def check_packed_dir(path: str, info: dict, seq_len: int, tokenizer: Any) -> None:
    """A packed directory trains this run only if its rows fit the run's seq_len and model
    vocabulary; ValueError saying which differs."""
    packed_len = int(info["config"]["data"]["seq_len"])
    if packed_len != seq_len:
        raise ValueError(f"{path} holds rows of {packed_len} tokens, the run's seq_len is {seq_len}: set seq_len = "
                         f"{packed_len} or pack again")
    tok = info["config"].get("tokenizer", {})
    if tok and (tok.get("vocab_size"), tok.get("pad_id")) != (tokenizer.vocab_size, tokenizer.pad_id):
        raise ValueError(f"{path} was packed with tokenizer {tok.get('name')!r} (vocabulary {tok.get('vocab_size')}, pad "
                         f"{tok.get('pad_id')}), the run uses {tokenizer.name!r} ({tokenizer.vocab_size}, pad "
                         f"{tokenizer.pad_id}): use the same tokenizer")
