"""`packfeed train --launcher torchrun`: the trainer under torchrun, without Ray.

Real processes: a `packfeed pack` of the bundled corpus's first lines (packed by the driver,
no Ray), then `torchrun --standalone --nproc-per-node 2 --no-python packfeed train ...
--launcher torchrun` (2 CPU ranks, gloo) against `packfeed train` under Ray Train on the same
config and packed directory. Checked:

* from the packed directory and from `packfeed serve` of it (a config that names no inputs:
  the server has them), the torchrun run trains the Ray
  run's rows and losses, step by step (1e-5 relative), and its final weights; no Ray process
  is started by the torchrun job; both train the directory's rows as they are (rank k of step
  s gets the step's rows k mod 2); both evaluate (``[eval]``: the directory's first 5 rows,
  every 4 steps) to the same eval losses, per source too;
* SIGTERM to the job's process group (what `scancel` and Kubernetes do): every rank stops after
  the same step with a checkpoint, the job exits, none of its processes is left a minute
  later; `--resume` under torchrun reaches the end with the uninterrupted run's losses;
* a config that needs Ray (raw inputs to pack) is refused in one line before training.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from support.compare import assert_same_training, final_weights, trained_rows
from support.serve import REPO, GroupWatch, ServerProcess, kill_groups
from support.train import PACKFEED, Train, corpus_head, run_config_text, wait_for_step

from packfeed.service.assets import demo_tokenizer_path
from packfeed.trainer.loop.interval import read_jsonl
from packfeed.trainer.state.checkpoint import latest_checkpoint, read_state

pytestmark = pytest.mark.integration

STEPS = 8
EVAL_ROWS = 5  # not a multiple of an eval step's 4 rows: a row past it, and padding rows
TORCHRUN = str(REPO / ".venv" / "bin" / "torchrun")


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("torchrun-data")
    inputs = corpus_head(root / "corpus", 100)
    out = root / "packed"
    proc = subprocess.run([PACKFEED, "pack", *inputs, "--tokenizer", demo_tokenizer_path(), "--seq-len", "256",
                           "--window-samples", "64", "--output", str(out)], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "RAY_ADDRESS": ""}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


def write_config(root: Path, inputs: list[str], eval_rows: str | None = None) -> Path:
    """The run's config; ``eval_rows``: a packed directory evaluated every 4 steps on its first
    ``EVAL_ROWS`` rows (both launchers must log the same eval losses)."""
    path = root / "run.toml"
    evaluated = f"\n[eval]\npacked = {json.dumps(eval_rows)}\nevery_steps = 4\nmax_rows = {EVAL_ROWS}\n" if eval_rows else ""
    path.write_text(run_config_text(inputs, steps=STEPS, window_samples=None, packing=False) + evaluated)
    return path


@pytest.fixture(scope="module")
def config(packed, tmp_path_factory) -> Path:
    return write_config(tmp_path_factory.mktemp("torchrun-config"), [str(packed)], eval_rows=str(packed))


class Torchrun:
    """`torchrun --standalone --nproc-per-node 2 --no-python packfeed train ...` in its own
    process group; every process of its tree watched."""

    def __init__(self, config: Path, output: Path, *flags: str, restarts: int = 0, env: dict | None = None) -> None:
        self.log = output.with_name(output.name + f"-{time.monotonic_ns()}.log")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", str(restarts), "--no-python",
                 PACKFEED, "train", "--config", str(config), "--output", str(output), "--launcher", "torchrun", *flags],
                stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                env={**os.environ, "RAY_ADDRESS": "", "OMP_NUM_THREADS": "1", **(env or {})})
        self.watch = GroupWatch(self.proc.pid)
        self.names: set[str] = set()  # every process name seen in its tree

    def alive(self) -> bool:
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.names.add(child.name())
        except psutil.NoSuchProcess:
            pass
        return self.proc.poll() is None

    def ended(self, timeout: float = 300) -> tuple[int, str]:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                kill_groups(self.watch.groups)
                raise AssertionError(f"torchrun did not end in {timeout:.0f} s:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        return self.proc.returncode, self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def ray_run(config, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("ray") / "run"
    code, out = Train(config, output).ended()
    assert code == 0, out[-3000:]
    output.with_suffix(".log").write_text(out)
    return output


def summary_labels(out: str) -> list[str]:
    """The labels of the closing summary's lines (interval.py ``format_summary``), in order."""
    block = out[out.index("\nsteps  "):].splitlines()[1:]
    return [line.split("  ")[0] for line in block[:block.index(next(x for x in block if x.startswith("final model")))+1]]


