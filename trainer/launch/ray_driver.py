"""The driver of a training run: checks, feeder actor + Ray Train ``TorchTrainer``, summary.

::

    PackingPipeline (packing actors, CPU) -> RowFeeder actor (RowHub + the serve contract) -> N
    train workers (TorchTrainer; DDP or FSDP2): get_step(rank, step) -> to_model_inputs -> train_step

The same ranks' loop runs without Ray under torchrun (trainer/launch/torchrun.py). Before Ray starts
the driver checks what it can (output, resume, tokenizer, model, the loss head's family, the
memory plan: trainer/model/memory_plan.py), so a mistake is one line, not a failure in every worker.

A train worker that dies (SIGKILL, OOM) is restarted by Ray Train (``[train] max_failures``)
from the latest checkpoint; the feeder, owned by the driver, serves the restarted ranks the
same rows for the same steps.

``train(run, output=...)`` returns the summary dict and writes, under ``output`` (a local
directory or a URI such as ``s3://bucket/runs/demo``: run_dir.py says what goes where and at
what cost): ``metrics.jsonl``, ``loss.png``, ``summary.json``, Ray Train's checkpoints under
``ray/``, and the final model under ``final/`` (``from_pretrained`` loads it, with the
tokenizer), which appears whole or not at all (written aside, then published). The inputs'
scan manifest is kept there too (``scan.npz``): a resume reads no input to plan.

SIGTERM or SIGINT stop a run in order (``trainer/launch/signals.py``): ``trainer.fit()`` runs in a
thread while the main thread waits in short slices; the first signal asks the feeder to stop
every rank after the same step, the ranks checkpoint it, the driver says where it stopped and
raises ``Terminated`` / ``KeyboardInterrupt`` (the CLI exits 143 / 130); a second signal ends
the run at once.

The driver only sequences the run; the parts live beside it: the checks before Ray starts and
the end of the run, shared with torchrun (launch/prechecks.py, launch/finish.py), the checkpoint's
trainer state (trainer/state/train_state.py ``TrainState``), the feeder actor (service/delivery/feeder.py
``StreamFeeder``), the rank's loop (trainer/loop/rank.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from packfeed.service.face import (
    PackedDir,
    RayStart,
    StreamFeeder,
    check_train_placement,
    delete_prefix,
    display,
    exists,
    faults_environment,
    find_packed_dir,
    init_ray,
    is_remote,
    joins_a_cluster,
    preflight,
    ray_initialised as ray_is_up,
    write_json,
)
from packfeed.trainer.launch.finish import RunEnd, finish_run
from packfeed.trainer.launch.prechecks import Opened, Prechecked, check_run, open_output, training_line
from packfeed.trainer.launch.signals import StopSignals
from packfeed.trainer.loop.interval import PACKED_OUTPUT, READER, packing_figures
from packfeed.trainer.loop.rank import train_loop_per_worker
from packfeed.trainer.model.attention import check_attention, ray_workers_device
from packfeed.trainer.run_config import RunConfig
from packfeed.trainer.state.resume import check_packed_dir
from packfeed.trainer.state.run_dir import FINAL_STATE, RunDir, location, ray_storage

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
          overwrite: bool = False, no_memory_check: bool = False) -> dict[str, Any]:
    """Train ``run``; see the module docstring for what lands in ``output`` (a path or a URI).

    Raises ValueError when ``output`` already holds a run and neither ``resume`` (continue
    from its latest checkpoint, on exactly the rows an uninterrupted run would see next;
    ``"auto"``: if there is one, else start) nor ``overwrite`` (start again) is given. Everything that can be checked before Ray starts
    (output, plan, tokenizer, the inputs' first rows and the chat template on them, the model's
    name and vocabulary, the memory plan unless ``no_memory_check``) is checked first. A resume
    of a finished run (its checkpoint at the last step, or its data used up) says so, changes
    nothing and returns its summary.

    SIGTERM or SIGINT stop the run after the step every rank can reach, checkpointed (no
    ``final/``); then the driver says where it stopped and how to continue, writes the summary
    (marked ``stopped``) and raises ``Terminated`` (SIGTERM) or ``KeyboardInterrupt`` (SIGINT).
    A second signal, or one before training starts, raises at once.
    """
    with StopSignals() as signals:
        return _train(run, output=location(output), address=address, resume=resume, overwrite=overwrite,
                      no_memory_check=no_memory_check, signals=signals)


def _train(run: RunConfig, *, output: str | Path, address: str | None, resume: bool | str, overwrite: bool,
           no_memory_check: bool, signals: StopSignals) -> dict[str, Any]:
    workers = ray_workers_device(run.scaling.use_gpu, embedded=not joins_a_cluster(address) and not ray_is_up())
    if workers is not None:  # a back-end the workers' CPU cannot run: said now, not by every worker after Ray
        check_attention(run.model.attn, *workers)
    opened = open_output(run, output, resume=resume, overwrite=overwrite)
    packed = find_packed_dir(run.data.inputs)
    ray = _RunRay(address, signals)
    checked: list[Prechecked] = []

    def check(packed_or_plan: Any) -> bool:  # False: a resumed run that is finished
        checked.append(check_run(run, opened, output=output, packed_or_plan=packed_or_plan,
                                 no_memory_check=no_memory_check))
        return checked[-1].done is None

    if packed is not None:  # pack once, train many: the rows are served as they are
        if run.train.mixture_hook is not None:
            raise ValueError("[train] mixture_hook changes the mixture, and a packed directory's rows are fixed: "
                             "train on the data config, or pack again with [[data.schedule]] entries")
        check_packed_dir(display(packed.path), packed.info, run.data.seq_len, opened.tokenizer)
        print(f"training on the packed directory {display(packed.path)} as it is ({packed.num_rows:,} rows)",
              flush=True)
        if not check(packed):
            return checked[-1].done
        ray.start()
        packed_or_plan = packed
    else:  # as pack and serve: the plan, then what the inputs hold and the chat template on them
        preflighted = preflight(run.data, ray, scan_cache=RunDir(output).scan_cache, tokenizer=opened.tokenizer,
                                check_plan=check)
        if preflighted is None:
            return checked[-1].done
        packed_or_plan = preflighted.plan
    return _fit(run, packed_or_plan, opened, output=output, signals=signals)


class _RunRay(RayStart):
    """train's Ray: its line printed, with the dashboard (Ray Train needs the State API); from
    the join or the start on, the main thread may be inside Ray: a signal is acted on, not
    raised (``StopSignals.defer``), and one that came meanwhile raised after."""

    def __init__(self, address: str | None, signals: StopSignals) -> None:
        super().__init__(address, dashboard=True)
        self.signals = signals

    def up(self) -> None:  # a cluster joined before the plan
        self.signals.defer()
        print(init_ray(self.address, **self.init_kwargs), flush=True)
        self.signals.check()

    def start(self) -> None:  # the checks passed (a joined cluster is up already: nothing said)
        self.signals.defer()
        if not ray_is_up():
            print(init_ray(self.address, **self.init_kwargs), flush=True)
        self.signals.check()


def _fit(run: RunConfig, packed_or_plan: Any, opened: Opened, *, output: str | Path,
         signals: StopSignals) -> dict[str, Any]:
    """The feeder actor and Ray Train's TorchTrainer over ``packed_or_plan`` (the checks
    passed, Ray up); then the end of the run (launch/finish.py)."""
    # Ray is imported here, not at the top: ``import packfeed.trainer`` and the checks before Ray
    # starts stay free of Ray's import (about 2 s).
    import ray

    use_gpu = run.scaling.use_gpu == "yes" or (
        run.scaling.use_gpu == "auto" and ray.cluster_resources().get("GPU", 0) >= 1
    )
    placement = check_train_placement(run.scaling, use_gpu=use_gpu)
    signals.check()  # a stop asked until now leaves the previous run as it was
    if opened.clear_previous is not None:  # every check passed (plan, tokenizer, Ray, placement): only now
        opened.clear_previous()
    files = RunDir(output)
    if is_remote(str(output)):
        delete_prefix(files.final_partial)  # a run cut short while writing it
    else:
        output.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(files.final_partial, ignore_errors=True)
    write_json(files.config, run.to_dict())
    feeder = _start_feeder(run, packed_or_plan, opened, placement=placement, output=output)
    trainer = _torch_trainer(run, feeder, opened, use_gpu=use_gpu, placement=placement, output=output)
    start_step = 0 if opened.state is None else opened.state.step
    on = f"{run.scaling.num_workers} worker(s) ({'GPU' if use_gpu else 'CPU'})"
    print(training_line(run, on=on, start_step=start_step, output=output), flush=True)
    signals.check()
    started = time.perf_counter()
    _fit_until_done_or_stopped(trainer, feeder, signals, start_step)
    reader = ray.get(feeder.packing_stats.remote())
    total_rows = ray.get(feeder.total_rows.remote())
    ray.kill(feeder)
    restarts = reader.pop("reader_restarts", 0)  # >0: a restarted group needed rows evicted
    ranks_stopped = signals.requested and not exists(files.file(RunDir.FINAL_PARTIAL, FINAL_STATE))
    summary = finish_run(run, output, opened.tokenizer, RunEnd(
        launcher="ray", started=started, packing=_packing(packed_or_plan, reader), reader=reader,
        stream_rows=total_rows, reader_restarts=restarts, stopped_by=signals.name if ranks_stopped else None))
    if "failed" in summary:  # as pack does: the model trained, but on what the user ruled out
        raise ValueError(summary["failed"])
    if signals.requested:
        if not ranks_stopped:
            logger.info("%s came as the run ended: it is complete (%s)", signals.name, summary["final_model"])
        raise signals.exception()
    return summary


def _start_feeder(run: RunConfig, packed_or_plan: Any, opened: Opened, *, placement: Any, output: str | Path) -> Any:
    """The run's feeder actor (service/delivery/feeder.py ``StreamFeeder``), started: one that cannot
    start fails here, as itself, not in every worker."""
    import ray

    world, tokenizer, state = run.scaling.num_workers, opened.tokenizer, opened.state
    feeder = ray.remote(StreamFeeder).options(
        num_cpus=0, max_concurrency=4 * world + 4, **placement.driver_options()
    ).remote(
        run.data, packed_or_plan, placement.packing(run.scaling.packing), manifest_path=RunDir(output).manifest,
        world_size=world,
        faults_env=faults_environment(),
        grad_accum=run.train.grad_accum, micro_rows=run.train.micro_batch_rows, capacity=run.feeder_buffer_rows,
        balance=run.train.balance,
        pad_id=tokenizer.pad_id, tokenizer=tokenizer.ship(),
        state=None if state is None else state.stream, saved_manifest=None if state is None else state.manifest,
    )
    ray.get(feeder.total_rows.remote())
    return feeder


def _torch_trainer(run: RunConfig, feeder: Any, opened: Opened, *, use_gpu: bool, placement: Any,
                   output: str | Path) -> Any:
    """Ray Train's TorchTrainer of the run: ``num_workers`` ranks running ``train_loop_per_worker``,
    its checkpoints under ``<output>/ray`` (keep_checkpoints), ``max_failures`` restarts."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, ScalingConfig
    from ray.train import RunConfig as RayRunConfig
    from ray.train.torch import TorchTrainer

    ray_train_env()
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "run": run.to_dict(), "feeder": feeder, "output": str(output),
            "resume_from": None if opened.resume_from is None else str(opened.resume_from),
            "pad_id": opened.tokenizer.pad_id, "vocab_size": opened.tokenizer.vocab_size,
            "faults": faults_environment(),
        },
        scaling_config=ScalingConfig(
            num_workers=run.scaling.num_workers, use_gpu=use_gpu,
            resources_per_worker={"CPU": run.scaling.cpus_per_worker, **({"GPU": 1} if use_gpu else {}),
                                  **run.scaling.trainer_resources},
            label_selector=placement.trainer or None,
        ),
        run_config=RayRunConfig(
            name=RunDir.RAY, **ray_storage(output),
            checkpoint_config=CheckpointConfig(num_to_keep=run.train.keep_checkpoints),
            failure_config=FailureConfig(max_failures=run.train.max_failures),
            # the controller's and workers' INFO lines (resources requested, worker group started,
            # process group set up) say nothing to a packfeed user; a restart still says WARNING
            logging_config=LoggingConfig(log_level="WARNING"),
        ),
    )


def _packing(packed_or_plan: Any, reader: dict) -> dict[str, Any] | None:
    """The summary's packing figures: a packed directory's own stats.json, or the windows this
    run's reader packed (with each source's)."""
    if isinstance(packed_or_plan, PackedDir):
        return packing_figures(packed_or_plan.info.get("stats"), origin=PACKED_OUTPUT)
    figures = packing_figures(reader, origin=READER)
    if figures is not None and reader.get("sources"):
        figures["sources"] = reader["sources"]
    return figures


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
    import ray  # not at the top: see _fit

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
