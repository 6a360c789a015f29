"""The planner at internet scale, and the scan's cost per file on the local S3 server.

(1) Plan: simulated scan results (``FileScan``s built directly, no files) for ``--files`` JSONL
files holding ``--rows`` rows in ``--sources`` sources, seek points every ``--block`` rows (the
default block, 256: 8 bytes a seek point). Reports the driver's memory for the scans and the
plan (tracemalloc, numpy's buffers included; and the RSS growth), the planning time
(``plan_from_scans``: file offsets, mixture, window bounds), the plan's pickled size (what each
packing actor receives), its fingerprint, the scan manifest's encode/decode, and ``window(k)``
lookups: the first (it builds each source's seeded pass order) and consecutive ones. Ratios to
``np.sort`` of as many random int64 as the plan holds seek points, measured in the same run.
Goal (issue 23): under 2 GB and a few seconds at 100,000 files and 10 billion rows.

(2) Scan on the local S3 server (moto, started here as the tests start it): ``--objects``
small JSONL objects under one prefix. The first ``build_plan`` (a listing, then every object
scanned on threads: HEAD + GET each), one by one for comparison, and a second ``build_plan``
from the scan manifest on the store (a listing and the manifest, no input byte): time,
requests and bytes per file (``storage.COUNTERS``).

    .venv/bin/python bench/bench_plan.py                       # ~40 s, ~2.3 GB peak RSS
    .venv/bin/python bench/bench_plan.py --files 10000 --rows 1000000000 --objects 50   # quick
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from packfeed.service.data.config import DataConfig, SourceConfig
from packfeed.service.data.plan import build_plan, plan_from_scans
from packfeed.service.inputs import scan_tasks
from packfeed.service.inputs.scan import FileScan, seek_phase
from packfeed.service.inputs.scan_cache import decode, encode
from packfeed.service.storage import COUNTERS
from report import table  # noqa: E402 - bench/report.py, beside this script

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the loopback S3 server of the tests

LINE_BYTES = 1000  # simulated mean line length: offsets grow by this much a row


def simulated_scans(files: int, rows: int, sources: int, stride: int, seed: int = 0) -> list[list[FileScan]]:
    """``files`` JSONL scans of ~rows/files rows each (+-20%, summing to ``rows``), split over
    ``sources``; each with its own offsets array (as a scan or a manifest gives them)."""
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.8, 1.2, files)
    counts = np.floor(weights / weights.sum() * rows).astype(np.int64)
    counts[: rows - int(counts.sum())] += 1
    step = np.arange(int(counts.max()) // stride + 2, dtype=np.int64) * (stride * LINE_BYTES)
    out: list[list[FileScan]] = []
    for s, part in enumerate(np.array_split(np.arange(files), sources)):
        scans, first_row = [], 0
        for f in part.tolist():
            n = int(counts[f])
            phase = seek_phase(first_row, stride)
            points = 1 + len(range(phase or stride, n, stride))
            offsets = step[:points].copy()
            if phase:
                offsets[1:] -= (stride - phase) * LINE_BYTES
            scans.append(FileScan(f"s3://corpus/source-{s}/shard-{f:06d}.jsonl", "jsonl", n, size=n * LINE_BYTES,
                                  mtime_ns=1_700_000_000_000_000_000 + f, etag=f'"{f:032x}"', seek_offsets=offsets,
                                  seek_phase=phase, seek_stride=stride))
            first_row += n
        out.append(scans)
    return out


def best(fn, repeats: int = 3) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def plan_bench(files: int, rows: int, sources: int, stride: int) -> None:
    config = DataConfig(sources=tuple(SourceConfig(name=f"source-{s}", paths=[f"s3://corpus/source-{s}/*.jsonl"])
                                      for s in range(sources)), tokenizer="-", seq_len=4096, block_samples=stride)
    gc.collect()
    rss0 = rss_bytes()
    tracemalloc.start()
    t_build = time.perf_counter()
    scans = simulated_scans(files, rows, sources, stride)
    t_build = time.perf_counter() - t_build
    mem_scans = tracemalloc.get_traced_memory()[0]
    plan = plan_from_scans(config, scans)
    mem_plan, peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    plan.window(0)
    mem_window, peak_window = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = rss_bytes() - rss0
    points = sum(len(f.seek_offsets) for source in scans for f in source)
    t_sort, _ = best(lambda: np.sort(np.random.default_rng(1).integers(0, 1 << 62, points)), 2)

    t_plan, plan = best(lambda: plan_from_scans(config, scans))
    start = time.perf_counter()
    plan.window(0)
    t_first = time.perf_counter() - start
    k0 = plan.windows_per_epoch // 2
    start = time.perf_counter()
    for k in range(k0, k0 + 1000):
        plan.window(k)
    t_next = (time.perf_counter() - start) / 1000
    t_fingerprint, _ = best(plan.fingerprint, 1)
    t_pickle, blob = best(lambda: pickle.dumps(plan, protocol=5), 1)
    flat = [f for source in scans for f in source]
    t_encode, manifest = best(lambda: encode(flat), 1)
    t_decode, _ = best(lambda: decode(manifest), 1)
    gb = 1 << 30
    print(f"{files:,} files, {rows:,} rows in {sources} sources, seek stride {stride}: {points:,} seek points; "
          f"{plan.num_windows:,} windows of {plan.window_samples:,}; np.sort of {points:,} int64: {t_sort:.2f} s")
    table("(1) the plan at scale (driver); ratio: time / np.sort of as many int64 as seek points",
          ["what", "value", "ratio to np.sort", "goal"], [
              ["scans in memory (tracemalloc)", f"{mem_scans / gb:.2f} GB ({mem_scans / points:.1f} B per seek point)",
               "", ""],
              ["(before: seek rows + offsets, 16 B a point)", f"{16 * points / gb:.2f} GB (computed)", "", ""],
              ["plan on top of the scans", f"{(mem_plan - mem_scans) / gb:.3f} GB", "", ""],
              ["scans + plan (tracemalloc; peak)", f"{mem_plan / gb:.2f} GB; {peak / gb:.2f} GB",
               "", "< 2 GB " + ("PASS" if peak < 2 * gb else "FAIL")],
              ["first window: its sources' pass orders (kept; peak)",
               f"{(mem_window - mem_plan) / gb:.2f} GB; {(peak_window - mem_plan) / gb:.2f} GB", "", ""],
              ["RSS growth (all of the above)", f"{rss / gb:.2f} GB", "", ""],
              ["building the simulated scans (under tracemalloc)", f"{t_build:.2f} s", f"{t_build / t_sort:.2f}", ""],
              ["planning (plan_from_scans)", f"{t_plan:.2f} s", f"{t_plan / t_sort:.2f}",
               "a few s " + ("PASS" if t_plan < 5 else "FAIL")],
              ["window(k): the first", f"{t_first * 1e3:.0f} ms", f"{t_first / t_sort:.3f}", ""],
              ["window(k): next 1,000, each", f"{t_next * 1e6:.0f} us", f"{t_next / t_sort:.5f}", ""],
              ["fingerprint", f"{t_fingerprint:.2f} s", f"{t_fingerprint / t_sort:.2f}", ""],
              ["pickled plan (to each actor)", f"{len(blob) / gb:.2f} GB in {t_pickle:.2f} s",
               f"{t_pickle / t_sort:.2f}", ""],
              ["scan manifest: encode / decode", f"{len(manifest) / gb:.2f} GB; {t_encode:.2f} s / {t_decode:.2f} s",
               f"{t_encode / t_sort:.2f} / {t_decode / t_sort:.2f}", ""],
          ])


def s3_bench(objects: int) -> None:
    from support.s3 import S3Server

    with S3Server() as server:
        os.environ.update(server.env())
        bucket = server.bucket()
        for i in range(objects):
            rows = "".join(json.dumps({"text": f"object {i} row {r} " + "x" * 150}) + "\n" for r in range(100))
            server.put(bucket, f"corpus/part-{i:05d}.jsonl", rows.encode())
        config = DataConfig(sources=(SourceConfig(name="web", paths=[f"s3://{bucket}/corpus/*.jsonl"]),),
                            tokenizer="-", seq_len=512)
        cache = f"s3://{bucket}/run/.packfeed/scan.npz"
        out = []
        engine = scan_tasks.choose_engine
        for name, run in [
            ("first plan, one by one", lambda: build_plan(config)),
            ("first plan, threads (the default)", lambda: build_plan(config, scan_cache=cache)),
            ("second plan, from the manifest", lambda: build_plan(config, scan_cache=cache)),
        ]:
            scan_tasks.choose_engine = (lambda todo: None) if "one by one" in name else engine
            before = COUNTERS.snapshot()
            start = time.perf_counter()
            run()
            seconds = time.perf_counter() - start
            used = COUNTERS.snapshot() - before
            out.append([name, f"{seconds:.2f}", f"{seconds / objects * 1e3:.1f}", f"{used.requests / objects:.2f}",
                        f"{used.bytes_read / objects:,.0f}", f"{used.bytes_written:,}"])
        scan_tasks.choose_engine = engine
    table(f"(2) scan on the local S3 server: {objects} objects of 100 rows (~18 KB) each, "
          f"{scan_tasks.SCAN_THREADS} threads; requests include the listing and the manifest",
          ["run", "seconds", "ms per file", "requests per file", "bytes read per file", "bytes written"], out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=10_000_000_000)
    parser.add_argument("--sources", type=int, default=4)
    parser.add_argument("--block", type=int, default=256, help="seek stride: the sources' block_samples")
    parser.add_argument("--objects", type=int, default=200, help="objects on the local S3 server (0: skip)")
    args = parser.parse_args(argv)
    plan_bench(args.files, args.rows, args.sources, args.block)
    if args.objects:
        s3_bench(args.objects)
    return 0


if __name__ == "__main__":
    sys.exit(main())