def test_torchrun_from_a_packed_directory_trains_what_ray_train_trains(config, packed, ray_run, tmp_path):
    output = tmp_path / "run"
    run = Torchrun(config, output)
    code, out = run.ended()
    assert code == 0, out[-3000:]
    assert_same_training(ray_run, output, steps=STEPS, rel=1e-5, rows=True)
    a, b = final_weights(ray_run), final_weights(output)
    assert all(float((a[k] - b[k]).abs().max()) < 1e-5 for k in a)
    # Ray Train from the packed directory: its rows as they are, rank k of step s the step's rows k mod 2
    assert json.loads((ray_run / "summary.json").read_text())["stream_rows"] == \
        json.loads((packed / ".packfeed" / "stats.json").read_text())["rows"]
    assert trained_rows(ray_run) == {(s, k): [4 * (s - 1) + k + 2 * j for j in range(2)]
                                     for s in range(1, STEPS + 1) for k in range(2)}
    assert (output / "final" / "tokenizer.json").exists()
    assert not {"raylet", "gcs_server"} & run.names, f"the torchrun job started Ray: {sorted(run.names)}"
    summary = json.loads((output / "summary.json").read_text())
    ray_summary = json.loads((ray_run / "summary.json").read_text())
    assert (summary["launcher"], ray_summary["launcher"]) == ("torchrun", "ray")
    # one end of a run for both launchers (launch/finish.py): the same keys, the same lines printed
    assert sorted(summary) == sorted(ray_summary)
    for run_dir in (ray_run, output):  # every step's gradient norm reaches the records, as the same figure
        norms = [r["grad_norm"] for r in read_jsonl(run_dir / "metrics.jsonl")]
        assert len(norms) == STEPS and all(n is not None and n > 0 for n in norms), norms
    assert [r["grad_norm"] for r in read_jsonl(output / "metrics.jsonl")] == pytest.approx(
        [r["grad_norm"] for r in read_jsonl(ray_run / "metrics.jsonl")], rel=1e-4)
    assert summary["stream_rows"] == ray_summary["stream_rows"] and summary["final_step"] == STEPS
    # [eval]: the same eval losses, per source too, at steps 4 and 8 (eval rows read by every rank itself)
    evaluated = [{r["step"]: r["eval"] for r in read_jsonl(d / "metrics.jsonl") if "eval" in r} for d in (ray_run, output)]
    assert sorted(evaluated[0]) == sorted(evaluated[1]) == [4, 8]
    for step, ray_eval in evaluated[0].items():
        assert evaluated[1][step]["tokens"] == ray_eval["tokens"] > 0
        assert evaluated[1][step]["loss"] == pytest.approx(ray_eval["loss"], rel=1e-5)
        assert evaluated[1][step]["source_loss"] == pytest.approx(ray_eval["source_loss"], rel=1e-5)
    assert summary_labels(out) == summary_labels(ray_run.with_suffix(".log").read_text())
    training = re.compile(r"^training \S+ on .+, 4 rows of 256 per step, steps 0->8 -> ", re.M)
    assert training.search(out) and training.search(ray_run.with_suffix(".log").read_text())
    # both launchers report the packed directory's own packing (it used to read "0.0% (0 rows packed)")
    packed_stats = json.loads((packed / ".packfeed" / "stats.json").read_text())
    for run_summary in (summary, json.loads((ray_run / "summary.json").read_text())):
        assert run_summary["packing"]["from"] == "packed output"
        assert (run_summary["packing"]["rows"], run_summary["packing"]["efficiency"]) == \
            (packed_stats["rows"], packed_stats["efficiency"]) and packed_stats["rows"] > 0


def test_torchrun_from_a_server_trains_what_ray_train_trains(config, packed, ray_run, tmp_path):
    # [data] names no inputs: the rows come from the server (only the tokenizer and seq_len are needed)
    text = config.read_text()
    no_inputs = tmp_path / "run.toml"
    no_inputs.write_text("\n".join(line for line in text.splitlines() if not line.startswith("inputs = ")))
    assert "inputs" not in no_inputs.read_text()
    with ServerProcess([str(packed)], log=tmp_path / "serve.log", state_dir=tmp_path / "state") as server:
        output = tmp_path / "run"
        code, out = Torchrun(no_inputs, output, "--server", server.target).ended()
        assert code == 0, out[-3000:]
    assert_same_training(ray_run, output, steps=STEPS, rel=1e-5, rows=True)
    sources = read_state(latest_checkpoint(output))["config"]["data"]["sources"]
    assert [s["paths"] for s in sources] == [[f"packfeed-serve://{server.target}"]], "where the rows came from"


