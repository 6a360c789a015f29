"""`packfeed train` stopped by a signal: SIGTERM, Ctrl-C (SIGINT) and `ray job stop`.

Real `packfeed train` processes on a small corpus (tiny Llama, 2 DDP workers, seq_len 256,
4 rows per step, a metrics record every step), each with its own embedded Ray in its own process
group, except the one `ray job submit` runs on a deploy/local cluster. Checked:

* SIGTERM mid-run: exit 143; both ranks stop after the same step, which is checkpointed (the
  only checkpoint: ``checkpoint_every = 0``); the driver says where it stopped and how to go on;
  no final/; none of its processes (its embedded Ray's included) left. ``--resume`` trains the
  rest, step by step on the rows an uninterrupted run trains (the serve contract: step s, rank
  k of 2 gets rows 4(s-1) + k + 2j), each step once, and writes a complete final/. ``--resume``
  again says the run is finished and changes nothing, without starting Ray.
* Ctrl-C twice (SIGINT to the process group, as a terminal sends it): the first starts the
  orderly stop, the second ends the run at once; exit 130, no traceback, nothing left running.
* `ray job stop`: the job ends STOPPED after the driver's orderly stop (the head's
  RAY_JOB_STOP_WAIT_TIME_S, 60 s from deploy/local/env.sh, leaves it the time), with a
  resumable checkpoint at the stop step.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from serve_support import GroupWatch, kill_groups
from test_local_cluster import LOCAL, REPO, cluster_env  # noqa: F401  (a deploy/local cluster: the fixture)

from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.raycluster import Terminated
from packfeed.trainer.checkpoint import latest_checkpoint, read_state
from packfeed.trainer.metrics import read_jsonl
from packfeed.trainer.stopping import StopSignals

pytestmark = pytest.mark.integration

STEPS, WORKERS, ROWS_PER_RANK = 50, 2, 2  # 4 rows a step; the corpus below holds ~57 steps of rows
SIGNAL_AT = 2  # the step a run has reached when the signal is sent: mid-run, far from STEPS
PACKFEED = str(REPO / ".venv" / "bin" / "packfeed")
STOPPED = re.compile(r"stopped at step (\d+) of (\d+) \((SIG\w+)\): checkpoint (\S+); continue with "
                     r"`packfeed train \.\.\. --resume`")


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    """A run config on the first 100 lines of each bundled file, 3 epochs (~229 rows of 256)."""
    root = tmp_path_factory.mktemp("signals")
    inputs = []
    for source in demo_corpus_paths():
        path = root / os.path.basename(source)
        with open(source) as f:
            path.write_text("".join(itertools.islice(f, 100)))
        inputs.append(str(path))
    path = root / "run.toml"
    path.write_text(f"""
[data]
inputs = {json.dumps(inputs)}
tokenizer = {json.dumps(demo_tokenizer_path())}
seq_len = 256
window_samples = 64
epochs = 3

[model]
name = "tiny-llama"
attn = "sdpa"

[train]
max_steps = {STEPS}
micro_batch_rows = {ROWS_PER_RANK}
grad_accum = 1
log_every = 1
checkpoint_every = 0
lr = 3e-3
warmup_steps = 2
record_rows = true

[scaling]
num_workers = {WORKERS}
cpus_per_worker = 0.5
packing_workers = 1
packing_cpus_per_worker = 0.5
""")
    return path


class Train:
    """`packfeed train` in its own process group with its own embedded Ray, its output in ``log``
    and every process group of its tree watched (``left()``: what still runs after it ended)."""

    def __init__(self, config: Path, output: Path, *flags: str) -> None:
        self.log = output.with_name(output.name + f"-{time.monotonic_ns()}.log")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [PACKFEED, "train", "--config", str(config), "--output", str(output), *flags], stdout=out,
                stderr=subprocess.STDOUT, env={**os.environ, "RAY_ADDRESS": ""}, cwd=REPO, start_new_session=True)
        self.watch = GroupWatch(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        return re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text(errors="replace"))  # Ray colours worker lines

    def ended(self, timeout: float = 300) -> tuple[int, str]:
        """(exit status, output) once it ends; its processes are killed if it does not."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_groups(self.watch.groups)
            raise AssertionError(f"packfeed train did not end in {timeout:.0f} s:\n{self.text()[-3000:]}") from None
        out = self.text()
        assert "Traceback" not in out, out[-4000:]
        return self.proc.returncode, out

    def left(self) -> list[str]:
        """The run's processes still alive 30 s after it ended (killed, so none outlives the test)."""
        left = self.watch.left(timeout=30)
        kill_groups(self.watch.groups)
        return left


