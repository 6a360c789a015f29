"""Experiment trackers (``[train] report_to``): TensorBoard, MLflow, Weights & Biases, fed by
rank 0 of the rank loop (trainer/loop/rank.py), so Ray Train and torchrun log the same way.

``Trackers`` is one small interface over the trackers a run names: ``log(record)`` with each
metrics record rank 0 appends to metrics.jsonl (``metric_values`` names its figures),
``log_config(run_dict)`` once per tracker run, ``finish(final_model, summary)`` at the end
(the final model's path, or None for a stopped run). Each adapter uses the library's own logger:

=============  =========================================  ==========================================
tracker        writes                                     settings (environment of rank 0)
=============  =========================================  ==========================================
tensorboard    ``<output>/tensorboard/`` event files      none
mlflow         ``MLFLOW_TRACKING_URI``, else a file store  ``MLFLOW_EXPERIMENT_NAME`` (else "packfeed");
               ``<output>/mlruns``                         the run is named after the output folder
wandb          ``<output>/wandb/`` (``WANDB_DIR`` for a    ``WANDB_PROJECT`` (else "packfeed"),
               remote output)                              ``WANDB_MODE`` (else "offline" without
                                                           ``WANDB_API_KEY``)
=============  =========================================  ==========================================

A restarted worker group or ``--resume`` continues the same tracker runs: their ids are kept in
``<output>/trackers.json`` (``RunDir.trackers``), written as they open. The steps after the
checkpoint a run restarts from are trained again: TensorBoard purges its events of those steps
(``purge_step``); MLflow keeps both values of such a step; W&B ignores a step below the last one
it holds, so it keeps the first. A resumed tracker run keeps the config it started with.

Cost: a few small writes per record (records come every ``log_every`` steps), all in rank 0's
process; a tracker's own threads or service (W&B's) start and end with the run.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Mapping

from packfeed.service.face import is_remote, read_text, write_bytes_atomic
from packfeed.trainer.state.run_dir import RunDir

logger = logging.getLogger(__name__)

TRACKERS = ("tensorboard", "mlflow", "wandb")  # [train] report_to's choices
NONE = "none"  # report_to = "none": no tracker (as an empty list)
MODULES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}  # what each one imports
INSTALL = "pip install 'packfeed[track]'"
DEFAULT_PROJECT = "packfeed"  # MLflow's experiment and W&B's project when the environment names none
GIB = 2**30

# metrics.jsonl record keys that are no figure of the interval (``step`` is every figure's step).
NOT_FIGURES = ("step", "time", "memory")


def metric_values(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one metrics record under stable tracker names: every figure as
    ``train/<key>`` (``train/loss``, ``train/lr``, ``train/mfu``, ``train/reward_margin``, ...),
    nested tables flattened with ``/`` (``{"source_loss": {"chat": 2.1}}`` ->
    ``train/source_loss/chat``), the ``eval`` table under ``eval/`` (``eval/loss``,
    ``eval/source_loss/chat``, ``eval/tokens``), the largest rank's peak memory as
    ``train/peak_memory_gib``. None, booleans, strings and lists are no metric: skipped. No name
    is the folder of another (``train/loss`` and ``train/loss/chat`` would be): MLflow's file
    store keeps a metric as a file at its name's path."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "eval":
            _flatten("eval", value, out)
        elif key not in NOT_FIGURES:
            _flatten(f"train/{key}", value, out)
    peaks = [r.get("peak_bytes") for r in (record.get("memory") or {}).get("ranks") or []]
    peaks = [p for p in peaks if _is_number(p)]
    if peaks:
        out["train/peak_memory_gib"] = max(peaks) / GIB
    return out


def _flatten(name: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            _flatten(f"{name}/{key}", inner, out)
    elif _is_number(value):
        out[name] = float(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def report_to_names(value: Any) -> tuple[str, ...]:
    """``[train] report_to`` as a tuple of tracker names: a list of names, one name, "none" or
    nothing (no tracker); ValueError naming the choices for anything else."""
    names = [value] if isinstance(value, str) else value
    if names is None or not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"report_to must be a list of trackers ({', '.join(TRACKERS)}) or \"{NONE}\"; got {value!r}")
    unknown = [n for n in names if n not in (*TRACKERS, NONE)]
    if unknown:
        raise ValueError(f"report_to: unknown tracker(s) {', '.join(map(repr, unknown))}; choose from "
                         f"{', '.join(TRACKERS)} (or \"{NONE}\")")
    return tuple(dict.fromkeys(n for n in names if n != NONE))


def check_trackers(names: tuple[str, ...], output: str | Path, environ: Mapping[str, str] = os.environ,
                   modules: Mapping[str, str] = MODULES) -> None:
    """Before training: every tracker ``names`` is installed (``modules``: the module each
    imports), and has somewhere to write. A remote ``--output`` (s3://...) holds no tracker's
    local files: TensorBoard is refused there, MLflow needs ``MLFLOW_TRACKING_URI``, W&B
    ``WANDB_DIR`` (a local directory). One-line ValueError."""
    key = f"[train] report_to = {json.dumps(list(names))}"
    for name in names:
        if importlib.util.find_spec(modules[name]) is None:
            raise ValueError(f"{key}: {name} is not installed ({INSTALL})")
    if not is_remote(os.fspath(output)):
        return
    needs = {"tensorboard": None, "mlflow": "MLFLOW_TRACKING_URI", "wandb": "WANDB_DIR"}
    for name in names:
        if needs[name] is None or not environ.get(needs[name]):
            where = f"set {needs[name]}" if needs[name] else "use a local --output or leave it out"
            raise ValueError(f"{key}: {name} writes local files, and --output {output} is remote: {where}")


class Trackers:
    """The trackers of one run, on rank 0 (an empty one elsewhere, or with no ``report_to``);
    a context manager that closes them as failed when what it holds raises (the rank loop)."""

    def __init__(self, adapters: list[Any] | None = None) -> None:
        self._adapters = list(adapters or [])

    def log(self, record: Mapping[str, Any]) -> None:
        """One metrics record (metrics.jsonl's), at its step. A tracker that fails to take it
        (its server away) is a warning, not the end of the training: metrics.jsonl has it."""
        if self._adapters:
            values, step = metric_values(record), int(record["step"])
            for adapter in self._adapters:
                try:
                    adapter.log(step, values)
                except Exception as error:
                    logger.warning("%s: the record of step %d was not logged: %s", adapter.NAME, step, error)

    def log_config(self, run: Mapping[str, Any]) -> None:
        """The run's config (``RunConfig.to_dict()``), into each tracker run that started now."""
        for adapter in self._adapters:
            if not adapter.resumed:
                adapter.log_config(run)

    def finish(self, final_model: str | None, summary: Mapping[str, Any]) -> None:
        """The end of the run: the final model's path (None: stopped, to be resumed) and the
        summary figures (interval.summarize's, numbers only, as ``summary/<key>``)."""
        figures: dict[str, float] = {}
        _flatten("summary", {k: v for k, v in summary.items() if k != "memory"}, figures)
        adapters, self._adapters = self._adapters, []
        for adapter in adapters:
            adapter.finish(final_model, figures)

    def __enter__(self) -> "Trackers":
        return self

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if kind is None:
            return
        adapters, self._adapters = self._adapters, []
        for adapter in adapters:
            try:
                adapter.fail()
            except Exception:  # the loop's error is the one to raise
                logger.exception("closing a tracker after a failure")


def open_trackers(names: tuple[str, ...], *, output: str | Path, start: int, config: Mapping[str, Any],
                  environ: Mapping[str, str] = os.environ) -> Trackers:
    """Open (or continue: ``trackers.json``) the tracker runs of ``names`` for a run under
    ``output`` starting at step ``start``, and log ``config`` into the new ones."""
    if not names:
        return Trackers()
    ids_path = RunDir(output).trackers
    text = read_text(os.fspath(ids_path))
    ids = json.loads(text) if text else {}
    opened = {cls.NAME: cls for cls in (TensorBoardTracker, MlflowTracker, WandbTracker)}
    adapters = [opened[name](output=output, start=start, saved=ids.get(name), environ=environ) for name in names]
    ids.update({name: adapter.ids for name, adapter in zip(names, adapters)})
    write_bytes_atomic(os.fspath(ids_path), json.dumps(ids, indent=1).encode())
    trackers = Trackers(adapters)
    trackers.log_config(config)
    logger.info("trackers: %s", ", ".join(f"{name} {adapter.where}" for name, adapter in zip(names, adapters)))
    return trackers


def run_name(output: str | Path) -> str:
    """The tracker run's name: the output folder's (``runs/demo`` -> ``demo``)."""
    return os.path.basename(os.fspath(output).rstrip("/")) or "packfeed"


def config_params(run: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """The run's config as flat string parameters (``train.lr`` -> ``"0.0003"``): tables
    flattened with dots, anything else as JSON (lists, None)."""
    out: dict[str, str] = {}
    for key, value in run.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(config_params(value, prefix=f"{name}."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return out


class TensorBoardTracker:
    """Event files under ``<output>/tensorboard/`` (``torch.utils.tensorboard.SummaryWriter``);
    a resumed run appends a new event file that purges the steps after ``start``."""

    NAME = "tensorboard"

    def __init__(self, *, output: str | Path, start: int, saved: Any, environ: Mapping[str, str]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.resumed, self.ids = saved is not None, {}
        self.where = RunDir(output).tensorboard
        self._writer = SummaryWriter(self.where, purge_step=start + 1 if self.resumed else None)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def log_config(self, run: Mapping[str, Any]) -> None:
        self._writer.add_text("config", "```\n" + json.dumps(run, indent=1, default=str) + "\n```", global_step=0)

    def finish(self, final_model: str | None, figures: Mapping[str, float]) -> None:
        if final_model is not None:
            self._writer.add_text("final_model", final_model)
        self._writer.close()

    def fail(self) -> None:
        self._writer.close()


class MlflowTracker:
    """An MLflow run (``MlflowClient``): the config as parameters (flattened, cut to MLflow's
    limits), each figure a metric at its step, the final model's path as the ``final_model``
    tag; the run ends FINISHED, KILLED (stopped: a later ``--resume`` sets it RUNNING again) or
    FAILED. The default store, ``<output>/mlruns``, is MLflow's file store, which MLflow 3 opens
    only with ``MLFLOW_ALLOW_FILE_STORE=true``: set here for that store alone (its reader needs it too)."""

    NAME = "mlflow"

    def __init__(self, *, output: str | Path, start: int, saved: Any, environ: Mapping[str, str]) -> None:
        from mlflow import MlflowClient

        uri = (saved or {}).get("tracking_uri") or environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = Path(RunDir(output).mlruns).resolve().as_uri()
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = MlflowClient(tracking_uri=uri)
        self.resumed = saved is not None
        if self.resumed:
            self._run_id = saved["run_id"]
            self._client.update_run(self._run_id, status="RUNNING")
        else:
            name = environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
            experiment = self._client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self._client.create_experiment(name)
            self._run_id = self._client.create_run(experiment_id, run_name=run_name(output)).info.run_id
        self.ids = {"run_id": self._run_id, "tracking_uri": uri}
        self.where = f"{uri} run {self._run_id}"

    def log(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric
        from mlflow.utils.time import get_current_time_millis

        now = get_current_time_millis()
        self._client.log_batch(self._run_id, metrics=[Metric(_mlflow_key(k), v, now, step) for k, v in values.items()])

    def log_config(self, run: Mapping[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        params = {_mlflow_key(k): v[:MAX_PARAM_VAL_LENGTH] for k, v in config_params(run).items()}
        self._client.log_batch(self._run_id, params=[Param(k, v) for k, v in params.items()])

    def finish(self, final_model: str | None, figures: Mapping[str, float]) -> None:
        if final_model is not None:
            self._client.set_tag(self._run_id, "final_model", final_model)
        self.log(int(figures.get("summary/steps", 0)), figures)
        self._client.set_terminated(self._run_id, "FINISHED" if final_model is not None else "KILLED")

    def fail(self) -> None:
        self._client.set_terminated(self._run_id, "FAILED")


def _mlflow_key(name: str) -> str:
    """``name`` in the characters and length MLflow takes for a key (others become ``_``)."""
    from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH

    return re.sub(r"[^\w\-. /:]", "_", name)[:MAX_ENTITY_KEY_LENGTH]


class WandbTracker:
    """A W&B run (``wandb.init``) in ``<output>/wandb/``: project ``WANDB_PROJECT`` (else
    "packfeed"), mode ``WANDB_MODE`` (else offline unless ``WANDB_API_KEY`` is set: ``wandb
    sync <output>/wandb/offline-run-*`` uploads it later); the config as the run's config, each
    record ``log(values, step=step)``, the final model's path and the summary figures in its
    summary. Its console capture is off: the rank's output is the launcher's."""

    NAME = "wandb"

    def __init__(self, *, output: str | Path, start: int, saved: Any, environ: Mapping[str, str]) -> None:
        import wandb

        directory = environ.get("WANDB_DIR") if is_remote(os.fspath(output)) else os.fspath(output)
        Path(directory).mkdir(parents=True, exist_ok=True)  # a remote output: check_trackers wants WANDB_DIR
        mode = environ.get("WANDB_MODE") or ("online" if environ.get("WANDB_API_KEY") else "offline")
        self.resumed = saved is not None
        self._run = wandb.init(
            project=environ.get("WANDB_PROJECT") or DEFAULT_PROJECT, dir=directory, name=run_name(output),
            id=saved["id"] if self.resumed else None, resume="allow" if self.resumed else None, mode=mode,
            reinit="create_new", settings=wandb.Settings(console="off"))
        self.ids = {"id": self._run.id}
        self.where = f"{mode} run {self._run.id} in {os.path.dirname(self._run.dir)}"  # dir: its files/

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log(dict(values), step=step)

    def log_config(self, run: Mapping[str, Any]) -> None:
        self._run.config.update(dict(run), allow_val_change=True)

    def finish(self, final_model: str | None, figures: Mapping[str, float]) -> None:
        self._run.summary.update({**figures, **({"final_model": final_model} if final_model else {})})
        self._run.finish(exit_code=0)

    def fail(self) -> None:
        self._run.finish(exit_code=1)
