"""The driver of a training run: feeder actor + Ray Train ``TorchTrainer`` + summary.

::

    PackingPipeline (packing actors, CPU) -> RowFeeder actor (RowHub + the serve contract) -> N
    train workers (TorchTrainer, DDP): get_step(rank, step) -> to_model_inputs -> train_step

A train worker that dies (SIGKILL, OOM) is restarted by Ray Train (``[train] max_failures``)
from the latest checkpoint; the feeder, owned by the driver, serves the restarted ranks the
same rows for the same steps.

``train(run, output=...)`` returns the summary dict and writes, under ``output`` (a local
directory or a URI such as ``s3://bucket/runs/demo``: run_dir.py says what goes where and at
what cost): ``metrics.jsonl``, ``loss.png``, ``summary.json``, Ray Train's checkpoints under
``ray/``, and the final model under ``final/`` (``from_pretrained`` loads it, with the
tokenizer), which appears whole or not at all (written aside, then published). The inputs'
scan manifest is kept there too (``scan.npz``): a resume reads no input to plan.

SIGTERM or SIGINT stop a run in order (``trainer/stopping.py``): ``trainer.fit()`` runs in a
thread while the main thread waits in short slices; the first signal asks the feeder to stop
every rank after the same step, the ranks checkpoint it, the driver says where it stopped and
raises ``Terminated`` / ``KeyboardInterrupt`` (the CLI exits 143 / 130); a second signal ends
the run at once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from packfeed.client.state import StreamState
from packfeed.service import faults, storage
from packfeed.service.pipeline.stats import run_failure
from packfeed.trainer.checkpoint import (
    FINAL_DIR,
    FINAL_PARTIAL,
    FINAL_STATE,
    MANIFEST_FILE,
    RUN_NAME,
    SCAN_CACHE,
    latest_checkpoint,
    read_state,
)
from packfeed.trainer.config import INITIAL_REFERENCE, ModelConfig, RunConfig
from packfeed.trainer.feeder import RowFeeder
from packfeed.trainer.metrics import plot_loss, read_jsonl, summarize
from packfeed.trainer.mixture_hook import load_hook
from packfeed.trainer.run_dir import (
    FINAL_OLD,
    holds,
    location,
    path,
    publish_final,
    ray_storage,
    read_text,
    remove,
    write_json,
)
from packfeed.trainer.stopping import StopSignals

logger = logging.getLogger(__name__)

WAIT_SLICE_S = 0.2  # how long the main thread waits at a time for fit(): the delay of a signal
# How often Ray Train's controller looks at its workers (Ray's default 2 s): after the last
# step it took 4.7 s to see the train function had returned (0.8 s at 0.2 s). Ray Train passes
# the driver's value to the controller; a user's own setting is kept.
HEALTH_CHECK_ENV, HEALTH_CHECK_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5"


def ray_train_env() -> None:
    """Ray Train's settings packfeed picks for its controller (``HEALTH_CHECK_S``), where the
    user set none; before ``TorchTrainer.fit``."""
    os.environ.setdefault(HEALTH_CHECK_ENV, HEALTH_CHECK_S)


def train(run: RunConfig, *, output: str | Path, address: str | None = None, resume: bool | str = False,
          overwrite: bool = False) -> dict[str, Any]:
    """Train ``run``; see the module docstring for what lands in ``output`` (a path or a URI).

    Raises ValueError when ``output`` already holds a run and neither ``resume`` (continue
    from its latest checkpoint, on exactly the rows an uninterrupted run would see next;
    ``"auto"``: if there is one, else start) nor ``overwrite`` (start again) is given. Everything that can be checked before Ray starts
    (output, plan, tokenizer, the inputs' first rows and the chat template on them, the model's
    name and vocabulary) is checked first. A resume of a finished run (its checkpoint at
    the last step, or its data used up) says so, changes nothing and returns its summary.

    SIGTERM or SIGINT stop the run after the step every rank can reach, checkpointed (no
    ``final/``); then the driver says where it stopped and how to continue, writes the summary
    (marked ``stopped``) and raises ``Terminated`` (SIGTERM) or ``KeyboardInterrupt`` (SIGINT).
    A second signal, or one before training starts, raises at once.
    """
    with StopSignals() as signals:
        return _train(run, output=location(output), address=address, resume=resume, overwrite=overwrite,
                      signals=signals)


def _train(run: RunConfig, *, output: str | Path, address: str | None, resume: bool | str, overwrite: bool,
           signals: StopSignals) -> dict[str, Any]:
    from packfeed.service.data.plan import build_plan
    from packfeed.service.data.probe import check_inputs
    from packfeed.service.delivery.row_stream import find_packed_dir
    from packfeed.service.pipeline.raycluster import init_ray, joins_a_cluster, ray_initialised as ray_is_up
    from packfeed.service.tokenize.samples import load_tokenizer
    from packfeed.trainer.model import check_model

    resume_from, clear_previous = _prepare_output(output, resume=resume, overwrite=overwrite)
    state = read_state(resume_from) if resume_from is not None else None
    tokenizer = load_tokenizer(run.data.tokenizer, loss=run.data.loss, add_eos=run.data.add_eos,
                               backend=run.data.tokenizer_backend)
    packed = find_packed_dir(run.data.inputs)
    load_hook(run.train.mixture_hook)  # a hook that cannot be imported fails here, not in every worker
    if packed is not None:  # pack once, train many: the rows are served as they are
        if run.train.mixture_hook is not None:
            raise ValueError("[train] mixture_hook changes the mixture, and a packed directory's rows are fixed: "
                             "train on the data config, or pack again with [[data.schedule]] entries")
        check_packed_dir(storage.display(packed.path), packed.info, run.data.seq_len, tokenizer)
        packed_or_plan = packed
        print(f"training on the packed directory {storage.display(packed.path)} as it is ({packed.num_rows:,} rows)",
              flush=True)
    else:
        if joins_a_cluster(address):  # the scan runs on the cluster's nodes
            signals.defer()
            print(init_ray(address, dashboard=True), flush=True)
            signals.check()
        packed_or_plan = build_plan(run.data, scan_cache=path(output, SCAN_CACHE))
    if state is not None:
        check_resume(state, run, packed=None if packed is None else packed.info,
                     plan=packed_or_plan if packed is None else None)
        done = finished(state, run)
        if done is not None:
            logger.info("%s is finished, nothing to do: %s (checkpoint %s); %s", storage.display(str(output)), done[0],
                        storage.display(str(resume_from)), done[1])
            return _saved_summary(output, state)
        print(f"resuming from {storage.display(str(resume_from))} at step {state['step']}, stream cursor "
              f"{state['stream']['cursor']}", flush=True)
    check_model(run.model, vocab_size=tokenizer.vocab_size)  # not in every train worker, after Ray
    if run.train.objective == "dpo" and run.train.dpo_reference != INITIAL_REFERENCE:
        check_model(ModelConfig(name=run.train.dpo_reference, attn=run.model.attn), vocab_size=tokenizer.vocab_size)
    if packed is None:  # as pack and serve: what the inputs hold, the chat template on them
        check_inputs(packed_or_plan, tokenizer)
    signals.defer()  # from here the main thread may be inside Ray: a signal is acted on, not raised
    if not ray_is_up():
        print(init_ray(address, dashboard=True), flush=True)  # Ray Train needs the State API
    signals.check()
    return _fit(run, packed_or_plan, tokenizer, output=output, resume_from=resume_from, state=state,
                clear_previous=clear_previous, signals=signals)


def finished(state: dict, run: RunConfig) -> tuple[str, str] | None:
    """(why, what would train on) when the run whose latest checkpoint holds ``state`` has nothing
    left to train: the checkpoint is at the run's last step, or its stream cursor at the stream's
    end; else None."""
    step, last = int(state["step"]), run.train.last_step
    if step >= last:
        knob = "--max-steps" if last == run.train.max_steps else "--stop-at-step"
        return f"it trained step {step} of {last}", f"raise {knob} to train on, or pass --overwrite to start again"
    total = (state.get("manifest") or {}).get("total_rows")
    if total is not None and state["stream"]["cursor"] >= total:
        return f"its data ran out at step {step} ({total:,} rows)", "pass --overwrite to start again"
    return None


def _saved_summary(output: str | Path, state: dict) -> dict[str, Any]:
    """The summary a finished run wrote (``{"steps": ...}`` of its checkpoint when it has none)."""
    text = read_text(path(output, "summary.json"))
    return json.loads(text) if text is not None else {"steps": int(state["step"])}


def check_resume(state: dict, run: RunConfig, *, packed: dict | None, plan: Any) -> None:
    """A checkpoint continues this run only on the same stream, model and objective; ValueError
    saying what differs (checked before Ray starts, not in the feeder or every worker)."""
    expected = packed["config"]["config_hash"] if packed is not None else run.data.config_hash()
    StreamState.resume_from(state.get("stream")).check_matches(expected, run.data.seq_len,
                                                              fix="start a new run (--overwrite)")
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
    saved_train = (state.get("config") or {}).get("train")
    if saved_train is not None and saved_train.get("objective", "sft") != run.train.objective:
        raise ValueError(f"the checkpoint trained objective {saved_train.get('objective', 'sft')!r}, this run's is "
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


def _fit(run: RunConfig, packed_or_plan: Any, tokenizer: Any, *, output: str | Path, resume_from: str | Path | None,
         state: dict | None, signals: StopSignals, clear_previous=None) -> dict[str, Any]:
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
    signals.check()  # a stop asked until now leaves the previous run as it was
    if clear_previous is not None:  # every check passed (plan, tokenizer, Ray, placement): only now
        clear_previous()
    if storage.is_remote(str(output)):
        storage.delete_prefix(path(output, FINAL_PARTIAL))  # a run cut short while writing it
    else:
        output.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(output / FINAL_PARTIAL, ignore_errors=True)
    write_json(path(output, "config.json"), run.to_dict())
    world = run.scaling.num_workers
    feeder = ray.remote(StreamFeeder).options(
        num_cpus=0, max_concurrency=4 * world + 4, **placement.driver_options()
    ).remote(
        run.data, packed_or_plan, packing_scaling(run.scaling, placement), output=str(output), world_size=world,
        faults_env=faults.environment(),
        grad_accum=run.train.grad_accum, micro_rows=run.train.micro_batch_rows, capacity=run.feeder_buffer_rows,
        pad_id=tokenizer.pad_id, tokenizer=tokenizer.ship(),
        state=None if state is None else state["stream"], saved_manifest=None if state is None else state.get("manifest"),
    )
    ray.get(feeder.total_rows.remote())  # a feeder that cannot start fails here, as itself, not in every worker
    ray_train_env()
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "run": run.to_dict(), "feeder": feeder, "output": str(output),
            "resume_from": str(resume_from) if resume_from else None,
            "pad_id": tokenizer.pad_id, "vocab_size": tokenizer.vocab_size, "faults": faults.environment(),
        },
        scaling_config=ScalingConfig(
            num_workers=world, use_gpu=use_gpu,
            resources_per_worker={"CPU": run.scaling.cpus_per_worker, **({"GPU": 1} if use_gpu else {}),
                                  **run.scaling.trainer_resources},
            label_selector=placement.trainer or None,
        ),
        run_config=RayRunConfig(
            name=RUN_NAME, **ray_storage(output),
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
          f"steps {start_step}->{run.train.last_step} -> {storage.display(str(output))}", flush=True)
    signals.check()
    started = time.perf_counter()
    _fit_until_done_or_stopped(trainer, feeder, signals, start_step)
    packing = ray.get(feeder.packing_stats.remote())
    total_rows = ray.get(feeder.total_rows.remote())
    ray.kill(feeder)

    records = read_jsonl(path(output, "metrics.jsonl"))
    summary = summarize(records)
    summary["wall_seconds"] = time.perf_counter() - started
    summary["packing"] = {k: packing.get(k) for k in ("rows", "tokens", "efficiency", "samples_packed", "windows")}
    if packing.get("sources"):
        summary["packing"]["sources"] = packing["sources"]
    summary["stream_rows"] = total_rows  # rows of the whole stream (all epochs), when the reader reached its end
    summary["reader_restarts"] = packing.pop("reader_restarts", 0)  # >0: a restarted group needed rows evicted
    if signals.requested and not storage.exists(path(output, FINAL_PARTIAL, FINAL_STATE)):
        _stopped(run, output, summary, records, signals)  # the ranks stopped before the end
    final_step = publish_final(output, tokenizer)
    summary["final_step"] = final_step
    if final_step < run.train.last_step:
        summary["stopped_early"] = (
            f"data exhausted at step {final_step} of {run.train.last_step} ({total_rows:,} rows in "
            f"{run.data.epochs} epoch(s)); the learning-rate schedule was planned for {run.train.max_steps} steps: "
            "raise [data] epochs (or lower max_steps)"
        )
        print(f"WARNING stopped_early: {summary['stopped_early']}", flush=True)
    summary["final_model"] = storage.display(path(output, FINAL_DIR))
    if records:
        plot_loss(records, path(output, "loss.png"))
    # the windows this run's reader packed (none: a packed directory, or a finished run resumed)
    failure = run_failure(packing, run.data.max_skip_fraction) if packing.get("samples_read") else None
    if failure is not None:  # as pack does: the model trained, but on what the user ruled out
        summary["failed"] = failure
    write_json(path(output, "summary.json"), summary)
    print(format_summary(summary), flush=True)
    if failure is not None:
        raise ValueError(failure)
    if signals.requested:
        logger.info("%s came as the run ended: it is complete (%s)", signals.name, summary["final_model"])
        raise signals.exception()
    return summary


def _fit_until_done_or_stopped(trainer: Any, feeder: Any, signals: StopSignals, start_step: int) -> None:
    """``trainer.fit()`` in a thread; re-raises what it raised. The main thread waits in short
    slices, so a signal's handler runs at once (Python runs handlers in the main thread only, and
    a signal the kernel gives another thread does not wake the main thread's wait). The first
    signal asks the feeder to stop every rank after the same step, and the wait goes on while
    they checkpoint it; a second raises at once (the CLI's Ray shutdown then ends the workers,
    without a checkpoint), and so does the first when no rank has asked for a step yet (nothing
    to finish: no need to wait for the workers to start). Run in a thread, fit() also leaves
    SIGINT to us: Ray Train installs its own handler (an abort, no checkpoint) only when fit()
    runs in the main thread."""
    import ray

    failure: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # the main thread raises it
            failure.append(exc)

    # a daemon: after a second signal nothing waits for it (Ray's shutdown ends its ray.get)
    thread = threading.Thread(target=fit, name="packfeed-train-fit", daemon=True)
    thread.start()
    stop_asked = False
    while thread.is_alive():
        thread.join(WAIT_SLICE_S)
        if signals.urgent:
            logger.info("%s again: stopping now, without checkpointing the steps since the last checkpoint",
                        signals.name)
            raise signals.exception()
        if signals.requested and not stop_asked:
            stop_asked = True
            step = ray.get(feeder.request_stop.remote())
            if step == start_step:
                again = "continue with `packfeed train ... --resume`" if step else "start it again with --resume auto"
                logger.info("%s: stopped before step %d, nothing trained; %s", signals.name, step + 1, again)
                raise signals.exception()
            logger.info("%s: stopping after step %d (the steps in flight finish, then a checkpoint); a second signal "
                        "stops at once", signals.name, step)
    if failure:
        raise failure[0]


def _stopped(run: RunConfig, output: str | Path, summary: dict[str, Any], records: list, signals: StopSignals) -> NoReturn:
    """A run stopped by a signal: write what is true (the summary marked ``stopped``, the loss
    curve), say where it stopped and how to continue, and raise the signal's exception."""
    checkpoint = latest_checkpoint(output)  # the stop step's: every rank trained at least one step
    step = int(read_state(checkpoint)["step"])
    summary["stopped"] = {"signal": signals.name, "step": step, "checkpoint": storage.display(str(checkpoint))}
    if records:
        plot_loss(records, path(output, "loss.png"))
    write_json(path(output, "summary.json"), summary)
    print(format_summary(summary), flush=True)
    logger.info("stopped at step %d of %d (%s): checkpoint %s; continue with `packfeed train ... --resume` (the same "
                "config and --output)", step, run.train.last_step, signals.name, summary["stopped"]["checkpoint"])
    raise signals.exception()