def wait_for_step(output: Path, step: int, alive, timeout: float = 300) -> int:
    """Wait until the run's metrics reach ``step``; returns the step reached."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = read_jsonl(output / "metrics.jsonl") if (output / "metrics.jsonl").exists() else []
        if records and records[-1]["step"] >= step:
            return records[-1]["step"]
        assert alive(), "the run ended before it reached the step to signal at"
        time.sleep(0.05)
    raise AssertionError(f"the run did not reach step {step} in {timeout:.0f} s")


def wait_for_line(run: Train, pattern: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.alive():
        if re.search(pattern, run.text()):
            return
        time.sleep(0.05)
    raise AssertionError(f"no line {pattern!r}:\n{run.text()[-3000:]}")


def last_packfeed_line(out: str) -> str:
    """The driver's last own line (Ray forwards the workers' lines late, after it at times)."""
    return [line for line in out.splitlines() if line.startswith("packfeed train:")][-1]


def trained(output: Path) -> list[tuple[int, int, list[int]]]:
    """(step, rank, global row indices) of every step every rank trained, in file order."""
    return [(r["step"], r["rank"], r["row_index"]) for path in sorted((output / "rows").glob("rank*.jsonl"))
            for r in read_jsonl(path)]


def steps_of_every_rank(last: int) -> list[tuple[int, int]]:
    return [(s, r) for s in range(1, last + 1) for r in range(WORKERS)]


def contract_rows(step: int, rank: int) -> list[int]:
    """The rows an uninterrupted run trains: rank k of N gets the step's rows k mod N."""
    per_step = WORKERS * ROWS_PER_RANK
    return [per_step * (step - 1) + rank + WORKERS * j for j in range(ROWS_PER_RANK)]


def assert_stopped_at_checkpoint(output: Path, out: str, signal_name: str, signalled_at: int) -> int:
    """The driver's line names the checkpoint of the step every rank stopped after; returns it."""
    match = STOPPED.search(out)
    assert match, out[-3000:]
    step, last, name, checkpoint = int(match[1]), int(match[2]), match[3], Path(match[4])
    assert (name, last) == (signal_name, STEPS)
    assert signalled_at <= step < STEPS, "the signal came mid-run and the run stopped soon after it"
    assert latest_checkpoint(output) == checkpoint and read_state(checkpoint)["step"] == step
    assert {p.name for p in checkpoint.iterdir()} >= {"model", "optimizer.pt", "scheduler.pt", "trainer_state.json"}
    assert sorted((s, r) for s, r, _ in trained(output)) == steps_of_every_rank(step), \
        "every rank trained the same steps, each once, and stopped after the checkpointed one"
    assert not (output / "final").exists(), "a stopped run writes no final model"
    return step


def test_sigterm_stops_at_a_checkpoint_and_resume_finishes_on_the_same_rows(config, tmp_path):
    output = tmp_path / "run"
    run = Train(config, output)
    signalled_at = wait_for_step(output, SIGNAL_AT, run.alive)
    os.kill(run.proc.pid, signal.SIGTERM)
    code, out = run.ended()
    assert code == 143, out[-3000:]
    assert last_packfeed_line(out) == "packfeed train: stopped by SIGTERM", out[-2000:]
    stop = assert_stopped_at_checkpoint(output, out, "SIGTERM", signalled_at)
    summary = json.loads((output / "summary.json").read_text())
    assert summary["stopped"]["step"] == stop and summary["steps"] == stop and "final_model" not in summary
    assert not run.left(), "no process of the run (its embedded Ray included) is left"

    code, out = Train(config, output, "--resume").ended()
    assert code == 0, out[-3000:]
    assert f"at step {stop}," in out
    rows = trained(output)
    assert sorted((s, r) for s, r, _ in rows) == steps_of_every_rank(STEPS), \
        "each step of each rank trained once over the stopped and the resumed run"
    assert all(indices == contract_rows(s, r) for s, r, indices in rows), "the rows of an uninterrupted run"
    assert json.loads((output / "final" / "packfeed_state.json").read_text()) == {"step": STEPS}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= \
        {p.name for p in (output / "final").iterdir()}
    assert not list(output.glob(".final*")), "nothing is left of the final model's writing"
    summary = json.loads((output / "summary.json").read_text())
    assert summary["steps"] == STEPS and "stopped" not in summary

    before = {p: p.read_bytes() for p in (output / "summary.json", output / "metrics.jsonl")}
    names = sorted(str(p.relative_to(output)) for p in output.rglob("*"))
    code, out = Train(config, output, "--resume").ended(timeout=120)
    assert code == 0, out[-3000:]
    assert f"is finished, nothing to do: it trained step {STEPS} of {STEPS}" in out, out[-2000:]
    assert "Ray:" not in out, "a finished run starts no Ray"
    assert {p: p.read_bytes() for p in before} == before, "summary.json and metrics.jsonl untouched"
    assert sorted(str(p.relative_to(output)) for p in output.rglob("*")) == names


