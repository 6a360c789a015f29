"""Shuffle quality and read cost of the block size (``[data] block_samples``).

A source is read as passes of seeded blocks of consecutive rows (service/data/mixture.py). Smaller
blocks mix a sorted source better; every block is one seek (JSONL) or one more row group to
decode (Parquet). This bench measures both on one synthetic source sorted by topic (8 files of
one topic each, 200k rows, ~600 bytes a row), windows of 8192 samples:

* quality: topics per window (8 is perfect), the worst window's largest topic share (1/8 is
  perfect), and the longest run of consecutive windows dominated (> 50%) by one topic;
* cost: reading every window's rows (``read_window``: seek, decode, validate; no tokenizer),
  as a ratio to reading the same rows in file order (block 0) in the same run; for JSONL and
  for Parquet written with 10,000-row row groups.

    .venv/bin/python bench/bench_shuffle.py [--rows 200000] [--blocks 0 64 256 1024 4096]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.inputs.read import read_window

TOPICS = 8
WINDOW = 8192


def write_corpus(root: Path, rows: int) -> dict[str, list[str]]:
    """One JSONL and one Parquet file per topic; rows of a topic are consecutive."""
    per = rows // TOPICS
    out: dict[str, list[str]] = {"jsonl": [], "parquet": []}
    filler = "lorem ipsum dolor sit amet " * 20
    for t in range(TOPICS):
        texts = [f"topic {t} row {i}: {filler}" for i in range(per)]
        jsonl = root / f"topic{t}.jsonl"
        jsonl.write_text("".join(json.dumps({"text": x}) + "\n" for x in texts))
        parquet = root / f"topic{t}.parquet"
        pq.write_table(pa.table({"text": texts}), parquet, row_group_size=10_000)
        out["jsonl"].append(str(jsonl))
        out["parquet"].append(str(parquet))
    return out


def quality(paths: list[str], block: int) -> tuple[float, float, int]:
    plan = build_plan(DataConfig.from_inputs(paths, tokenizer="-", seq_len=8, window_samples=WINDOW, block_samples=block))
    topics_per_window, worst, runs, run, last = [], 0.0, 0, 0, None
    for k in range(plan.num_windows):
        count = Counter()
        for p in plan.window(k).pieces:
            count[p.path] += p.num_rows
        total = sum(count.values())
        topics_per_window.append(len(count))
        top, share = count.most_common(1)[0]
        worst = max(worst, share / total)
        dominant = top if share / total > 0.5 else None
        run = run + 1 if dominant is not None and dominant == last else (1 if dominant else 0)
        runs, last = max(runs, run), dominant
    return sum(topics_per_window) / len(topics_per_window), worst, runs


def read_seconds(paths: list[str], block: int) -> float:
    plan = build_plan(DataConfig.from_inputs(paths, tokenizer="-", seq_len=8, window_samples=WINDOW, block_samples=block))
    start = time.perf_counter()
    for k in range(plan.num_windows):
        read_window(plan.window(k))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--blocks", type=int, nargs="+", default=[0, 64, 256, 1024, 4096])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = write_corpus(Path(tmp), args.rows)
        for paths in files.values():
            read_seconds(paths, 0)  # warm the page cache: every run reads from memory
        base = {kind: read_seconds(paths, 0) for kind, paths in files.items()}
        print(f"{args.rows:,} rows in {TOPICS} topic-sorted files, windows of {WINDOW}; read time vs file order "
              f"(JSONL {base['jsonl']:.2f}s, Parquet {base['parquet']:.2f}s)\n")
        print("block | topics/window | worst window's top topic | longest single-topic run (windows) | "
              "JSONL read x | Parquet read x")
        print("--- | --- | --- | --- | --- | ---")
        for block in args.blocks:
            topics, worst, run = quality(files["jsonl"], block)
            jsonl = read_seconds(files["jsonl"], block) / base["jsonl"]
            parquet = read_seconds(files["parquet"], block) / base["parquet"]
            name = "0 (file order)" if block == 0 else str(block)
            print(f"{name} | {topics:.1f} | {worst:.0%} | {run} | {jsonl:.2f} | {parquet:.2f}")


if __name__ == "__main__":
    main()
