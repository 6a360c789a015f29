"""`packfeed pack`'s head start (packjob/head_start.py), each run a fresh process with its own
embedded Ray: the driver packs windows while Ray and the packing actors start, and the output
is the actors' own, file for file.

* a small run: the driver packs every window, and neither Ray nor any actor starts;
* a run the driver and the actors share (the driver slowed down, so that the actors take over):
  each window packed once, by one of them, the same files;
* a window that fails on the driver fails the run with its own error, before or after Ray is
  up, and no actor waits for the window the driver did not pack.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.faults import FAULTS_ENV

pytestmark = pytest.mark.integration

# the bundled corpus in 15 windows (the driver alone packs them in ~0.8 s on 2 cores)
FLAGS = ["--tokenizer", demo_tokenizer_path(), "--seq-len", "512", "--window-samples", "512"]
WINDOWS = 15
TIMING = ("seconds", "tokens_per_second", "first_row_seconds", "ray_to_first_row_seconds", "startup_seconds",
          "steady_tokens_per_second", "core_tokens_per_second", "cpu_tokens_per_second", "ray_init_seconds",
          "num_workers", "driver_windows", "tokenizer_backend")

# The CLI in a process whose driver packs slowly (the actors' processes are not slowed): Ray
# and the pipeline always start (no estimate), and the driver's windows wait for Ray to be up (at the
# hand-over the driver is in window 0: every later window of its own it claims against the
# actors), then ``DRIVER_WINDOW_S`` seconds; from window ``DRIVER_WAITS_FOR_ACTORS`` on, also
# until an actor has claimed a window (in the row ledger's store), however long the actors take
# to start on a busy machine: the driver then loses its next claim and stops.
SLOW_DRIVER = textwrap.dedent("""
    import os, sys, time
    import ray
    from ray.experimental import internal_kv
    from packfeed.service.packed import part_sink
    from packfeed.service.packjob import head_start
    from packfeed.service.pipeline import window
    from packfeed.service.cli import main

    head_start.ACTORS_START_S = head_start.RAY_START_S = 0.0
    pack_window, seconds = window.process_window, float(os.environ.get("DRIVER_WINDOW_S", "0"))
    wait_from = int(os.environ.get("DRIVER_WAITS_FOR_ACTORS", "-1"))

    def an_actor_claimed():
        keys = internal_kv._internal_kv_list("", namespace=part_sink._NAMESPACE)
        return any(b"/claim/" in key and internal_kv._internal_kv_get(key, namespace=part_sink._NAMESPACE) == b"actors"
                   for key in keys)

    def slow(spec, *args, **kwargs):
        deadline = time.monotonic() + 120
        while not ray.is_initialized() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(seconds)
        while 0 <= wait_from <= spec.index and not an_actor_claimed() and time.monotonic() < deadline:
            time.sleep(0.1)
        return pack_window(spec, *args, **kwargs)

    window.process_window = slow
    sys.exit(main(sys.argv[1:]))
