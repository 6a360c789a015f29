"""The driver of a training run: feeder actor + Ray Train ``TorchTrainer`` + summary.

::

    PackingPipeline (packing actors, CPU) -> RowFeeder actor (RowHub + the serve contract) -> N
    train workers (TorchTrainer, DDP): get_step(rank, step) -> to_model_inputs -> train_step

A train worker that dies (SIGKILL, OOM) is restarted by Ray Train (``[train] max_failures``)
from the latest checkpoint; the feeder, owned by the driver, serves the restarted ranks the
same rows for the same steps.

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

from packfeed.service.stats import run_failure
from packfeed.trainer.checkpoint import MANIFEST_FILE, RUN_NAME, latest_checkpoint, read_state
from packfeed.trainer.config import RunConfig
from packfeed.trainer.feeder import RowFeeder
from packfeed.trainer.metrics import plot_loss, read_jsonl, summarize

logger = logging.getLogger(__name__)


def train(run: RunConfig, *, output: Path, address: str | None = None, resume: bool | str = False,
          overwrite: bool = False) -> dict[str, Any]:
    """Train ``run``; see the module docstring for what lands in ``output``.

    Raises ValueError when ``output`` already holds a run and neither ``resume`` (continue
    from its latest checkpoint, on exactly the rows an uninterrupted run would see next;
    ``"auto"``: if there is one, else start) nor ``overwrite`` (start again) is given. Everything that can be checked before Ray starts
    (output, plan, tokenizer) is checked first.
    """
    from packfeed.service.plan import build_plan
    from packfeed.service.raycluster import init_ray
    from packfeed.service.tokenize import load_tokenizer
    from packfeed.service.writer import packed_dir_info

    output = Path(output).resolve()
    resume_from, clear_previous = _prepare_output(output, resume=resume, overwrite=overwrite)
    state = read_state(resume_from) if resume_from is not None else None
    tokenizer = load_tokenizer(run.data.tokenizer, loss=run.data.loss, add_eos=run.data.add_eos,
                               backend=run.data.tokenizer_backend)
    inputs = run.data.inputs
    packed = packed_dir_info(inputs[0]) if len(inputs) == 1 else None
    if packed is not None:  # pack once, train many: the rows are served as they are
        check_packed_dir(inputs[0], packed, run.data.seq_len, tokenizer)
        source = ("packed", inputs[0], packed)
        print(f"training on the packed directory {inputs[0]} as it is ({packed['stats']['rows']:,} rows)", flush=True)
    else:
        source = ("pipeline", build_plan(run.data))
    if state is not None:
        check_resume(state, run, packed=packed, plan=source[1] if source[0] == "pipeline" else None)
        print(f"resuming from {resume_from} at step {state['step']}, stream cursor {state['stream']['cursor']}",
              flush=True)
    print(init_ray(address, dashboard=True), flush=True)  # Ray Train needs the State API
    return _fit(run, source, tokenizer, output=output, resume_from=resume_from, state=state,
                clear_previous=clear_previous)


def check_resume(state: dict, run: RunConfig, *, packed: dict | None, plan: Any) -> None:
    """A checkpoint continues this run only on the same stream and the same model; ValueError
    saying what differs (checked before Ray starts, not in the feeder or every worker)."""
    stream = state.get("stream", {})
    expected = packed["config"]["config_hash"] if packed is not None else run.data.config_hash()
    if stream.get("config_hash") not in (None, expected):
        raise ValueError(f"the checkpoint was trained on data config {stream['config_hash']}, this run's is {expected}: "
                         "resume with the same data config, or start a new run (--overwrite)")
    if stream.get("seq_len") not in (None, run.data.seq_len):
        raise ValueError(f"the checkpoint was trained on rows of {stream['seq_len']} tokens, this run's seq_len is "
                         f"{run.data.seq_len}")
    key = (state.get("manifest") or {}).get("key")
    if plan is not None and key and key.startswith(f"{expected}-") and key != f"{expected}-{plan.fingerprint()}":
        raise ValueError("the input files changed since the checkpoint (same data config, other files, sizes or "
                         "rows): its cursor would point into another stream; restore the inputs or start a new run")
    saved = (state.get("config") or {}).get("model")
    now = run.to_dict()["model"]
    for field in ("name", "overrides"):
        if saved is not None and saved.get(field) != now.get(field):
            raise ValueError(f"the checkpoint holds model {field} {saved.get(field)!r}, this run's is {now.get(field)!r}: "
                             "resume with the same model, or start a new run (--overwrite)")


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


def _fit(run: RunConfig, source: tuple, tokenizer: Any, *, output: Path, resume_from: Path | None,
         state: dict | None, clear_previous=None) -> dict[str, Any]:
    import ray
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, ScalingConfig
    from ray.train import RunConfig as RayRunConfig
    from ray.train.torch import TorchTrainer

    from packfeed.trainer.placement import check_placement, packing_scaling
    from packfeed.trainer.worker import train_loop_per_worker

    use_gpu = run.scaling.use_gpu == "yes" or (
        run.scaling.use_gpu == "auto" and ray.cluster_resources().get("GPU", 0) >= 1
    )
    placement = check_placement(run.scaling, use_gpu=use_gpu)
    if clear_previous is not None:  # every check passed (plan, tokenizer, Ray, placement): only now
        clear_previous()
    output.mkdir(parents=True, exist_ok=True)
    (output / "config.json").write_text(json.dumps(run.to_dict(), indent=1))
    world = run.scaling.num_workers
    feeder = ray.remote(StreamFeeder).options(
        num_cpus=0, max_concurrency=4 * world + 4, **placement.driver_options()
    ).remote(
        run.data, source, packing_scaling(run.scaling, placement), output=str(output), world_size=world,
        grad_accum=run.train.grad_accum, micro_rows=run.train.micro_batch_rows, pad_id=tokenizer.pad_id,
        state=None if state is None else state["stream"], saved_manifest=None if state is None else state.get("manifest"),
    )
    ray.get(feeder.total_rows.remote())  # a feeder that cannot start fails here, as itself, not in every worker
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "run": run.to_dict(), "feeder": feeder, "output": str(output),
            "resume_from": str(resume_from) if resume_from else None,
            "pad_id": tokenizer.pad_id, "vocab_size": tokenizer.vocab_size,
        },
        scaling_config=ScalingConfig(
            num_workers=world, use_gpu=use_gpu,
            resources_per_worker={"CPU": run.scaling.cpus_per_worker, **({"GPU": 1} if use_gpu else {}),
                                  **run.scaling.trainer_resources},
            label_selector=placement.trainer or None,
        ),
        run_config=RayRunConfig(
            name=RUN_NAME, storage_path=str(output),
            checkpoint_config=CheckpointConfig(num_to_keep=run.train.keep_checkpoints),
            failure_config=FailureConfig(max_failures=run.train.max_failures),
            # the controller's and workers' INFO lines (resources requested, worker group started,
            # process group set up) say nothing to a packfeed user; a restart still says WARNING
            logging_config=LoggingConfig(log_level="WARNING"),
        ),
    )
    start_step = 0 if state is None else int(state["step"])
    print(f"training {run.model.name} on {world} worker(s) ({'GPU' if use_gpu else 'CPU'}), "
          f"{world * run.train.grad_accum * run.train.micro_batch_rows} rows of {run.data.seq_len} per step, "
          f"steps {start_step}->{run.train.last_step} -> {output}", flush=True)
    started = time.perf_counter()
    trainer.fit()
    packing = ray.get(feeder.packing_stats.remote())
    total_rows = ray.get(feeder.total_rows.remote())
    ray.kill(feeder)

    tokenizer.tokenizer.save_pretrained(output / "final")
    records = read_jsonl(output / "metrics.jsonl")
    summary = summarize(records)
    summary["wall_seconds"] = time.perf_counter() - started
    summary["packing"] = {k: packing.get(k) for k in ("rows", "tokens", "efficiency", "samples_packed", "windows")}
    if packing.get("sources"):
        summary["packing"]["sources"] = packing["sources"]
    final_step = json.loads((output / "final" / "packfeed_state.json").read_text())["step"]
    summary["final_step"] = final_step
    summary["stream_rows"] = total_rows  # rows of the whole stream (all epochs), when the reader reached its end
    if final_step < run.train.last_step:
        summary["stopped_early"] = (
            f"data exhausted at step {final_step} of {run.train.last_step} ({total_rows:,} rows in "
            f"{run.data.epochs} epoch(s)); the learning-rate schedule was planned for {run.train.max_steps} steps: "
            "raise [data] epochs (or lower max_steps)"
        )
        print(f"WARNING stopped_early: {summary['stopped_early']}", flush=True)
    summary["final_model"] = str(output / "final")
    if records:
        plot_loss(records, output / "loss.png")
    # the windows this run's reader packed (none: a packed directory, or a finished run resumed)
    failure = run_failure(packing, run.data.max_skip_fraction) if packing.get("samples_read") else None
    if failure is not None:  # as pack does: the model trained, but on what the user ruled out
        summary["failed"] = failure
    (output / "summary.json").write_text(json.dumps(summary, indent=1))
    print(format_summary(summary), flush=True)
    if failure is not None:
        raise ValueError(failure)
    return summary


class StreamFeeder(RowFeeder):
    """The run's RowFeeder, built inside its actor over the run's stream: the packing pipeline
    of the data config (``("pipeline", plan)``) or a packed directory (``("packed", path, info)``)."""

    def __init__(self, config: Any, source: tuple, scaling: Any, *, output: str, state: dict | None,
                 saved_manifest: dict | None, pad_id: int, **layout: Any) -> None:
        from packfeed.service.raycluster import quiet_ray
        from packfeed.service.streams import packed_dir_source, pipeline_source
        from packfeed.service.tokenize import load_tokenizer
        from packfeed.trainer.feeder import load_manifest

        quiet_ray()
        if source[0] == "pipeline":
            tokenizer = load_tokenizer(config.tokenizer, loss=config.loss, add_eos=config.add_eos,
                                       backend=config.tokenizer_backend)
            stream = pipeline_source(config, source[1], tokenizer, scaling)
        else:
            stream = packed_dir_source(source[1], source[2])
        manifest = load_manifest(stream.manifest_key, Path(output) / MANIFEST_FILE, saved_manifest)
        stream.seed_manifest(manifest)
        super().__init__(
            stream.open_reader, manifest, seq_len=stream.seq_len, pad_id=pad_id, config_hash=stream.config_hash,
            state=state, stats=stream.stats, **layout,
        )


def format_summary(summary: dict[str, Any]) -> str:
    packing = summary.get("packing") or {}
    lines = [
        ("steps", f"{summary.get('steps', 0)}" + (" (stopped early: data exhausted)" if summary.get("stopped_early") else "")),
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


def _prepare_output(output: Path, *, resume: bool | str, overwrite: bool):
    """(the checkpoint to resume from or None, a function that clears the previous run or None).
    The caller clears only once every other check has passed: a mistake never costs a run.
    ``resume="auto"`` resumes when there is a checkpoint, and otherwise starts afresh (clearing
    what an attempt that died before its first checkpoint left)."""
    has_run = (output / RUN_NAME).exists() or (output / "metrics.jsonl").exists()
    found = latest_checkpoint(output) if resume else None
    if resume == "auto":
        if found is not None:
            return found, None
        overwrite = True
    elif resume:
        if found is None:
            fix = "pass --overwrite (or --resume auto) to start it again" if has_run else "run without --resume first"
            raise ValueError(f"--resume: no checkpoint under {output / RUN_NAME}; {fix}")
        return found, None
    if not has_run:
        return None, None
    if not overwrite:
        raise ValueError(f"{output} already holds a training run: pass --resume to continue it or --overwrite")

    def clear() -> None:
        for name in (RUN_NAME, "final", "rows", "metrics.jsonl", "summary.json", "loss.png", MANIFEST_FILE):
            path = output / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()

    return None, clear
