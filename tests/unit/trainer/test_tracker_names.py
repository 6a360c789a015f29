"""``[train] report_to`` (trainer/loop/trackers.py): the tracker names of a metrics record, the
config key, the checks before training, and a stopped run continued in the same tracker runs.

The names: every number of a record appears exactly once under ``train/...`` or ``eval/...``
(a sweep over records with and without the per-source and held-out keys, DPO's figures and the
GPU-only ones), nothing that is not a number does. TensorBoard and MLflow are read back with
their own readers here (files only, no socket); W&B, which runs a service process, in
tests/integration/train/test_trackers.py.
"""

from __future__ import annotations

import itertools
import json

import pytest

from packfeed.trainer.loop.trackers import (
    Trackers,
    check_trackers,
    config_params,
    metric_values,
    open_trackers,
    run_name,
)
from packfeed.trainer.run_config import RunConfig, TrainConfig
from packfeed.trainer.state.run_dir import RunDir

GIB = 2**30
BASE = {"step": 20, "loss": 2.5, "lr": 3e-4, "grad_norm": 0.8, "tokens_per_s": 1000.0, "fill": 0.9,
        "data_wait": 0.01, "mfu": None, "seconds": 4.0, "time": 1.7e9,
        "memory": {"ranks": [{"peak_bytes": GIB, "param_bytes": 10}, {"peak_bytes": 3 * GIB, "param_bytes": 10}]}}
EXTRAS = {
    "gpu": {"mfu": 0.41},
    "no-grad-norm": {"grad_norm": None},
    "dpo": {"pairs": 8, "reward_chosen": 0.1, "reward_rejected": -0.2, "reward_margin": 0.3, "reward_accuracy": 0.75},
    "per-source": {"source_loss": {"chat": 2.0, "stories": 3.0, "empty": None}},
    "eval": {"eval": {"loss": 2.7, "tokens": 5120, "source_loss": {"chat": 2.2, "stories": 3.1},
                      "reward_margin": 0.2, "reward_accuracy": None}},
    "no-memory": {"memory": None},
}


def test_a_record_s_names_by_eye():
    record = {**BASE, **EXTRAS["per-source"], **EXTRAS["eval"]}
    assert metric_values(record) == {
        "train/loss": 2.5, "train/lr": 3e-4, "train/grad_norm": 0.8, "train/tokens_per_s": 1000.0,
        "train/fill": 0.9, "train/data_wait": 0.01, "train/seconds": 4.0, "train/peak_memory_gib": 3.0,
        "train/source_loss/chat": 2.0, "train/source_loss/stories": 3.0,
        "eval/loss": 2.7, "eval/tokens": 5120.0, "eval/source_loss/chat": 2.2, "eval/source_loss/stories": 3.1,
        "eval/reward_margin": 0.2,
    }


def _numbers(value) -> int:
    """How many numbers (not booleans) ``value`` holds in its tables (lists are no metric)."""
    if isinstance(value, dict):
        return sum(_numbers(v) for v in value.values())
    return int(isinstance(value, (int, float)) and not isinstance(value, bool))


@pytest.mark.parametrize("extras", [combo for n in range(len(EXTRAS) + 1) for combo in itertools.combinations(EXTRAS, n)],
                         ids=lambda combo: "+".join(combo) or "base")
def test_every_number_of_a_record_once_under_a_stable_name(extras):
    record = dict(BASE)
    for extra in extras:
        record.update(EXTRAS[extra])
    values = metric_values(record)
    assert all(isinstance(v, float) for v in values.values())
    assert all(name.startswith(("train/", "eval/")) for name in values)
    assert not [(a, b) for a in values for b in values if b.startswith(a + "/")], \
        "no name is the folder of another (MLflow's file store keeps a metric as a file at its name)"
    figures = {k: v for k, v in record.items() if k not in ("step", "time", "memory")}
    peak = 1 if record.get("memory") else 0
    assert len(values) == _numbers(figures) + peak, "every number once, nothing else"
    assert values["train/loss"] == record["loss"] and ("train/mfu" in values) == (record["mfu"] is not None)
    assert ("train/peak_memory_gib" in values) == bool(peak)
    for source, loss in (record.get("source_loss") or {}).items():
        assert values.get(f"train/source_loss/{source}") == loss
    assert ("eval/loss" in values) == ("eval" in record)


