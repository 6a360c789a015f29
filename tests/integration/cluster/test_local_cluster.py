"""A real `ray start` cluster, started and stopped by the deploy/local scripts.

`packfeed pack --address` joins it instead of starting its own Ray; `packfeed pack` submitted
as a Ray job with relative inputs and --output reads and writes where it was submitted from,
and records those paths; a training run submitted with `ray job submit`
(deploy/local/submit.sh) and stopped by `ray job stop` ends STOPPED after the driver's own
orderly stop, at a resumable checkpoint (a resume from such a checkpoint, to a final model, is
tested in train/test_train_fsdp.py without a job around it);
`packfeed serve` submitted the same way streams every sample to a client; status.sh prints a
table; the dashboard listens on 127.0.0.1 only, the GCS on every interface; stop.sh leaves no
process of the cluster and no port listening, and status.sh then says at once that there is
no cluster. Token authentication (on by default in Ray 2.60) is on. Another Ray (the
session's embedded one) runs on this machine at the same time, as on a shared box.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support.ports import free_port
from support.serve import REPO
from support.train import (
    ROWS_PER_RANK,
    SIGNAL_AT,
    WORKERS,
    assert_stopped_at_checkpoint,
    contract_rows,
    trained,
    wait_for_step,
    write_config,
)

from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.trainer.state.checkpoint import read_state

pytestmark = pytest.mark.integration

LOCAL = REPO / "deploy" / "local"
STARTED: dict[str, str] = {}  # start.sh's output, kept by the fixture


@pytest.fixture(scope="module")
def cluster_env():
    # A short directory: Ray's unix socket paths must stay under ~107 characters.
    ray_dir = tempfile.mkdtemp(prefix="pf-ray-", dir="/tmp")
    env = {
        **os.environ,
        "PACKFEED_RAY_DIR": ray_dir,
        "PACKFEED_RAY_PORT": str(free_port()),
        "PACKFEED_DASHBOARD_PORT": str(free_port()),
        "PACKFEED_AGENT_PORT": str(free_port()),
        "PACKFEED_CLIENT_PORT": str(free_port()),
        "PACKFEED_NUM_CPUS": "2",
    }
    env.pop("RAY_ADDRESS", None)
    try:
        started = subprocess.run(["bash", str(LOCAL / "start.sh")], env=env, check=True, capture_output=True,
                                 text=True, timeout=180)
        STARTED["output"] = started.stdout + started.stderr
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN_PATH"] = f"{ray_dir}/auth_token"
        yield env
    finally:
        subprocess.run(["bash", str(LOCAL / "stop.sh")], env=env, capture_output=True, timeout=120)
        shutil.rmtree(ray_dir, ignore_errors=True)


def test_pack_joins_the_running_cluster(cluster_env, tmp_path):
    address = f"127.0.0.1:{cluster_env['PACKFEED_RAY_PORT']}"
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "packfeed"), "pack", *demo_corpus_paths(), "--tokenizer", demo_tokenizer_path(),
         "--seq-len", "512", "--output", str(tmp_path / "out"), "--address", address],
        env=cluster_env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"joined the cluster at {address}" in proc.stderr
    stats = json.loads((tmp_path / "out" / ".packfeed" / "stats.json").read_text())
    assert stats["samples_packed"] == stats["samples_read"] == 7500


def test_a_relative_output_of_a_job_lands_where_it_was_submitted(cluster_env, tmp_path):
    """Issues: `submit.sh pack ... --output runs/job-pack` wrote into Ray's copy of the working dir;
    relative inputs and tokenizer were read in that copy and recorded in .packfeed/config.json
    as paths into it (issue 24): they are the submitter's."""
    (tmp_path / "corpus").mkdir()
    for path in demo_corpus_paths():
        (tmp_path / "corpus" / Path(path).name).symlink_to(path)
    (tmp_path / "tok").symlink_to(demo_tokenizer_path())
    inputs = sorted(f"corpus/{Path(p).name}" for p in demo_corpus_paths())
    proc = subprocess.run(
        ["bash", str(LOCAL / "submit.sh"), "pack", *inputs, "--tokenizer", "tok", "--seq-len", "512",
         "--output", "runs/job-pack"],
        env=cluster_env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    meta = tmp_path / "runs" / "job-pack" / ".packfeed"
    stats = json.loads((meta / "stats.json").read_text())
    assert stats["samples_packed"] == 7500
    data = json.loads((meta / "config.json").read_text())["data"]
    assert [p for s in data["sources"] for p in s["paths"]] == [str(tmp_path / p) for p in inputs]
    assert data["tokenizer"] == str(tmp_path / "tok")
    assert "runtime_resources" not in (meta / "config.json").read_text(), "no path into Ray's copy"


def test_ray_job_stop_ends_the_job_stopped_at_a_checkpoint(cluster_env, tmp_path):
    """A train job (deploy/local/submit.sh) stopped mid-run by `ray job stop` (SIGTERM to the
    driver, SIGKILL RAY_JOB_STOP_WAIT_TIME_S later: 60 s here, from deploy/local/env.sh) ends
    STOPPED after the driver's orderly stop, at a resumable checkpoint: every rank trained the
    rows an uninterrupted run trains up to it."""
    config = write_config(tmp_path / "config")
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
    stop, checkpoint = assert_stopped_at_checkpoint(output, logs, "SIGTERM", signalled_at)
    assert {"model", "optimizer.pt"} <= {p.name for p in checkpoint.iterdir()}, "DDP's whole model and optimizer"

    rows = trained(output)
    assert all(indices == contract_rows(s, r) for s, r, indices in rows), "the rows of an uninterrupted run"
    assert read_state(checkpoint)["stream"]["cursor"] == stop * WORKERS * ROWS_PER_RANK, \
        "the checkpoint resumes after the rows of the step it stopped after"


def test_serve_runs_as_a_ray_job_and_streams_every_sample(cluster_env, tmp_path):
    from packfeed.client.stream import PackedStream

    port, job_id = free_port(), f"packfeed-serve-{free_port()}"
    env = {**cluster_env, "PACKFEED_NO_WAIT": "1", "PACKFEED_JOB_ID": job_id}
    proc = subprocess.run(
        ["bash", str(LOCAL / "submit.sh"), "serve", *demo_corpus_paths(), "--tokenizer", demo_tokenizer_path(),
         "--seq-len", "512", "--port", str(port), "--state-dir", str(tmp_path / "state")],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    ray_cli = str(REPO / ".venv" / "bin" / "ray")
    address = ["--address", f"http://127.0.0.1:{cluster_env['PACKFEED_DASHBOARD_PORT']}"]
    try:
        ids = []
        # The client retries (UNAVAILABLE) while the job starts the server.
        with PackedStream(f"127.0.0.1:{port}", batch_rows=8, retry_timeout_s=240) as stream:
            for batch in stream:
                ids.extend(batch.sample_ids[batch.sample_ids >= 0].tolist())
        assert sorted(ids) == list(range(7500))
        logs = subprocess.run([ray_cli, "job", "logs", *address, job_id], env=cluster_env, capture_output=True,
                              text=True, timeout=60).stdout
        assert "joined the cluster" in logs, logs[-3000:]
        status = subprocess.run(["bash", str(LOCAL / "status.sh")], env=cluster_env, capture_output=True, text=True,
                                timeout=60)
        lines = status.stdout.splitlines()
        assert lines[0].split() == ["id", "status", "entrypoint", "start", "duration"], status.stdout
        row = next(line for line in lines if line.startswith(job_id))
        assert "RUNNING" in row and "packfeed serve" in row and len(row) < 200
    finally:
        subprocess.run([ray_cli, "job", "stop", *address, job_id], env=cluster_env, capture_output=True, timeout=120)


def test_stop_leaves_no_process_of_the_cluster_and_frees_its_ports(cluster_env):
    """Issue: stop.sh left the Ray client server and a DashboardAgent listening (last test: it
    stops the module's cluster; the fixture's own stop then finds nothing)."""
    import psutil

    ray_dir = cluster_env["PACKFEED_RAY_DIR"]
    sys.path.insert(0, str(LOCAL))
    try:
        from stop_cluster import cluster_processes
    finally:
        sys.path.remove(str(LOCAL))
    before = cluster_processes(f"{ray_dir}/tmp")
    # what start.sh's comment and the README say: the dashboard (the jobs) on loopback only, the
    # GCS on every interface (token authentication refuses other hosts); no pointer to `ray stop`
    addresses: dict[int, set[str]] = {}
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN:
            addresses.setdefault(c.laddr.port, set()).add(c.laddr.ip)
    assert addresses[int(cluster_env["PACKFEED_DASHBOARD_PORT"])] == {"127.0.0.1"}
    assert addresses[int(cluster_env["PACKFEED_RAY_PORT"])] & {"0.0.0.0", "::"}
    assert "deploy/local/stop.sh" in STARTED["output"] and "ray stop" not in STARTED["output"], STARTED["output"]
    names = " ".join(" ".join(p.cmdline()) for p in before)
    assert "ray.util.client.server" in names and any(p.name().startswith("ray::") or "agent" in " ".join(p.cmdline()).lower()
                                                    for p in before), "the cluster's client server and agents are found"
    proc = subprocess.run(["bash", str(LOCAL / "stop.sh")], env=cluster_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "its ports are free" in proc.stdout, proc.stdout + proc.stderr
    assert not [p for p in before if _alive(p)]
    ports = {int(cluster_env[k]) for k in ("PACKFEED_RAY_PORT", "PACKFEED_DASHBOARD_PORT", "PACKFEED_AGENT_PORT",
                                          "PACKFEED_CLIENT_PORT")}
    listening = {c.laddr.port for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
    assert not ports & listening
    # issue 24: with no cluster, status.sh waited ~40 s and printed a Ray traceback
    status = subprocess.run(["bash", str(LOCAL / "status.sh")], env=cluster_env, capture_output=True, text=True,
                            timeout=30)
    address = f"http://127.0.0.1:{cluster_env['PACKFEED_DASHBOARD_PORT']}"
    assert status.returncode == 1 and status.stdout == "", status.stdout + status.stderr
    assert status.stderr == f"status.sh: no cluster at {address}; start one with bash deploy/local/start.sh\n"


def _alive(p) -> bool:
    """Running and not a zombie; a process that exits (or is reaped) while asked is not alive
    (psutil raises ZombieProcess from ``status()`` then: seen once in a full run)."""
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # ZombieProcess is one
        return False
