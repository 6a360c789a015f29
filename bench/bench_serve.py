"""``packfeed serve`` end to end: cold start, throughput, resume cost, memory under a stalled client.

    .venv/bin/python bench/bench_serve.py            # ~6 min on 2 cores
    .venv/bin/python bench/bench_serve.py --quick    # smaller corpus, fewer resume points

Every figure comes from real processes on 127.0.0.1: a fresh ``packfeed serve`` (embedded Ray,
one packing actor per CPU) and a ``PackedStream`` client in this process. Corpus: synthetic
English-like text (bench_pipeline.write_corpus), the bundled 1,564-token tokenizer, seq_len 2048.

1. Cold start. Time from launching the server to the first batch in the client, then rows/s
   to the end of the stream, against the SAME pipeline read in-process (a fresh Python process
   running ``PackingPipeline.iter_rows()``: embedded Ray, same actors). Ratio served / in-process.
2. Resume cost. The server is SIGKILLed and started again; a client resumes at cursors from 0%
   to 95% of the stream: time from "listening" to the first batch. With the manifest kept in
   --state-dir the server packs from the window holding the cursor, so the time should not grow
   with the cursor; the control (an empty state dir) replays from the start.
3. Memory with a stalled consumer. A client reads two batches and stops reading for a while:
   resident memory of the server's process tree (server, raylet, workers) sampled every second,
   against the same stream read without a pause. Flat = bounded by --buffer-rows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "tests")]

from bench_pipeline import write_corpus  # noqa: E402
from support.serve import TOKENIZER, ServerProcess  # noqa: E402

from packfeed.client.stream import PackedStream  # noqa: E402

SEQ_LEN = 2048
BATCH_ROWS = 16

IN_PROCESS = r"""
import json, sys, time
t0 = time.perf_counter()
from packfeed.service.commands.args import data_config_from_args, add_data_arguments
from packfeed.service.pipeline.ray_pipeline import PackingPipeline
from packfeed.service.data.plan import build_plan
from packfeed.service.cluster.raycluster import init_ray
import argparse
p = argparse.ArgumentParser(); add_data_arguments(p)
args = p.parse_args(sys.argv[1:])
config = data_config_from_args(args)
init_ray(None)
first, rows = None, 0
for block in PackingPipeline(config, build_plan(config)).iter_rows():
    rows += block.num_rows
    if first is None:
        first = time.perf_counter() - t0
