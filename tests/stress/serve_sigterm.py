"""Stress: SIGTERM to a streaming ``packfeed serve``'s process group, many times (not in CI).

    .venv/bin/python tests/stress/serve_sigterm.py --runs 100 [--busy] [--parallel 2] [--seed 1]

Each run is what a user does with Ctrl-C or ``kill -TERM -PGID``: a server of the bundled
corpus (its 3 files copied 3 times: 9 inputs, ~2,500 rows; ``--buffer-rows 512 --num-workers 1``), one
``PackedStream`` reading with a small pause per batch, and SIGTERM to the server's whole process
group (as Ctrl-C or a container runtime does) once the reader has a seeded random count of rows
between 300 and 2,000. Every run must exit 0 after a drain and leave no process of the group.
``--busy`` keeps two busy-loop processes running the whole time (a shared CI machine).

Prints one line per run and a summary; exits 1 if any run failed, with each failure's log
tail. Takes ~10-15 s a run on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: support.serve

from packfeed.client.stream import PackedStream, StreamError  # noqa: E402
from support.serve import CORPUS, TOKENIZER, GroupWatch, ServerProcess, busy_cpus, kill_groups  # noqa: E402


def nine_files(root: Path) -> list[str]:
    """The bundled corpus copied 3 times under ``root`` (a file named twice is read once)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for copy in range(3):
        for source in map(Path, CORPUS):
            path = root / f"{source.stem}-{copy}.jsonl"
            path.write_bytes(source.read_bytes())
            paths.append(str(path))
    return paths


def one_run(directory: Path, inputs: list[str], rows_before: int) -> tuple[int, int, list[str], str]:
    """(exit status, rows read, processes of the group left, log tail) of one SIGTERM."""
    directory.mkdir(parents=True, exist_ok=True)
    args = [*inputs, "--tokenizer", TOKENIZER, "--seq-len", "512", "--window-samples", "1000",
            "--num-workers", "1", "--buffer-rows", "512"]
    server = ServerProcess(args, log=directory / "serve.log", state_dir=directory / "state", env={"RAY_ADDRESS": ""})
    server.start()
    pgid, watch, read, reached = server.proc.pid, GroupWatch(server.proc.pid), 0, threading.Event()

    def reader() -> None:
        nonlocal read
        try:
            with PackedStream(server.target, batch_rows=4, retry_timeout_s=3, max_backoff_s=0.5) as stream:
                for batch in stream:
                    read += batch.num_rows
                    if read >= rows_before:
                        reached.set()
                    time.sleep(0.005)
        except StreamError:
            pass  # the server went away for good: expected after the signal
        finally:
            reached.set()  # the stream ended first: signal now

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    reached.wait(300)
    os.killpg(pgid, signal.SIGTERM)
    try:
        code = server.proc.wait(180)
    except subprocess.TimeoutExpired:
        code = -999
    left = watch.left()  # the server's, its Ray's (a group apart) and the workers' (each its own)
    kill_groups(watch.groups)
    server.kill()
    return code, read, left, server.tail(3000)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=2, help="servers at a time")
    parser.add_argument("--busy", action="store_true", help="two busy-loop processes the whole time")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep the runs' logs here (default: a temporary directory)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    targets = [rng.randint(300, 2000) for _ in range(args.runs)]
    root = args.keep or Path(tempfile.mkdtemp(prefix="packfeed-sigterm-"))
    inputs = nine_files(root / "corpus")
    failures = []
    started = time.monotonic()

    def run(i: int):
        code, read, left, tail = one_run(root / f"run{i:03d}", inputs, targets[i])
        ok = code == 0 and not left and "packfeed serve: stopped" in tail
        print(f"run {i:3d}: SIGTERM after {read:5d} rows (target {targets[i]}): exit {code}"
              f"{'' if not left else f', left {left}'} {'ok' if ok else 'FAILED'}", flush=True)
        if not ok:
            failures.append((i, code, tail))

    with busy_cpus(2 if args.busy else 0), ThreadPoolExecutor(max_workers=args.parallel) as pool:
        list(pool.map(run, range(args.runs)))
    for i, code, tail in failures:
        print(f"\n--- run {i}: exit {code}, log tail ---\n{tail}")
    print(f"\n{args.runs - len(failures)} passed, {len(failures)} failed "
          f"({'busy CPUs' if args.busy else 'quiet'}, {time.monotonic() - started:.0f} s; logs in {root})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
