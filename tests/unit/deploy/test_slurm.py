"""deploy/slurm/train.sbatch, checked offline: run by bash with SLURM's commands stubbed.

Stand-ins for `srun` and `scontrol` (and the SLURM variables of a heterogeneous job: one CPU
node, two GPU nodes) record what the script would start; every `packfeed` command line in it
must be one packfeed's own parser accepts, the trainer under torchrun with the right
rendezvous, the server on the CPU group. Nothing is started: no Ray, no socket.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.deploy import parse_entrypoint

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "deploy" / "slurm" / "train.sbatch"
KNOWN_OPTIONS = {"job-name", "nodes", "ntasks-per-node", "cpus-per-task", "mem", "time", "output", "gpus-per-node",
                 "exclusive"}


def run_script(tmp_path: Path, script: Path = SCRIPT, **env: str) -> list[list[str]]:
    """The script under bash with stubs; the argv of every srun call, in order."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "srun.log"
    # The server's srun runs in the background and the script's exit trap sends it SIGTERM: the
    # script runs with SIGTERM ignored (inherited by the stubs from their start, before any trap
    # of theirs could be set), and the test waits for every line.
    (bin_dir / "srun").write_text(f'#!/usr/bin/env bash\nline="$(printf "%q " "$@")"\necho "$line" >> {log}\n'
                                  f'echo "$PACKFEED_AUTH_TOKEN" >> {log}.tokens\n')
    (bin_dir / "scontrol").write_text('#!/usr/bin/env bash\n[ "$1 $2" = "show hostnames" ] && tr "," "\\n" <<< "$3"\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    slurm = {"SLURM_JOB_ID": "42", "SLURM_JOB_NAME": "packfeed-train", "SLURM_JOB_NODELIST_HET_GROUP_0": "cpu1",
             "SLURM_JOB_NODELIST_HET_GROUP_1": "gpu1,gpu2", "SLURM_JOB_NUM_NODES_HET_GROUP_1": "2"}
    venv = Path(sys.executable).parent  # the script runs in the packfeed venv (activated before sbatch)
    proc = subprocess.run(["bash", str(script)], env={**os.environ, **slurm, **env,
                                                      "PATH": f"{bin_dir}:{venv}:{os.environ['PATH']}"},
                          capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    assert proc.returncode == 0, proc.stderr
    expected = 1 if "PACKED" in env else 2  # with a packed directory no server is started
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = [shlex.split(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
        if len(lines) >= expected:
            return sorted(lines, key=lambda argv: argv[0])  # --het-group=0 (serve) before --het-group=1
        time.sleep(0.05)
    raise AssertionError(f"srun was called {len(lines)} time(s), expected {expected}")


def packfeed_command(argv: list[str]) -> list[str]:
    return argv[argv.index("packfeed"):]


def test_the_script_is_valid_bash_with_known_sbatch_options():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    options = [line.split()[1] for line in SCRIPT.read_text().splitlines() if line.startswith("#SBATCH ")]
    names = {o.removeprefix("--").split("=")[0] for o in options if o != "hetjob"}
    assert names <= KNOWN_OPTIONS, names - KNOWN_OPTIONS
    assert options.count("hetjob") == 1, "one CPU component, one GPU component"


def test_cpu_nodes_serve_and_gpu_nodes_train_under_torchrun(tmp_path):
    serve, train = run_script(tmp_path)
    assert serve[:2] == ["--het-group=0", "--ntasks=1"]
    served = parse_entrypoint(shlex.join(packfeed_command(serve)))
    assert served.command == "serve" and served.port == 50051 and served.host == "0.0.0.0"

    assert train[0] == "--het-group=1" and "torchrun" in train
    torchrun = train[train.index("torchrun"):train.index("packfeed")]
    flags = dict(zip(torchrun[1::2], torchrun[2::2]))
    assert flags["--nnodes"] == "2" and flags["--nproc-per-node"] == "gpu", "a rank per GPU SLURM gives the node"
    assert flags["--rdzv-endpoint"] == "gpu1:29400" and flags["--rdzv-backend"] == "c10d"
    assert torchrun[-1] == "--no-python"
    trained = parse_entrypoint(shlex.join(packfeed_command(train)))
    assert trained.command == "train" and trained.launcher == "torchrun"
    assert trained.server == "cpu1:50051" and trained.resume == "auto"
    assert Path(trained.config).is_file() and Path(trained.config).is_absolute(), "found from anywhere"


def test_the_server_and_every_rank_share_a_token_the_server_accepts(tmp_path):
    from packfeed.service.commands.serve import check_args

    serve, _ = run_script(tmp_path)
    tokens = (tmp_path / "srun.log.tokens").read_text().split()
    assert len(tokens) == 2 and tokens[0] == tokens[1] and len(tokens[0]) >= 24, "one token, both sides"
    served = parse_entrypoint(shlex.join(packfeed_command(serve)))
    check_args(served, tokens[0])  # serve's own check on 0.0.0.0: accepted with the token
    with pytest.raises(ValueError, match="without a token"):
        check_args(served, None)  # what the script started before: refused, exit 2
    given = tmp_path / "given"
    given.mkdir()
    run_script(given, PACKFEED_AUTH_TOKEN="the-sites-own-token-of-24-chars")
    assert set((given / "srun.log.tokens").read_text().split()) == {"the-sites-own-token-of-24-chars"}


def test_a_second_submission_continues_the_first_run(tmp_path):
    outputs = []
    for job in ("42", "43"):
        root = tmp_path / job
        root.mkdir()
        _, train = run_script(root, SLURM_JOB_ID=job)
        trained = parse_entrypoint(shlex.join(packfeed_command(train)))
        assert trained.resume == "auto"
        outputs.append(trained.output)
    assert outputs[0] == outputs[1] == "runs/slurm-packfeed-train", "the job's name, not its id"


def test_a_packed_directory_needs_no_server(tmp_path):
    (train,) = run_script(tmp_path, PACKED="runs/packed")
    trained = parse_entrypoint(shlex.join(packfeed_command(train)))
    assert trained.server is None and trained.inputs == ["runs/packed"] and trained.launcher == "torchrun"


@pytest.mark.parametrize("broken", ["--lancher torchrun", "--launcher slurm"])
def test_the_check_rejects_a_command_packfeed_would(tmp_path, broken):
    text = SCRIPT.read_text().replace("--launcher torchrun", broken)
    copy = tmp_path / "train.sbatch"
    copy.write_text(text)
    (train,) = run_script(tmp_path, copy, PACKED="runs/packed")
    with pytest.raises(AssertionError, match="packfeed refuses"):
        parse_entrypoint(shlex.join(packfeed_command(train)))