class StreamFeeder(RowFeeder):
    """The run's RowFeeder, built inside its actor over the run's stream (``open_stream``): the
    packing pipeline of the data config (``packed_or_plan`` a StreamPlan) or a PackedDir.
    ``tokenizer``: the driver's ``SampleTokenizer.ship()``, for the catch-up path and the
    packing actors (none of them imports transformers or proves steps 1-3 again)."""

    def __init__(self, config: Any, packed_or_plan: Any, scaling: Any, *, output: str, state: dict | None,
                 saved_manifest: dict | None, pad_id: int, tokenizer: Any, faults_env: dict | None = None,
                 **layout: Any) -> None:
        from packfeed.service.pipeline.raycluster import quiet_ray
        from packfeed.service.delivery.row_stream import open_stream
        from packfeed.service.tokenize.samples import SampleTokenizer
        from packfeed.trainer.feeder import load_manifest

        quiet_ray()
        faults.adopt(faults_env)
        loaded = SampleTokenizer(tokenizer, loss=config.loss, add_eos=config.add_eos, backend=config.tokenizer_backend)
        stream = open_stream(packed_or_plan, config, tokenizer=loaded, scaling=scaling)
        manifest = load_manifest(stream.manifest_key, path(output, MANIFEST_FILE), saved_manifest)
        stream.seed_manifest(manifest)
        if stream.mixture is not None:  # the checkpoint's mixture changes, then the loop's new ones
            stream.mixture.attach(manifest)
        self._sources = [(s["name"], int(s.get("first_sample_id", 0))) for s in stream.sources]
        super().__init__(
            stream.open_reader, manifest, seq_len=stream.seq_len, pad_id=pad_id, config_hash=stream.config_hash,
            state=state, stats=stream.stats, mixture=stream.mixture, **layout,
        )

    def sources(self) -> list[tuple[str, int]]:
        """(name, first global sample id) of every source, in config order: the mixture hook's."""
        return self._sources