@pytest.mark.parametrize("given,names", [
    pytest.param(None, (), id="default"),
    pytest.param("none", (), id="none"),
    pytest.param([], (), id="empty-list"),
    pytest.param("wandb", ("wandb",), id="one-name"),
    pytest.param(["mlflow", "tensorboard", "mlflow"], ("mlflow", "tensorboard"), id="list-once-each"),
])
def test_report_to_takes_a_list_one_name_or_none(given, names):
    train = TrainConfig() if given is None else TrainConfig(report_to=given)
    assert train.report_to == names
    run = RunConfig.from_dict({"data": {"inputs": ["a.jsonl"], "tokenizer": "tok", "seq_len": 64},
                               "model": {"name": "tiny-llama"}, "train": {"report_to": given or []}})
    assert run.train.report_to == names
    assert RunConfig.from_dict(json.loads(json.dumps(run.to_dict()))).train.report_to == names


@pytest.mark.parametrize("given,match", [
    pytest.param(["tensorbord"], r"report_to: unknown tracker\(s\) 'tensorbord'; choose from tensorboard, mlflow, "
                                 r"wandb \(or \"none\"\)", id="typo"),
    pytest.param("comet", "unknown tracker", id="unknown-one-name"),
    pytest.param([1], "report_to must be a list of trackers", id="not-a-name"),
    pytest.param({"wandb": True}, "report_to must be a list of trackers", id="a-table"),
])
def test_report_to_refuses_unknown_trackers_naming_the_choices(given, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(report_to=given)


def test_a_missing_tracker_library_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError) as refused:
        check_trackers(("tensorboard", "wandb"), tmp_path, modules={"tensorboard": "tensorboard",
                                                                   "wandb": "packfeed_no_such_module"})
    assert str(refused.value) == ("[train] report_to = [\"tensorboard\", \"wandb\"]: wandb is not installed "
                                  "(pip install 'packfeed[track]')")
    check_trackers(("tensorboard", "mlflow", "wandb"), tmp_path)  # the dev set-up has all three
    check_trackers((), "s3://bucket/run", environ={})


@pytest.mark.parametrize("names,environ,refused", [
    pytest.param(("tensorboard",), {"MLFLOW_TRACKING_URI": "http://x", "WANDB_DIR": "/tmp"}, "tensorboard writes "
                 "local files, and --output s3://bucket/run is remote: use a local --output or leave it out",
                 id="tensorboard-never"),
    pytest.param(("mlflow",), {}, "mlflow writes local files, and --output s3://bucket/run is remote: set "
                 "MLFLOW_TRACKING_URI", id="mlflow-without-a-tracking-uri"),
    pytest.param(("mlflow",), {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}, None, id="mlflow-with-one"),
    pytest.param(("wandb",), {"WANDB_MODE": "online"}, "wandb writes local files, and --output s3://bucket/run is "
                 "remote: set WANDB_DIR", id="wandb-without-a-local-dir"),
    pytest.param(("mlflow", "wandb"), {"MLFLOW_TRACKING_URI": "http://x", "WANDB_DIR": "/tmp/wandb"}, None,
                 id="both-with-their-places"),
])
def test_a_remote_output_needs_a_place_for_each_tracker_s_files(names, environ, refused):
    if refused is None:
        check_trackers(names, "s3://bucket/run", environ=environ)
        return
    with pytest.raises(ValueError) as error:
        check_trackers(names, "s3://bucket/run", environ=environ)
    assert str(error.value) == f"[train] report_to = {json.dumps(list(names))}: {refused}"


def test_config_params_and_run_name():
    run = {"train": {"lr": 0.001, "betas": [0.9, 0.95], "mixture_hook": None, "report_to": []},
           "model": {"name": "tiny-llama", "overrides": {}}}
    assert config_params(run) == {"train.lr": "0.001", "train.betas": "[0.9, 0.95]", "train.mixture_hook": "null",
                                  "train.report_to": "[]", "model.name": "tiny-llama", "model.overrides": "{}"}
    assert (run_name("/runs/demo"), run_name("s3://b/runs/demo/"), run_name("demo")) == ("demo", "demo", "demo")


