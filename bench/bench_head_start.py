"""The head start's decision against its outcome (packjob/head_start.py): for corpora of N
tokens and both tokenizer back-ends, did ``packfeed pack`` start Ray only when Ray and its
packing actors made the run finish sooner than the driver alone?

    .venv/bin/python bench/bench_head_start.py            # 1M, 4M, 15M, 40M tokens, fast and hf: ~8 min on 2 cores
    .venv/bin/python bench/bench_head_start.py --quick    # 0.5M, 2M, 6M tokens: ~2 min
    .venv/bin/python bench/bench_head_start.py --tokens 15000000 --backends hf --repeat 3
    .venv/bin/python bench/bench_head_start.py --tokens 40000000 --copies 8 --backends fast   # + ~250M tokens: ~3 min

Corpora: bench_startup.py's mix (text, two-turn chat, prompt/completion; bench_tokenize's
documents: 2/5, 2/5, 1/5 of the tokens) with Qwen2.5's tokenizer, seq_len 4096, windows of the
default 8,192 samples; the smaller corpora are the first lines of each file of the largest, and
``--copies N`` adds the largest N times over (each file repeated: more windows of the same size).
Per corpus and back-end, three fresh ``packfeed pack`` processes with a warm packfeed cache (a
second run on the machine: the tokenizer's snapshot and quicktok's files kept): as a user runs
it (the head start decides), with ``--no-head-start`` (Ray beside the checks, every window on
the actors) and forced to the driver alone (``HeadStart.wants_ray`` answers no: no Ray). The
table: whether the head start started Ray, the windows the driver and the actors packed, each
run's wall seconds (process start to exit), the head start's over the faster of the other two,
and whether its choice was the faster one (within ``--noise``): Ray started for a run the
driver alone finished sooner, or not started for one the actors finished sooner, is "no". A Ray
started while the driver packed every window is "no" too, whatever the seconds. The tokens
column is what was packed (the sizes asked for are the corpus builder's estimate). Wall seconds
of one run drift by 10-20% on this shared machine, and by 2-10 x while other work loads it:
``--repeat`` runs the three in turn that many times and keeps each one's median.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_startup import write_prompt_completion  # noqa: E402
from bench_tokenize import REPO, qwen_tokenizer, write_corpora  # noqa: E402
from report import table  # noqa: E402

SEQ_LEN = 4096
SIZES = (1_000_000, 4_000_000, 15_000_000, 40_000_000)
QUICK_SIZES = (500_000, 2_000_000, 6_000_000)
# the CLI with the head start's question answered "no Ray" (the driver packs every window)
DRIVER_ALONE = (
    "import sys\n"
    "from packfeed.service.packjob import head_start\n"
    "head_start.HeadStart.wants_ray = lambda self, *args, **kwargs: False\n"
    "from packfeed.service.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
MODES = {"head start": ((), None), "actors alone": (("--no-head-start",), None), "driver alone": ((), DRIVER_ALONE)}


def corpus_of(full: list[Path], tokens: int, largest: int, work: Path) -> list[Path]:
    """The first ``tokens / largest`` of each file of the largest corpus (the same mix)."""
    if tokens >= largest:
        return full
    out = work / f"corpus-{tokens}"
    out.mkdir(exist_ok=True)
    parts = []
    for f in full:
        lines = f.read_bytes().splitlines(keepends=True)
        part = out / f.name
        part.write_bytes(b"".join(lines[: max(1, len(lines) * tokens // largest)]))
        parts.append(part)
    return parts


def copies_of(full: list[Path], copies: int, work: Path) -> list[Path]:
    out = work / f"copies-{copies}"
    out.mkdir(exist_ok=True)
    parts = []
    for f in full:
        data = f.read_bytes()
        (out / f.name).write_bytes((data if data.endswith(b"\n") else data + b"\n") * copies)
        parts.append(out / f.name)
    return parts


def pack(inputs: list[Path], tokenizer: str, backend: str, out: Path, cache: Path, mode: str) -> tuple[dict, float]:
    """A fresh `packfeed pack` process: its stats.json and its wall seconds."""
    flags, script = MODES[mode]
    command = ["-c", script] if script else ["-m", "packfeed.service.cli"]
    cmd = [sys.executable, *command, "pack", *map(str, inputs), "--tokenizer", tokenizer, "--seq-len", str(SEQ_LEN),
           "--tokenizer-backend", backend, "--output", str(out), "--overwrite", *flags]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PACKFEED_CACHE_DIR": str(cache)})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"packfeed pack ({mode}) failed:\n{done.stderr[-3000:]}")
    stats = json.loads((out / ".packfeed" / "stats.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return stats, wall


def row(backend: str, runs: dict[str, tuple[dict, float]], noise: float) -> list[str]:
    """The table's row: the head start's choice (Ray and actors, or the driver alone) is right
    when its run took at most ``1 + noise`` times the other choice's."""
    stats, wall = runs["head start"]
    driver, actors = runs["driver alone"][1], runs["actors alone"][1]
    ray = stats["ray_init_seconds"] is not None
    by_driver = stats["driver_windows"]
    by_actors = stats["windows"] - by_driver
    if ray and not by_actors:
        right = "no: Ray started, no window on it"
    elif ray:
        right = "yes" if wall <= driver * (1 + noise) else f"no: the driver alone {driver:.1f} s"
    else:
        right = "yes" if wall <= actors * (1 + noise) else f"no: the actors {actors:.1f} s"
    return [f"{stats['tokens'] / 1e6:.1f}M", backend, str(stats["windows"]),
            f"yes ({stats['ray_init_seconds']:.1f} s)" if ray else "no", f"{by_driver} / {by_actors}",
            f"{wall:.1f}", f"{driver:.1f}", f"{actors:.1f}", f"{driver / actors:.2f}", f"{wall / min(driver, actors):.2f}",
            right]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, action="append", help="a corpus size (repeatable; default: "
                        f"{', '.join(f'{s / 1e6:g}M' for s in SIZES)})")
    parser.add_argument("--quick", action="store_true", help=f"sizes {', '.join(f'{s / 1e6:g}M' for s in QUICK_SIZES)}")
    parser.add_argument("--copies", type=int, default=0, help="also the largest corpus this many times over "
                        "(8: ~250M tokens, 1 GB of JSONL)")
    parser.add_argument("--backends", default="fast,hf")
    parser.add_argument("--repeat", type=int, default=1, help="runs per mode, the median wall seconds kept")
    parser.add_argument("--noise", type=float, default=0.1, help="the head start's choice counts as the faster "
                        "one within this fraction of the other's seconds")
    args = parser.parse_args()
    sizes = sorted(args.tokens or (QUICK_SIZES if args.quick else SIZES))
    backends = args.backends.split(",")
    work = Path(tempfile.mkdtemp(prefix="packfeed-bench-head-start-"))
    try:
        tokenizer = qwen_tokenizer(REPO / "runs" / "bench-cache")
        largest = sizes[-1]
        corpora = write_corpora(work, largest * 2 // 5)
        full = [corpora["text"], corpora["chat"], write_prompt_completion(work, largest // 5)]
        cache = work / "cache"
        rows = []
        for backend in backends:  # a first run per back-end fills packfeed's cache: the runs measured are second runs
            pack(corpus_of(full, sizes[0], largest, work), tokenizer, backend, work / "out", cache, "driver alone")
        runs_on = [corpus_of(full, tokens, largest, work) for tokens in sizes]
        if args.copies > 1:
            runs_on.append(copies_of(full, args.copies, work))
        for inputs in runs_on:
            for backend in backends:
                done: dict[str, list] = {mode: [] for mode in MODES}
                for r in range(args.repeat):  # the modes in turn, each first once: the machine's load drifts
                    for mode in list(MODES)[r % 3:] + list(MODES)[:r % 3]:
                        done[mode].append(pack(inputs, tokenizer, backend, work / "out", cache, mode))
                runs = {}
                for mode, results in done.items():  # the median run of each
                    wall = statistics.median(w for _, w in results)
                    runs[mode] = (min(results, key=lambda d: abs(d[1] - wall))[0], wall)
                rows.append(row(backend, runs, args.noise))
                print(" | ".join(rows[-1]), flush=True)
        table(f"## the head start's choice against its outcome: {os.cpu_count()} cores, Qwen2.5, seq_len {SEQ_LEN}, "
              f"wall seconds per run (median of {args.repeat})", ["tokens", "back-end", "windows", "head start: Ray started",
              "windows: driver / actors", "head start s", "driver alone s", "actors alone s", "driver / actors",
              "head start / faster", "the faster choice"], rows)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