def format_summary(summary: dict[str, Any]) -> str:
    packing = summary.get("packing") or {}
    lines = [
        ("steps", f"{summary.get('steps', 0)}" + (" (stopped early: data exhausted)" if summary.get("stopped_early") else "")),
        ("loss first -> last", f"{summary.get('first_loss', float('nan')):.4f} -> {summary.get('last_loss', float('nan')):.4f}"),
        *([("DPO reward (last)", f"margin {summary['last_reward_margin']:+.4f}, accuracy "
                                 f"{summary['last_reward_accuracy']:.0%}")] if "last_reward_margin" in summary else []),
        ("real tokens/s", f"{summary.get('tokens_per_s', 0):,.0f}"),
        ("row fill (trained rows)", f"{summary.get('mean_fill', 0):.1%}"),
        ("data wait", f"{summary.get('mean_data_wait', 0):.1%}"),
        ("packing efficiency", f"{(packing.get('efficiency') or 0):.1%} ({packing.get('rows') or 0:,} rows packed)"),
        ("wall time", f"{summary.get('wall_seconds', 0):.1f} s"),
        _outcome(summary),
    ]
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def _outcome(summary: dict[str, Any]) -> tuple[str, str]:
    """The summary's last line: the final model, or where a stopped run can continue from."""
    stopped = summary.get("stopped")
    if stopped is None:
        return "final model", summary.get("final_model", "")
    return "stopped", f"by {stopped['signal']} at step {stopped['step']}: resume from {stopped['checkpoint']}"


