"""The end of a run, written once for both launchers: ``summary.json``, the loss curve, ``final/``.

After the ranks' loop the launcher (Ray's driver, torchrun's rank 0) knows how the run ended
(``RunEnd``) and ``finish_run`` writes what is true of it:

* the ranks stopped on a signal before the end: the summary marked ``stopped`` (the signal, the
  step, the checkpoint to resume from), no ``final/``, the line that says how to continue;
* otherwise: ``final/`` published with the tokenizer (state/run_dir.py ``publish_final``), the
  summary's ``final_step`` and ``final_model``; ``stopped_early`` when the data ran out before the
  last step; ``failed`` when the windows this run packed skipped more than the run allows (the
  model trained, on what the user ruled out: the launcher raises it after the summary).

Both launchers write the same keys: the summary of the metrics (loop/interval.py ``summarize``),
``wall_seconds``, ``launcher``, ``packing``, ``stream_rows``, ``reader_restarts`` and the outcome.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from packfeed.service.face import display, run_failure, write_json
from packfeed.trainer.loop.interval import format_summary, plot_loss, read_jsonl, summarize
from packfeed.trainer.run_config import RunConfig
from packfeed.trainer.state.checkpoint import latest_checkpoint
from packfeed.trainer.state.resume import read_train_state
from packfeed.trainer.state.run_dir import RunDir, publish_final

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RunEnd:
    """How the ranks' loop ended, as the launcher saw it. ``started``: ``time.perf_counter()``
    as training started; ``packing``: the summary's packing figures (loop/interval.py
    ``packing_figures``) or None; ``reader``: the RunStats of the windows this run's reader
    packed (empty: it packed none); ``stream_rows``: rows of the whole stream when the reader
    reached its end, else None; ``reader_restarts``: jumps back to rows the feeder no longer
    held; ``stopped_by``: the signal that stopped the ranks before the end, else None."""

    launcher: str  # "ray" or "torchrun"
    started: float
    packing: dict[str, Any] | None = None
    reader: dict[str, Any] = dataclasses.field(default_factory=dict)
    stream_rows: int | None = None
    reader_restarts: int = 0
    stopped_by: str | None = None


def finish_run(run: RunConfig, output: str | Path, tokenizer: Any, end: RunEnd) -> dict[str, Any]:
    """Write and print the run's summary (see the module docstring) and return it; publishes
    ``final/`` unless the ranks stopped before the end."""
    files = RunDir(output)
    records = read_jsonl(files.metrics)
    summary = summarize(records)
    summary["wall_seconds"] = time.perf_counter() - end.started
    summary["launcher"] = end.launcher
    summary["packing"] = end.packing
    summary["stream_rows"] = end.stream_rows
    summary["reader_restarts"] = end.reader_restarts
    if end.stopped_by is not None:
        summary["stopped"] = _stopped(output, end.stopped_by)
    else:
        summary.update(_published(run, output, tokenizer, end.stream_rows))
        failure = run_failure(end.reader, run.data.max_skip_fraction) if end.reader.get("samples_read") else None
        if failure is not None:
            summary["failed"] = failure
    if records:
        plot_loss(records, files.plot)
    write_json(files.summary, summary)
    print(format_summary(summary), flush=True)
    if end.stopped_by is not None:
        stopped = summary["stopped"]
        launcher = " --launcher torchrun" if end.launcher == "torchrun" else ""
        logger.info("stopped at step %d of %d (%s): checkpoint %s; continue with `packfeed train ...%s --resume` (the "
                    "same config and --output)", stopped["step"], run.train.last_step, end.stopped_by,
                    stopped["checkpoint"], launcher)
    return summary


def _stopped(output: str | Path, signal_name: str) -> dict[str, Any]:
    """The summary's ``stopped``: the signal, the step the ranks stopped at and its checkpoint
    (the latest: every rank checkpoints the stop step when it trained one)."""
    checkpoint = latest_checkpoint(output)
    step = read_train_state(checkpoint).step if checkpoint is not None else 0
    return {"signal": signal_name, "step": step, "checkpoint": None if checkpoint is None else display(str(checkpoint))}


def _published(run: RunConfig, output: str | Path, tokenizer: Any, stream_rows: int | None) -> dict[str, Any]:
    """``final/`` made whole with the tokenizer; the summary's ``final_step``, ``stopped_early``
    (said as a warning) and ``final_model``."""
    final_step = publish_final(output, tokenizer)
    figures: dict[str, Any] = {"final_step": final_step}
    last = run.train.last_step
    if final_step < last:
        held = (f"{stream_rows:,} rows in {run.data.epochs} epoch(s)" if stream_rows is not None
                else "the server's stream ended")
        figures["stopped_early"] = (
            f"data exhausted at step {final_step} of {last} ({held}); the learning-rate schedule was planned for "
            f"{run.train.max_steps} steps: raise [data] epochs (or lower max_steps)"
        )
        print(f"WARNING stopped_early: {figures['stopped_early']}", flush=True)
    figures["final_model"] = display(RunDir(output).final)
    return figures