def test_sigterm_stops_every_rank_at_a_checkpoint_and_resume_finishes(config, ray_run, tmp_path):
    output = tmp_path / "run"
    run = Torchrun(config, output)
    wait_for_step(output, 2, run.alive)
    os.killpg(run.proc.pid, signal.SIGTERM)
    code, out = run.ended(timeout=120)
    assert code != 0, "a stopped job does not say it finished"
    checkpoint = Path(latest_checkpoint(output))
    stop = int(read_state(checkpoint)["step"])
    assert 2 <= stop < STEPS and checkpoint.parent.name == "checkpoints"
    assert sorted(trained_rows(output)) == [(s, r) for s in range(1, stop + 1) for r in range(2)], \
        "both ranks trained the same steps and stopped after the checkpointed one"
    assert not (output / "final").exists()
    assert not run.watch.left(timeout=60), "no process of the job is left"

    code, out = Torchrun(config, output, "--resume").ended()
    assert code == 0, out[-3000:]
    assert f"at step {stop}," in out
    assert_same_training(ray_run, output, steps=STEPS, rel=1e-5, rows=True)


def test_sigterm_to_one_rank_alone_stops_every_rank_at_the_same_checkpoint(config, tmp_path):
    """A `kill` of one rank's process (not the job's group): rank 1 alone gets SIGTERM after step
    3; the ranks agree on the stop before the next step (the highest signal any rank got), all
    checkpoint step 3, rank 0 writes the summary marked stopped by SIGTERM and every rank exits
    143 without a traceback (torchrun's agent then prints its own for the failed job)."""
    output = tmp_path / "run"
    faults = {"PACKFEED_FAULTS": "train-step:3@1:stop"}
    code, out = Torchrun(config, output, env=faults).ended(timeout=180)
    assert code != 0 and not any(f"[rank{r}]: Traceback" in out for r in range(2)), out[-3000:]
    assert out.count("packfeed train: stopped by SIGTERM") == 2 and "(exitcode: 143)" in out, out[-3000:]
    assert int(read_state(latest_checkpoint(output))["step"]) == 3
    assert sorted(trained_rows(output)) == [(s, r) for s in range(1, 4) for r in range(2)]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["stopped"]["signal"] == "SIGTERM" and summary["stopped"]["step"] == 3


def test_a_rank_killed_mid_run_restarts_the_group_which_resumes_and_trains_what_ray_train_trains(config, ray_run,
                                                                                                 tmp_path):
    """torchrun ``--max-restarts 1``: rank 1 SIGKILLed after step 5 (a checkpoint every 2 steps),
    the agent restarts both ranks, the new group forms (on its own keys of torchrun's store: the
    previous attempt's addresses are dead) and resumes from step 4 by itself."""
    output = tmp_path / "run"
    faults = {"PACKFEED_FAULTS": "train-step:5@1:kill", "PACKFEED_FAULTS_DIR": str(tmp_path / "faults")}
    (tmp_path / "faults").mkdir()
    code, out = Torchrun(config, output, "--checkpoint-every", "2", restarts=1, env=faults).ended(timeout=240)
    assert code == 0, out[-3000:]
    assert "resuming from" in out and "at step 4, stream cursor 16" in out, out[-3000:]
    assert_same_training(ray_run, output, steps=STEPS, rel=1e-5, rows=True)


def test_data_that_needs_packing_is_refused_before_training(tmp_path):
    inputs = corpus_head(tmp_path / "corpus", 10)
    config = write_config(tmp_path, inputs)
    code, out = Torchrun(config, tmp_path / "run").ended(timeout=120)
    assert code != 0
    assert "packfeed train: error: --launcher torchrun trains on packed rows and does not start Ray to pack: pack " \
           "the data first" in out


def test_torchrun_with_balance_compute_trains_each_steps_rows_of_off(config, tmp_path):
    # [train] balance = "compute": each step the same 4 rows as "off" (rows 4(s-1) .. 4s-1), given
    # to the ranks by attention work (service/delivery/balance.py), so some rank trains another row
    balanced = tmp_path / "run.toml"
    balanced.write_text(config.read_text().replace("record_rows = true", 'record_rows = true\nbalance = "compute"'))
    output = tmp_path / "run"
    code, out = Torchrun(balanced, output).ended()
    assert code == 0, out[-3000:]
    rows = trained_rows(output)
    assert sorted(rows) == [(s, k) for s in range(1, STEPS + 1) for k in range(2)]
    for s in range(1, STEPS + 1):
        assert sorted(rows[(s, 0)] + rows[(s, 1)]) == list(range(4 * (s - 1), 4 * s)), f"step {s}"
    off = {(s, k): [4 * (s - 1) + k + 2 * j for j in range(2)] for s in range(1, STEPS + 1) for k in range(2)}
    assert rows != off, "no step's rows moved: the test would not see the balance"