def _prepare_output(output: str | Path, *, resume: bool | str, overwrite: bool):
    """(the checkpoint to resume from or None, a function that clears the previous run or None).
    The caller clears only once every other check has passed: a mistake never costs a run.
    ``resume="auto"`` resumes when there is a checkpoint, and otherwise starts afresh (clearing
    what an attempt that died before its first checkpoint left)."""
    has_run = holds(output, RUN_NAME) or holds(output, "metrics.jsonl")
    found = latest_checkpoint(output) if resume else None
    if resume == "auto":
        if found is not None:
            return found, None
        overwrite = True
    elif resume:
        if found is None:
            fix = "pass --overwrite (or --resume auto) to start it again" if has_run else "run without --resume first"
            raise ValueError(f"--resume: no checkpoint under {storage.display(path(output, RUN_NAME))}; {fix}")
        return found, None
    if not has_run:
        return None, None
    if not overwrite:
        raise ValueError(f"{storage.display(str(output))} already holds a training run: pass --resume to continue it "
                         "or --overwrite")

    def clear() -> None:  # the run's files, not the scan manifest: it describes the inputs
        remove(output, (RUN_NAME, FINAL_DIR, FINAL_PARTIAL, FINAL_OLD, "rows", "metrics.jsonl", "summary.json",
                        "loss.png", MANIFEST_FILE))

    return None, clear
