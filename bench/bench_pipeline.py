"""Tokenize + pack throughput of the whole pipeline against the raw tokenizer, same run.

    .venv/bin/python bench/bench_pipeline.py            # ~3 minutes on 2 cores
    .venv/bin/python bench/bench_pipeline.py --quick    # smaller corpora

Reference: the raw Rust tokenizer (`tokenizers.Tokenizer.encode_batch`) on ONE core
(RAYON_NUM_THREADS=1) over the same texts, timing only the encode calls. Measured: a fresh
`packfeed pack` process (embedded Ray, one packing actor per CPU) on the same corpus, read ->
tokenize -> pack -> Parquet. Reported: steady-state tokens/s (from the moment every packing
worker has delivered its first block to the end) and its ratio to the raw single-core rate (goal >= 1.5 on 2 CPUs), the end-to-end rate
with Ray's start-up included, time to the first packed row, and the peak resident memory of the whole
process tree (driver, raylet, workers) for corpora of 1x and 4x the size: memory must not
grow with the corpus (bounded windows, streaming writes).

The tokenizer is Qwen2.5's 151k-token byte-level BPE, built offline from the quicktok-v1 wheel
with ../shared/tools/make_qwen_tokenizer.py (falls back to the bundled demo tokenizer).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
QWEN_TOOL = REPO.parent / "shared" / "tools" / "make_qwen_tokenizer.py"
WORDS = (
    "the of and to in a is that for it as was with be by on not he I this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will can "
    "river lantern garden castle harbor meadow forest engine window mountain village library market "
    "bridge tower island valley orchard kettle compass ladder mirror basket candle wagon anchor "
    "distributed training packing tokenizer attention gradient batch sequence transformer model "
    "2024 17 3.14 (see above) e.g. naïve café — 'quoted' \"double\" don't it's"
).split()


def qwen_tokenizer(cache: Path) -> tuple[str, str]:
    out = cache / "qwen2.5"
    if (out / "tokenizer.json").exists():
        return str(out), "Qwen2.5 (151k BPE)"
    try:
        subprocess.run([sys.executable, str(QWEN_TOOL), str(out)], check=True, capture_output=True)
        return str(out), "Qwen2.5 (151k BPE)"
    except (subprocess.CalledProcessError, FileNotFoundError):
        from packfeed.service.assets import demo_tokenizer_path

        return demo_tokenizer_path(), "bundled demo BPE"


def write_corpus(path: Path, num_samples: int, seed: int) -> None:
    """SFT-like text lengths (lognormal, median ~150 words) from a mixed word list."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(150), 0.9, size=num_samples).astype(int), 5, 6000)
    words = np.array(WORDS)
    with open(path, "w", encoding="utf-8") as f:
        for n in lengths:
            f.write(json.dumps({"text": " ".join(words[rng.integers(0, len(words), size=n)])}) + "\n")


RAW_SCRIPT = """
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
texts = [json.loads(line)["text"] for line in open(sys.argv[2], encoding="utf-8")]
tokens, seconds = 0, 0.0
for i in range(0, len(texts), 1024):
    t0 = time.perf_counter()
    encodings = tok.encode_batch(texts[i:i + 1024], add_special_tokens=False)
    seconds += time.perf_counter() - t0
    tokens += sum(len(e.ids) for e in encodings)
print(json.dumps({"tokens": tokens, "seconds": seconds}))
"""


def raw_tokenizer_rate(tokenizer: str, corpus: Path) -> dict:
    env = {**os.environ, "RAYON_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", RAW_SCRIPT, tokenizer, str(corpus)],
                         check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout)


def run_pipeline(tokenizer: str, corpus: Path, out: Path, seq_len: int) -> dict:
    """A fresh `packfeed pack` process; samples the RSS of its whole process tree."""
    cmd = [sys.executable, "-m", "packfeed.service.cli", "pack", str(corpus), "--tokenizer", tokenizer,
           "--seq-len", str(seq_len), "--output", str(out), "--overwrite",
           "--no-head-start"]  # the pipeline's actors pack every window: their steady rate and memory
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = {"tree": 0, "driver": 0}
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                procs = [root] + root.children(recursive=True)
                rss = {p.pid: p.memory_info().rss for p in procs if p.is_running()}
            except psutil.Error:
                rss = {}
            peak["tree"] = max(peak["tree"], sum(rss.values()))
            peak["driver"] = max(peak["driver"], rss.get(proc.pid, 0))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"packfeed pack failed:\n{stderr[-3000:]}")
    stats = json.loads((out / ".packfeed" / "stats.json").read_text())
    return {**stats, "peak_tree_mb": peak["tree"] / 2**20, "peak_driver_mb": peak["driver"] / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=60_000, help="samples of the 1x corpus")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--quick", action="store_true", help="20k-sample corpus")
    args = parser.parse_args()
    base = 20_000 if args.quick else args.samples

    work = Path(tempfile.mkdtemp(prefix="packfeed-bench-"))
    tokenizer, tokenizer_name = qwen_tokenizer(REPO / "runs" / "bench-cache")
    print(f"tokenizer: {tokenizer_name}; {os.cpu_count()} CPUs; seq_len {args.seq_len}; work dir {work}\n")
    results = []
    for scale in (1, 4):
        corpus = work / f"corpus-{scale}x.jsonl"
        write_corpus(corpus, base * scale, seed=scale)
        raw = raw_tokenizer_rate(tokenizer, corpus)
        stats = run_pipeline(tokenizer, corpus, work / f"out-{scale}x", args.seq_len)
        results.append((scale, corpus, raw, stats))

    header = ("corpus", "samples", "tokens", "windows", "raw 1-core tok/s", "pipeline tok/s (steady)",
              "ratio (steady)", "end-to-end tok/s", "ratio (end-to-end)", "Ray init s", "first row s",
              "peak tree MB", "peak driver MB", "efficiency")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    ratios = []
    for scale, corpus, raw, s in results:
        raw_rate = raw["tokens"] / raw["seconds"]
        steady = s["steady_tokens_per_second"]
        end_to_end = s["tokens"] / s["seconds"]
        if steady > 0:
            ratios.append(steady / raw_rate)
        print(" | ".join([
            f"{scale}x ({corpus.stat().st_size / 2**20:.0f} MB)", f"{s['samples_read']:,}", f"{s['tokens']:,}",
            f"{s['windows']}", f"{raw_rate:,.0f}", f"{steady:,.0f}", f"{steady / raw_rate:.2f}",
            f"{end_to_end:,.0f}", f"{end_to_end / raw_rate:.2f}", f"{s['ray_init_seconds']:.1f}",
            f"{s['first_row_seconds']:.1f}", f"{s['peak_tree_mb']:.0f}", f"{s['peak_driver_mb']:.0f}",
            f"{100 * s['efficiency']:.2f}%",
        ]))
    growth = results[1][3]["peak_tree_mb"] / results[0][3]["peak_tree_mb"]
    print(f"\nthroughput goal (steady state >= 1.5x raw single-core on {os.cpu_count()} CPUs): "
          + (f"{min(ratios):.2f}x {'PASS' if min(ratios) >= 1.5 else 'FAIL'}" if ratios else "run too short to tell"))
    print(f"memory: peak tree RSS 4x corpus / 1x corpus = {growth:.2f} "
          f"({'flat' if growth < 1.15 else 'GROWS'})")


if __name__ == "__main__":
    main()
