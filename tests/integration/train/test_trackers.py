"""``[train] report_to = ["tensorboard", "mlflow", "wandb"]`` end to end, offline.

One real `packfeed train` process (tests/support/train.py: its own embedded Ray, 2 DDP workers,
tiny Llama, seq_len 256, a metrics record every step) of a few steps, with all three trackers
and nothing that reaches the network (W&B offline, MLflow's file store under the output, no
telemetry). Each tracker is read back with its own reader and holds what metrics.jsonl holds:

* TensorBoard (``EventAccumulator``): ``train/loss`` at every logged step, equal to the record's
  loss (float32), ``eval/loss`` at the evaluated steps (``[eval]`` every 2 steps), the loss per
  source, and the same metric names as MLflow and W&B;
* MLflow (``MlflowClient.get_metric_history``): the same losses; the config as parameters; the
  final model's path as a tag; the run named after the output and FINISHED;
* W&B (its ``run-<id>.wandb`` file, read with wandb's own record messages,
  tests/support/wandb_records.py): every record's step and figures, the final model's path in
  the summary, the config, exit code 0; the run id the one in trackers.json;
* no process of the run (Ray's, W&B's service) outlives it.

And a run naming a tracker that cannot be imported (wandb blocked by a ``sitecustomize`` on the
run's PYTHONPATH, as when it is not installed) is refused in one line before Ray starts.
"""

from __future__ import annotations

import json
import os

import psutil
import pytest
from support.train import Train, corpus_head, run_config_text
from support.wandb_records import wandb_run

from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.cli import main
from packfeed.trainer.loop.interval import read_jsonl
from packfeed.trainer.loop.trackers import metric_values
from packfeed.trainer.state.run_dir import RunDir

pytestmark = pytest.mark.integration

STEPS = 4
TRACKERS = ["tensorboard", "mlflow", "wandb"]
MARK = "PACKFEED_TRACKERS_TEST"  # in every process of the run: none may be left after it
OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_CODE": "true",
           "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "MLFLOW_ALLOW_FILE_STORE": "true"}
UNSET = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_DIR",
         "WANDB_BASE_URL")


def with_trackers(root, names: list[str], *, evaluated: bool = False):
    """A run config of ``STEPS`` steps under ``root`` with ``report_to = names``; ``evaluated``:
    with an ``[eval]`` every 2 steps on a packed eval set of the same files (its first 4 rows)."""
    inputs = corpus_head(root / "corpus", 40)
    text = run_config_text(inputs, steps=STEPS)
    if evaluated:
        eval_dir = root / "eval_rows"
        assert main(["pack", *inputs, "--tokenizer", demo_tokenizer_path(), "--seq-len", "256",
                     "--output", str(eval_dir)]) == 0
        text += f"\n[eval]\npacked = {json.dumps(str(eval_dir))}\nevery_steps = 2\nmax_rows = 4\n"
    config = root / "run.toml"
    config.write_text(text.replace("[train]\n", f"[train]\nreport_to = {json.dumps(names)}\n", 1))
    return config


def marked(mark: str) -> list[str]:
    """The processes of this user whose environment holds ``MARK=mark``."""
    found = []
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            if proc.environ().get(MARK) == mark:
                found.append(f"{proc.info['pid']} {proc.info['name']}")
        except (psutil.Error, OSError):
            pass
    return found


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """(output, the run's output text, its records) of one run with all three trackers."""
    root = tmp_path_factory.mktemp("trackers")
    config, output = with_trackers(root, TRACKERS, evaluated=True), root / "demo"
    with pytest.MonkeyPatch.context() as env:
        for name in UNSET:
            env.delenv(name, raising=False)
        for name, value in {**OFFLINE, MARK: str(root)}.items():
            env.setenv(name, value)
        run = Train(config, output)
        code, out = run.ended(timeout=300)
        left = run.left()
    assert code == 0, out[-3000:]
    assert not left and not marked(str(root)), f"processes left after the run: {left or marked(str(root))}"
    records = read_jsonl(output / RunDir.METRICS)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    return output, out, records