def test_ctrl_c_twice_ends_the_run_at_once_without_a_traceback(config, tmp_path):
    output = tmp_path / "run"
    run = Train(config, output)
    wait_for_step(output, SIGNAL_AT, run.alive)
    os.killpg(run.proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    wait_for_line(run, r"SIGINT: stopping after step \d+")
    os.killpg(run.proc.pid, signal.SIGINT)
    code, out = run.ended(timeout=120)
    assert code == 130, out[-3000:]
    assert "SIGINT again: stopping now" in out and last_packfeed_line(out) == "packfeed train: interrupted", out[-2000:]
    assert not STOPPED.search(out), "the second signal cut the orderly stop short"
    assert not (output / "final").exists()
    assert not run.left(), "no process of the run (its embedded Ray included) is left"


def test_ray_job_stop_ends_the_job_stopped_at_a_resumable_checkpoint(cluster_env, config, tmp_path):  # noqa: F811
    output, job_id = tmp_path / "job", f"packfeed-train-{os.getpid()}-{time.monotonic_ns()}"
    env = {**cluster_env, "PACKFEED_NO_WAIT": "1", "PACKFEED_JOB_ID": job_id}
    submit = subprocess.run(["bash", str(LOCAL / "submit.sh"), "--config", str(config), "--output", str(output)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert submit.returncode == 0, (submit.stdout + submit.stderr)[-3000:]
    ray_cli = [str(REPO / ".venv" / "bin" / "ray"), "job"]
    address = ["--address", f"http://127.0.0.1:{cluster_env['PACKFEED_DASHBOARD_PORT']}"]

    def job(*args: str) -> str:
        done = subprocess.run([*ray_cli, *args, *address, job_id], env=cluster_env, capture_output=True, text=True,
                              timeout=180)
        return re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)

    checked = [time.monotonic()]

    def running() -> bool:  # `ray job status` costs a CPU second: asked every 10 s
        if time.monotonic() - checked[0] < 10:
            return True
        checked[0] = time.monotonic()
        return not re.search(r"' (succeeded|failed|was stopped)", job("status"))  # the CLI's words for the ends

    try:
        signalled_at = wait_for_step(output, SIGNAL_AT, running)
        started = time.monotonic()
        job("stop")  # waits until the job has ended
        stopped_in = time.monotonic() - started
    finally:
        job("stop", "--no-wait")  # a test that failed leaves no job running
    assert f"Job '{job_id}' was stopped" in job("status"), "the job's status is STOPPED"
    logs = job("logs")
    assert "packfeed train: stopped by SIGTERM" in logs and "Traceback" not in logs, logs[-4000:]
    assert stopped_in < 50, f"the driver stopped by itself, before Ray's SIGKILL (60 s): {stopped_in:.0f} s"
    assert_stopped_at_checkpoint(output, logs, "SIGTERM", signalled_at)


def test_a_signal_before_ray_ends_at_once_and_one_inside_ray_is_acted_on_later():
    """Before Ray starts the handler raises (the CLI's exit status comes from the exception);
    from ``defer()`` on the main thread may be inside ray.get, where an exception raised by a
    handler turns into a SystemError: the signal is recorded and ``check()`` raises it."""
    previous = signal.getsignal(signal.SIGINT)
    with pytest.raises(Terminated):
        with StopSignals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode: never reached
    with StopSignals() as signals:
        signals.defer()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        assert signals.requested and not signals.urgent and signals.name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            signals.check()
    assert signal.getsignal(signal.SIGINT) is previous, "the previous handler is back"