""")


def pack(out: Path, *extra: str, script: str | None = None, env: dict | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess:
    command = ["-c", script] if script else ["-m", "packfeed.service.cli"]
    return subprocess.run([sys.executable, *command, "pack", *demo_corpus_paths(), *FLAGS, "--output", str(out),
                           *extra], capture_output=True, text=True, timeout=timeout, env=env)


def stats_of(out: Path) -> dict:
    return json.loads((out / ".packfeed" / "stats.json").read_text())


def parts(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("part-*.parquet"))}


def assert_same_output(out: Path, reference: Path) -> None:
    ours, theirs = parts(out), parts(reference)
    assert list(ours) == list(theirs), "the same part files"
    different = [name for name in ours if ours[name] != theirs[name]]
    assert not different, f"part files differ from the actors' own: {different}"
    ours, theirs = stats_of(out), stats_of(reference)
    assert {k: v for k, v in ours.items() if k not in TIMING} == {k: v for k, v in theirs.items() if k not in TIMING}
    # the back-end that packed each window (the checks are each packer's own: times, caches)
    assert ours["tokenizer_backend"]["windows"] == theirs["tokenizer_backend"]["windows"]


@pytest.fixture(scope="module")
def actors_only(tmp_path_factory) -> Path:
    """The run on the packing actors alone (--no-head-start): the output to equal."""
    out = tmp_path_factory.mktemp("head_start") / "actors"
    proc = pack(out, "--no-head-start")
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = stats_of(out)
    assert stats["driver_windows"] == 0 and stats["num_workers"] >= 1 and stats["windows"] == WINDOWS
    assert stats["core_tokens_per_second"] > 0, "some actor packed more than its first window"
    # CPU time: at most about the wall seconds times the actor's CPU (Ray's own threads may add a little)
    assert stats["cpu_tokens_per_second"] > 0.5 * stats["core_tokens_per_second"]
    return out


def test_a_small_run_is_packed_by_the_driver_alone_into_the_actors_files(actors_only, tmp_path):
    proc = pack(tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = stats_of(tmp_path / "out")
    assert stats["driver_windows"] == stats["windows"] == WINDOWS and stats["num_workers"] == 0
    assert "on the driver (sooner than starting Ray and packing actors: no Ray started)" in proc.stderr
    assert "Ray: started" not in proc.stderr and "MapWorker" not in proc.stderr, "neither Ray nor an actor started"
    assert stats["ray_init_seconds"] is None and stats["ray_to_first_row_seconds"] is None
    assert stats["core_tokens_per_second"] is None and stats["cpu_tokens_per_second"] is None  # no actor: no rates
    assert stats["first_row_seconds"] < stats_of(actors_only)["first_row_seconds"], \
        "the first rows were packed while the actors' run started its Ray"
    assert_same_output(tmp_path / "out", actors_only)


def test_the_driver_and_the_actors_share_a_run_and_write_the_same_files(actors_only, tmp_path):
    # the driver packs windows 0 and 1 before any actor is up, and window 2 on only once an
    # actor claimed a window: from there the actors pack the rest (the driver may still win a
    # claim or two against the second actor)
    proc = pack(tmp_path / "out", "--progress-seconds", "1", script=SLOW_DRIVER,
                env={**_env(), "DRIVER_WINDOW_S": "0.5", "DRIVER_WAITS_FOR_ACTORS": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = stats_of(tmp_path / "out")
    assert 2 <= stats["driver_windows"] < stats["windows"] - 2 and stats["num_workers"] >= 1, \
        (stats["driver_windows"], stats["num_workers"])
    assert f"the driver packed {stats['driver_windows']} of the {WINDOWS} windows" in proc.stderr
    # progress lines as windows arrive (no TTY here: lines, not a bar)
    assert re.search(r"packfeed pack: [\d,]+/7,500 samples \(\d+%\), [\d,]+ rows, .* tokens/s, efficiency", proc.stderr)
    assert_same_output(tmp_path / "out", actors_only)


@pytest.mark.parametrize("window, slow", [
    pytest.param(2, None, id="the-driver-alone-no-ray"),
    pytest.param(1, "0.5", id="after-the-hand-over"),
])
def test_a_window_that_fails_on_the_driver_fails_the_run_with_its_error(tmp_path, window, slow):
    """``packer-window:K`` (raise) where the driver packs K. After the hand-over the actor of
    window K + 1 waits for it in the row ledger: the driver's failure ends that wait."""
    env = {**_env(), FAULTS_ENV: f"packer-window:{window}"}
    if slow:
        env["DRIVER_WINDOW_S"] = slow  # window 0 ends after Ray is up: window 1 is claimed in the ledger
    began = time.monotonic()
    proc = pack(tmp_path / "out", script=SLOW_DRIVER if slow else None, env=env, timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]  # a drill is one line (errors.py), not a bug's traceback
    assert f"packfeed pack: error: fault injected at packer-window:{window} ($PACKFEED_FAULTS): a drill" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert time.monotonic() - began < 120, "no actor waited for the driver's window"
    assert not (tmp_path / "out" / ".packfeed" / "stats.json").exists(), "a failed run is not marked complete"


def _env() -> dict[str, str]:
    return dict(os.environ)