def test_tensorboard_holds_every_record_s_loss(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    output, out, records = tracked
    events = EventAccumulator(str(output / RunDir.TENSORBOARD))
    events.Reload()
    losses = {e.step: e.value for e in events.Scalars("train/loss")}
    assert losses == {r["step"]: pytest.approx(r["loss"], rel=1e-6) for r in records}
    assert set(events.Tags()["scalars"]) == set(metric_values(records[-1]))
    assert {"train/loss", "train/lr", "train/grad_norm", "train/peak_memory_gib"} <= set(events.Tags()["scalars"])
    # the held-out loss ([eval] every 2 steps) and the loss per source, under their stable names
    evaluated = {r["step"]: r["eval"] for r in records if "eval" in r}
    assert sorted(evaluated) == [2, 4]
    assert {e.step: e.value for e in events.Scalars("eval/loss")} == \
        {step: pytest.approx(e["loss"], rel=1e-6) for step, e in evaluated.items()}
    [source] = records[-1]["source_loss"]
    assert {e.step: e.value for e in events.Scalars(f"train/source_loss/{source}")} == \
        {r["step"]: pytest.approx(r["source_loss"][source], rel=1e-6) for r in records}
    assert f"eval/source_loss/{source}" in events.Tags()["scalars"]
    assert "trackers: tensorboard" in out


def test_mlflow_holds_the_losses_the_config_and_the_final_model(tracked):
    from mlflow import MlflowClient

    output, _, records = tracked
    ids = json.loads((output / RunDir.TRACKERS).read_text())["mlflow"]
    assert ids["tracking_uri"] == (output / RunDir.MLRUNS).resolve().as_uri()
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only with it
    client = MlflowClient(tracking_uri=ids["tracking_uri"])
    history = client.get_metric_history(ids["run_id"], "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(r["step"], pytest.approx(r["loss"])) for r in records]
    run = client.get_run(ids["run_id"])
    assert (run.info.run_name, run.info.status) == ("demo", "FINISHED")
    assert client.get_experiment(run.info.experiment_id).name == "packfeed"
    params = run.data.params
    assert (params["model.name"], params["train.max_steps"], params["train.report_to"]) == \
        ("tiny-llama", str(STEPS), json.dumps(TRACKERS))
    assert run.data.tags["final_model"] == str(output / RunDir.FINAL) and (output / RunDir.FINAL).is_dir()
    assert set(metric_values(records[-1])) <= set(run.data.metrics)
    assert sorted((m.step, m.value) for m in client.get_metric_history(ids["run_id"], "eval/loss")) == \
        [(r["step"], pytest.approx(r["eval"]["loss"])) for r in records if "eval" in r]
    assert run.data.metrics["summary/steps"] == STEPS


def test_wandb_offline_run_holds_every_record(tracked):
    output, _, records = tracked
    run_id = json.loads((output / RunDir.TRACKERS).read_text())["wandb"]["id"]
    [files] = (output / RunDir.WANDB).glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    run = wandb_run(files)
    assert sorted(run["history"]) == [r["step"] for r in records]
    for record in records:
        logged = run["history"][record["step"]]
        assert {k: logged[k] for k in metric_values(record)} == pytest.approx(metric_values(record))
    assert run["summary"]["final_model"] == str(output / RunDir.FINAL)
    assert run["summary"]["summary/steps"] == STEPS
    assert "train" in run["config"] and run["exit_code"] == 0


def test_a_tracker_that_is_not_installed_is_refused_before_training(tmp_path, monkeypatch):
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "sitecustomize.py").write_text("import sys\nsys.modules['wandb'] = None  # import wandb fails\n")
    monkeypatch.setenv("PYTHONPATH", str(blocked))
    output = tmp_path / "run"
    code, out = Train(with_trackers(tmp_path, ["tensorboard", "wandb"]), output).ended(timeout=120)
    assert code == 2, out[-2000:]
    assert out.strip().splitlines()[-1] == ("packfeed train: error: [train] report_to = [\"tensorboard\", \"wandb\"]: "
                                            "wandb is not installed (pip install 'packfeed[track]')")
    assert "Ray:" not in out and not (output / RunDir.METRICS).exists(), "refused before Ray and training"