print(json.dumps({"first": first, "rows": rows, "total": time.perf_counter() - t0}))
"""


def data_args(corpus: Path) -> list[str]:
    # 1,000-sample windows: a stream of many windows, so rates are steady and a resume has
    # many windows to skip.
    return [str(corpus), "--tokenizer", TOKENIZER, "--seq-len", str(SEQ_LEN), "--window-samples", "1000"]


def read_stream(target: str, *, cursor: int = 0, config_hash: str | None = None, limit: int | None = None,
                on_batch=None) -> dict:
    """Read from ``cursor`` to the end (or ``limit`` batches): first-batch time, rows, rows/s after it."""
    state = {"version": 1, "cursor": cursor, "step": 0, "config_hash": config_hash, "seq_len": SEQ_LEN}
    t0 = time.perf_counter()
    first, rows, batches = None, 0, 0
    with PackedStream(target, batch_rows=BATCH_ROWS, state=state, retry_timeout_s=600) as stream:
        for batch in stream:
            if first is None:
                first = time.perf_counter()
            rows += int((~batch.padding_rows).sum())
            batches += 1
            if on_batch is not None:
                on_batch(batches)
            if limit is not None and batches >= limit:
                break
        hash_ = stream.state_dict()["config_hash"]
    end = time.perf_counter()
    rate = (rows - BATCH_ROWS) / (end - first) if first and end > first else 0.0
    return {"first_s": first - t0, "rows": rows, "rows_per_s": rate, "seconds": end - t0, "config_hash": hash_}


def cold_start(corpus: Path, work: Path) -> None:
    out = subprocess.run([sys.executable, "-c", IN_PROCESS, *data_args(corpus)], capture_output=True, text=True,
                         cwd=REPO, check=True)
    ref = json.loads(out.stdout.strip().splitlines()[-1])
    ref_rate = (ref["rows"]) / (ref["total"] - ref["first"])
    server = ServerProcess(data_args(corpus), log=work / "cold.log", state_dir=work / "state-cold")
    t0 = time.perf_counter()
    server.start()
    try:
        got = read_stream(server.target)
    finally:
        server.kill()
    first = got["first_s"] + (time.perf_counter() - t0 - got["seconds"])  # from launching the server
    print("\n## 1. Cold start and throughput (world 1, batch_rows 16, seq_len 2048)\n")
    print("reader | first row/batch s | rows | rows/s after the first | ratio")
    print("--- | --- | --- | --- | ---")
    print(f"in-process PackingPipeline.iter_rows() | {ref['first']:.1f} | {ref['rows']:,} | {ref_rate:,.0f} | 1.00")
    print(f"packfeed serve -> PackedStream client | {first:.1f} | {got['rows']:,} | {got['rows_per_s']:,.0f} | "
          f"{got['rows_per_s'] / ref_rate:.2f}")
    if got["rows"] != ref["rows"]:
        raise SystemExit(f"row counts differ: served {got['rows']} vs in-process {ref['rows']}")


def resume_cost(corpus: Path, work: Path, fractions: list[float]) -> None:
    state = work / "state-resume"
    server = ServerProcess(data_args(corpus), log=work / "resume.log", state_dir=state)
    server.start()
    full = read_stream(server.target)  # fills the manifest: every window's first row
    total, config_hash = full["rows"], full["config_hash"]
    server.kill()
    print(f"\n## 2. Resume cost after a SIGKILL ({total:,} rows in the stream)\n")
    print("cursor | % of stream | manifest | first batch s after 'listening' | window packed from")
    print("--- | --- | --- | --- | ---")
    runs = [(f, True) for f in fractions] + [(f, False) for f in (fractions[len(fractions) // 2], fractions[-1])]
    for fraction, with_manifest in runs:
        cursor = int(total * fraction) // BATCH_ROWS * BATCH_ROWS
        state_dir = state if with_manifest else work / f"state-empty-{fraction}"
        s = ServerProcess(data_args(corpus), log=work / "resume.log", state_dir=state_dir)
        s.port = server.port
        s.start()
        try:
            got = read_stream(s.target, cursor=cursor, config_hash=config_hash, limit=1)
        finally:
            s.kill()
        packed_from = s.tail(2000).split("packing from window")[-1].split(")")[0].strip()
        print(f"{cursor:,} | {100 * fraction:.0f}% | {'kept' if with_manifest else 'none'} | "
              f"{got['first_s']:.1f} | {packed_from})")


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def memory_run(corpus: Path, work: Path, *, pause: float, seconds: float) -> tuple[list[tuple[int, int]], dict]:
    """Read the whole stream, pausing ``pause`` s after the second batch; RSS (server process,
    whole tree) every second for ``seconds`` s from that batch on."""
    server = ServerProcess([*data_args(corpus), "--buffer-rows", "256"], log=work / "memory.log",
                           state_dir=work / f"state-mem-{pause}")
    server.start()
    proc = psutil.Process(server.proc.pid)
    samples: list[tuple[int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0) and len(samples) <= seconds:
            samples.append((proc.memory_info().rss, tree_rss(proc)))

    sampler = threading.Thread(target=sample, daemon=True)

    def on_batch(n: int) -> None:
        if n == 2:
            sampler.start()
            if pause:
                time.sleep(pause)

    try:
        got = read_stream(server.target, on_batch=on_batch)
    finally:
        stop.set()
        server.kill()
    return samples, got


def stalled_memory(corpus: Path, work: Path, stall_s: float) -> None:
    print(f"\n## 3. Server memory (RSS, MiB) with a consumer stalled for {stall_s:.0f} s (--buffer-rows 256)\n")
    every = 5
    columns = " | ".join(f"t={t}s" for t in range(0, int(stall_s) + 1, every))
    print(f"consumer | what | {columns} | rows read in all")
    print("--- | --- | " + " | ".join("---" for _ in range(0, int(stall_s) + 1, every)) + " | ---")
    for label, pause in (("reads without pause", 0.0), ("stalls after 2 batches", stall_s)):
        samples, got = memory_run(corpus, work, pause=pause, seconds=stall_s)
        for what, k in (("server process", 0), ("process tree", 1)):
            values = " | ".join(f"{samples[t][k] / 2**20:,.0f}" if t < len(samples) else "-"
                                for t in range(0, int(stall_s) + 1, every))
            print(f"{label} | {what} | {values} | {got['rows']:,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("cold", "resume", "memory"), help="run one section")
    args = parser.parse_args()
    samples = 20_000 if args.quick else 60_000
    fractions = [0.0, 0.5, 0.95] if args.quick else [0.0, 0.25, 0.5, 0.75, 0.95]
    with tempfile.TemporaryDirectory(prefix="packfeed-bench-serve-") as tmp:
        work = Path(tmp)
        corpus = work / "corpus.jsonl"
        write_corpus(corpus, samples, seed=0)
        print(f"corpus: {samples:,} samples ({corpus.stat().st_size / 2**20:.0f} MB), tokenizer: bundled demo BPE, "
              f"{psutil.cpu_count()} CPUs")
        if args.only in (None, "cold"):
            cold_start(corpus, work)
        if args.only in (None, "resume"):
            resume_cost(corpus, work, fractions)
        if args.only in (None, "memory"):
            stalled_memory(corpus, work, stall_s=15 if args.quick else 30)


if __name__ == "__main__":
    main()