def test_no_tracker_opens_nothing_and_writes_nothing(tmp_path):
    trackers = open_trackers((), output=tmp_path, start=0, config={})
    with trackers:
        trackers.log({**BASE})
    trackers.finish(str(tmp_path / "final"), {"steps": 20})
    assert list(tmp_path.iterdir()) == []
    assert isinstance(Trackers(), Trackers)


def _mlflow_client(uri: str, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 opens a file store only with it
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _scalars(directory, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def test_a_stopped_run_resumed_continues_the_same_tracker_runs(tmp_path, monkeypatch):
    """Steps 1-4 logged, the run stopped with its checkpoint at step 2 (steps 3 and 4 are
    trained again), resumed to step 6: one MLflow run (RUNNING again, then FINISHED with the
    final model's tag), TensorBoard's steps 3 and 4 those of the resumed run."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    config = {"train": {"lr": 0.001}}
    output, names = tmp_path / "demo", ("tensorboard", "mlflow")
    output.mkdir()
    first = open_trackers(names, output=output, start=0, config=config)
    for step in (1, 2, 3, 4):
        first.log({"step": step, "loss": 10.0 + step})
    first.finish(None, {"steps": 4})
    ids = json.loads((output / RunDir.TRACKERS).read_text())

    resumed = open_trackers(names, output=output, start=2, config={"train": {"lr": 0.5}})
    assert json.loads((output / RunDir.TRACKERS).read_text()) == ids
    for step in (3, 4, 5, 6):
        resumed.log({"step": step, "loss": 20.0 + step})
    resumed.finish(str(output / "final"), {"steps": 6, "last_loss": 26.0})

    assert _scalars(output / RunDir.TENSORBOARD, "train/loss") == {1: 11.0, 2: 12.0, 3: 23.0, 4: 24.0, 5: 25.0,
                                                                   6: 26.0}
    client = _mlflow_client(ids["mlflow"]["tracking_uri"], monkeypatch)
    assert ids["mlflow"]["tracking_uri"] == (output / RunDir.MLRUNS).resolve().as_uri()
    run = client.get_run(ids["mlflow"]["run_id"])
    assert (run.info.run_name, run.info.status) == ("demo", "FINISHED")
    assert run.data.params == {"train.lr": "0.001"}, "a resumed tracker run keeps the config it started with"
    assert run.data.tags["final_model"] == str(output / "final")
    assert run.data.metrics["summary/last_loss"] == 26.0
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(history) == sorted([(s, 10.0 + s) for s in (1, 2, 3, 4)] + [(s, 20.0 + s) for s in (3, 4, 5, 6)]), \
        "MLflow keeps both values of a step trained again"
    assert client.get_experiment(run.info.experiment_id).name == "packfeed"


class _Recorder:
    """A tracker that keeps what it is given; ``broken``: its ``log`` raises (a server away)."""

    NAME = "recorder"

    def __init__(self, broken: bool = False) -> None:
        self.resumed, self.broken, self.calls = False, broken, []

    def log(self, step, values):
        if self.broken:
            raise ConnectionError("server away")
        self.calls.append(("log", step, dict(values)))

    def log_config(self, run):
        self.calls.append(("config", run))

    def finish(self, final_model, figures):
        self.calls.append(("finish", final_model, dict(figures)))

    def fail(self):
        self.calls.append(("fail",))


def test_a_tracker_that_fails_a_record_warns_and_training_goes_on(caplog):
    broken, kept = _Recorder(broken=True), _Recorder()
    trackers = Trackers([broken, kept])
    with trackers:
        trackers.log({"step": 3, "loss": 1.5, "lr": None})
    trackers.finish(None, {"steps": 3, "last_loss": 1.5, "memory": {"ranks": []}})
    assert "recorder: the record of step 3 was not logged: server away" in caplog.text
    assert kept.calls == [("log", 3, {"train/loss": 1.5}), ("finish", None, {"summary/steps": 3.0,
                                                                             "summary/last_loss": 1.5})]
    assert ("fail",) not in broken.calls, "a run that ends normally is not failed"


def test_a_raise_in_the_loop_closes_the_trackers_as_failed():
    tracker = _Recorder()
    with pytest.raises(RuntimeError, match="rank died"):
        with Trackers([tracker]):
            raise RuntimeError("rank died")
    assert tracker.calls == [("fail",)]
