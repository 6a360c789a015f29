"""The driver of a training run: feeder actor + Ray Train ``TorchTrainer`` + summary.

::

    PackedStream (packing actors, CPU) -> RowFeeder actor (ordered, step plan) -> N train
    workers (TorchTrainer, DDP): get_step(rank, step) -> to_model_inputs -> train_step

``train(run, output=...)`` returns the summary dict and writes, under ``output``:
``metrics.jsonl``, ``loss.png``, ``summary.json``, Ray Train's checkpoints under ``ray/``,
and the final model under ``final/`` (``from_pretrained`` loads it, with the tokenizer).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from packfeed.trainer.batches import StepLayout
from packfeed.trainer.checkpoint import RUN_NAME, latest_checkpoint, read_state
from packfeed.trainer.config import RunConfig
from packfeed.trainer.metrics import plot_loss, read_jsonl, summarize

logger = logging.getLogger(__name__)


def train(run: RunConfig, *, output: Path, address: str | None = None, resume: bool = False,
          overwrite: bool = False) -> dict[str, Any]:
    """Train ``run``; see the module docstring for what lands in ``output``.

    Raises ValueError when ``output`` already holds a run and neither ``resume`` (continue
    from its latest checkpoint, on exactly the rows an uninterrupted run would see next) nor
    ``overwrite`` (start again) is given.
    """
    import ray
    from ray.train import CheckpointConfig, ScalingConfig
    from ray.train import RunConfig as RayRunConfig
    from ray.train.torch import TorchTrainer

    from packfeed.service.pipeline import Scaling, init_ray
    from packfeed.service.tokenize import SampleTokenizer
    from packfeed.trainer.feeder import RowFeeder
    from packfeed.trainer.worker import train_loop_per_worker

    output = Path(output).resolve()
    resume_from = _prepare_output(output, resume=resume, overwrite=overwrite)
    start_step, position = 0, None
    if resume_from is not None:
        state = read_state(resume_from)
        start_step, position = int(state["step"]), state["data_position"]
        print(f"resuming from {resume_from} at step {start_step}, data position {position}", flush=True)
    output.mkdir(parents=True, exist_ok=True)
    (output / "config.json").write_text(json.dumps(run.to_dict(), indent=1))

    print(init_ray(address, dashboard=True), flush=True)  # Ray Train needs the State API
    tokenizer = SampleTokenizer(run.data.tokenizer, loss=run.data.loss, add_eos=run.data.add_eos,
                                backend=run.data.tokenizer_backend)  # fmt: skip
    use_gpu = run.scaling.use_gpu == "yes" or (
        run.scaling.use_gpu == "auto" and ray.cluster_resources().get("GPU", 0) >= 1
    )
    layout = StepLayout(world_size=run.scaling.num_workers, grad_accum=run.train.grad_accum,
                        micro_rows=run.train.micro_batch_rows)
    feeder = ray.remote(num_cpus=0)(RowFeeder).remote(
        run.data, layout,
        packing=Scaling(num_workers=run.scaling.packing_workers, cpus_per_worker=run.scaling.packing_cpus_per_worker),
        first_step=start_step, position=position,
    )
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "run": run.to_dict(), "feeder": feeder, "output": str(output),
            "resume_from": str(resume_from) if resume_from else None,
            "pad_id": tokenizer.pad_id, "vocab_size": tokenizer.vocab_size,
        },
        scaling_config=ScalingConfig(
            num_workers=run.scaling.num_workers, use_gpu=use_gpu,
            resources_per_worker={"CPU": run.scaling.cpus_per_worker, **({"GPU": 1} if use_gpu else {})},
        ),
        run_config=RayRunConfig(
            name=RUN_NAME, storage_path=str(output),
            checkpoint_config=CheckpointConfig(num_to_keep=run.train.keep_checkpoints),
        ),
    )
    print(f"training {run.model.name} on {run.scaling.num_workers} worker(s) "
          f"({'GPU' if use_gpu else 'CPU'}), {layout.rows_per_step} rows of {run.data.seq_len} per step, "
          f"steps {start_step}->{run.train.last_step} -> {output}", flush=True)
    started = time.perf_counter()
    trainer.fit()
    packing = ray.get(feeder.packing_stats.remote())
    ray.kill(feeder)

    tokenizer.tokenizer.save_pretrained(output / "final")
    records = read_jsonl(output / "metrics.jsonl")
    summary = summarize(records)
    summary["wall_seconds"] = time.perf_counter() - started
    summary["packing"] = {k: packing.get(k) for k in ("rows", "tokens", "efficiency", "samples_packed", "windows")}
    summary["final_model"] = str(output / "final")
    if records:
        plot_loss(records, output / "loss.png")
    (output / "summary.json").write_text(json.dumps(summary, indent=1))
    print(format_summary(summary), flush=True)
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    packing = summary.get("packing") or {}
    lines = [
        ("steps", f"{summary.get('steps', 0)}"),
        ("loss first -> last", f"{summary.get('first_loss', float('nan')):.4f} -> {summary.get('last_loss', float('nan')):.4f}"),
        ("real tokens/s", f"{summary.get('tokens_per_s', 0):,.0f}"),
        ("row fill (trained rows)", f"{summary.get('mean_fill', 0):.1%}"),
        ("data wait", f"{summary.get('mean_data_wait', 0):.1%}"),
        ("packing efficiency", f"{(packing.get('efficiency') or 0):.1%} ({packing.get('rows') or 0:,} rows packed)"),
        ("wall time", f"{summary.get('wall_seconds', 0):.1f} s"),
        ("final model", summary.get("final_model", "")),
    ]
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def _prepare_output(output: Path, *, resume: bool, overwrite: bool) -> Path | None:
    """The checkpoint to resume from (None for a fresh run); clears ``output`` on overwrite."""
    has_run = (output / RUN_NAME).exists() or (output / "metrics.jsonl").exists()
    if resume:
        found = latest_checkpoint(output)
        if found is None:
            raise ValueError(f"--resume: no checkpoint under {output / RUN_NAME}; run without --resume first")
        return found
    if has_run:
        if not overwrite:
            raise ValueError(f"{output} already holds a training run: pass --resume to continue it or --overwrite")
        for name in (RUN_NAME, "final", "rows", "metrics.jsonl", "summary.json", "loss.png"):
            path = output / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    return None
