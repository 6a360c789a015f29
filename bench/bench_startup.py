"""Rows in seconds (issue 25): the raw encoders, `packfeed pack` with each back-end, the start-up
by phase and the time to the first training step, in one run and on the same corpora.

    .venv/bin/python bench/bench_startup.py                 # ~1.5M tokens + the bundled corpus, ~5 min
    .venv/bin/python bench/bench_startup.py --tokens 15000000 --skip-train --full-windows

Corpora: the bundled demo corpus with the bundled tokenizer (seq_len 2048: the quick start),
and a mixed corpus of ``--tokens`` (text, two-turn chat, prompt/completion; bench_tokenize's
documents) with Qwen2.5's tokenizer, seq_len 4096. Per corpus: raw HF ``tokenizers`` and raw
quicktok on one core (the text and chat files, rendered; bench_tokenize.raw_rate), then a fresh
`packfeed pack` process with an empty packfeed cache (the machine's first run with this
tokenizer: transformers loads it, quicktok imports it), then two per back-end with that cache
(the second run on: the tokenizer's snapshot and quicktok's files kept; embedded Ray, one
actor per CPU), as a user runs it (the driver's head start: it packs from the end of its
checks, and Ray starts only if its actors would finish sooner: "no Ray" otherwise) and with
``--no-head-start`` (every window on the actors): whole-run tokens/s per core and the HF /
fast ratio of whole-run seconds, the actors' steady tokens/s per core and their rates per packing
core while packing (stats.json ``core_tokens_per_second``, wall clock: the issue's "steady
tokens/s per packing core"; ``cpu_tokens_per_second``, per CPU-second the actors' processes
spent), each of the raw files alone (text, chat; three copies of it: 8 windows for the 15M mix's)
with the fast back-end and ``--no-head-start``: both rates against raw quicktok on that file
(the goal holds for text and chat alike; with ``--full-windows`` also as many copies as make
10 windows of the default 8,192 samples, a large corpus's windows, where these small corpora
are cut into windows of an eighth of their samples), ``first_row_seconds`` (from the command's
start), ``ray_to_first_row_seconds`` (the issue's goal: <= 3 s) and ``startup_seconds``: the
start-up by phase from its stats.json (pipeline/startup.py). Last, ``packfeed train --config
examples/train_demo.toml`` for 10 steps: seconds from the command's start to its first logged
step, and the data wait of those steps. Ratios are within this run: the machine is shared, compare only rows of one run.

``--corpus multilingual`` (issue 41): instead of the two corpora, bench/multilingual_corpus.py's
corpus of ``--tokens`` (text, chats with a system turn, prompt/completion; 30% of the samples with
NFD snippets; many scripts, emoji, special-token lookalikes), Qwen2.5, seq_len 4096: the same rows,
raw quicktok on all three files (chats rendered, prompt + completion), no per-file runs;
bench_multilingual.py gives one actor's work on it by stage, in one process.

    .venv/bin/python bench/bench_startup.py --corpus multilingual --tokens 15000000 --backends fast --skip-train
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tokenize import REPO, chunks, qwen_tokenizer, raw_rate, write_corpora  # noqa: E402
from report import table  # noqa: E402


def write_prompt_completion(work: Path, tokens: int) -> Path:
    path = work / "prompt_completion.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for name, part, chunk in chunks(3000, int(tokens * 3.8)):
            f.write(json.dumps({"prompt": f"Continue {name}, part {part + 1}:", "completion": chunk},
                               ensure_ascii=False) + "\n")  # fmt: skip
    return path


def pack(inputs: list[Path], tokenizer: str, seq_len: int, backend: str, out: Path,
         window_samples: int | None, cache: Path, *extra: str) -> tuple[dict, float, float]:
    """A fresh `packfeed pack` process with packfeed's cache in ``cache``: its stats.json, its
    wall seconds, and the seconds from its summary's last line to its exit (Ray's shutdown and
    the process's end)."""
    cmd = [sys.executable, "-m", "packfeed.service.cli", "pack", *map(str, inputs), "--tokenizer", tokenizer,
           "--seq-len", str(seq_len), "--tokenizer-backend", backend, "--output", str(out), "--overwrite",
           *(["--window-samples", str(window_samples)] if window_samples else []), *extra]
    start, summary_at = time.perf_counter(), None
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", "PACKFEED_CACHE_DIR": str(cache)})
        for line in proc.stdout:
            if line.startswith("wrote "):
                summary_at = time.perf_counter()
        code = proc.wait()
        end = time.perf_counter()
        if code != 0 or summary_at is None:
            err.seek(0)
            raise RuntimeError(f"packfeed pack failed:\n{err.read().decode()[-3000:]}")
    return json.loads((out / ".packfeed" / "stats.json").read_text()), end - start, end - summary_at


def first_training_step(work: Path) -> dict:
    """`packfeed train` of the demo config for 10 steps, every step logged."""
    out = work / "train"
    cmd = [sys.executable, "-m", "packfeed.service.cli", "train", "--config", str(REPO / "examples/train_demo.toml"),
           "--max-steps", "10", "--log-every", "1", "--checkpoint-every", "0", "--output", str(out), "--overwrite"]
    start = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"packfeed train failed:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if "data_wait" in r]
    wait = sum(r["data_wait"] * r["seconds"] for r in steps) / sum(r["seconds"] for r in steps)
    return {"first_step_s": steps[0]["time"] - start, "data_wait": wait, "wall_s": time.time() - start}


def reader_rate(packed: Path) -> dict:
    """Rows/s one reader process takes from a packed directory (row_stream.PackedDir: what
    ``serve`` and ``train`` read from it), in a fresh process."""
    script = (
        "import json, sys, time\n"
        "from packfeed.service.delivery.row_stream import find_packed_dir, open_stream\n"
        "stream = open_stream(find_packed_dir([sys.argv[1]]))\n"
        "t0, rows, nbytes = time.perf_counter(), 0, 0\n"
        "for _, r in stream.open_reader(0, 0):\n"
        "    rows += r.num_rows; nbytes += r.input_ids.nbytes * 3\n"
        "print(json.dumps({'rows': rows, 'seconds': time.perf_counter() - t0, 'bytes': nbytes}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(packed)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def ray_columns(stats: dict) -> list[str]:
    """"Ray up -> first row" and "Ray start" of a run, "no Ray" when none started (the driver
    packed every window, head_start.py)."""
    if stats.get("ray_init_seconds") is None:
        return ["no Ray", "no Ray"]
    return [f"{stats['ray_to_first_row_seconds']:.2f}", f"{stats['ray_init_seconds']:.2f}"]


ALONE_COPIES = 3
# --full-windows: each raw file alone again, in at least this many windows of the default size (a
# corpus of 64k+ samples; the small corpora above are cut into windows of an eighth of their samples)
FULL_WINDOWS = 10
DEFAULT_WINDOW = 8192


def _rows(f: Path) -> int:
    with f.open("rb") as lines:
        return sum(1 for _ in lines)


def repeated(f: Path, copies: int) -> Path:
    """``f``'s lines ``copies`` times over, for the per-format runs: more windows (8 for the 15M
    mix's files). The steady rate (tokens after the actors' first window over the time after it)
    counts the windows in flight at that instant as if packed after it: over the three or four
    windows of one format of the mix it read 0.19-0.33 x quicktok for chats from one run of the
    same code to the next. The rates per packing core (each window's read-to-written seconds in
    its actor, the actor's first excluded: stats.json ``core_tokens_per_second`` and
    ``cpu_tokens_per_second``) do not depend on when windows arrive."""
    out = f.with_name(f"{f.stem}-x{copies}{f.suffix}")
    if not out.exists():
        data = f.read_bytes()
        out.write_bytes((data if data.endswith(b"\n") else data + b"\n") * copies)
    return out


# The packing actors' rates per core (stats.json): wall clock, read to written less the wait for
# the window before to be numbered, and per CPU-second their processes spent (the wall clock also
# counts the time Ray's and the driver's processes held the core, and writes that wait on the disk).
CORE_RATES = (("per packing core while packing", "core_tokens_per_second"),
              ("per CPU-second of the packing actors", "cpu_tokens_per_second"))


def run_corpus(name: str, inputs: list[Path], raw_files: list[Path], tokenizer: str, seq_len: int,
               work: Path, backends: list[str], window_samples: int | None = None,
               full_windows: bool = False, alone: bool = True) -> None:
    cores = os.cpu_count() or 1
    raw = {k: [raw_rate(k, tokenizer, f) for f in raw_files] for k in ("hf", "fast")}
    rate = {k: sum(r["tokens"] for r in v) / sum(r["seconds"] for r in v) for k, v in raw.items()}
    rows = [[f"raw HF tokenizers, 1 core ({' + '.join(f.stem for f in raw_files)})", f"{rate['hf']:,.0f}", "", "1.00",
             f"{rate['hf'] / rate['fast']:.2f}", "", "", ""],
            [f"raw quicktok, 1 core ({' + '.join(f.stem for f in raw_files)})", f"{rate['fast']:,.0f}", "",
             f"{rate['fast'] / rate['hf']:.2f}", "1.00", "", "", ""]]  # fmt: skip
    phases = {}
    # the first command on this machine for this tokenizer: nothing cached (snapshots.py, quick_cache.py)
    cache = work / f"cache-{len(list(work.glob('cache-*')))}"
    cold, _, _ = pack(inputs, tokenizer, seq_len, backends[-1], work / "out-cold", window_samples, cache)
    rows.append([f"packfeed pack, {backends[-1]}, first run (empty cache)", "", "", "", "",
                 f"{cold['first_row_seconds']:.2f}", *ray_columns(cold)])
    phases[f"{backends[-1]}, empty cache"] = cold.get("startup_seconds", {})
    walls = {}
    for backend in backends:  # the same tokenizer again: its snapshot and quicktok's files cached
        # as a user runs it (the driver's head start), then on the packing actors alone: their steady rate
        for mode, extra in (("", ()), (", actors alone", ("--no-head-start",))):
            stats, wall, tail = pack(inputs, tokenizer, seq_len, backend, work / f"out-{backend}", window_samples,
                                     cache, *extra)
            walls[backend, mode] = wall
            whole = stats["tokens"] / wall / cores
            if stats.get("steady_tokens_per_second"):
                steady = stats["steady_tokens_per_second"] / cores
                rows.append([f"packfeed pack, {backend}{mode}: actors' steady per core", f"{steady:,.0f}", "",
                             f"{steady / rate['hf']:.2f}", f"{steady / rate['fast']:.2f}", "", "", ""])  # fmt: skip
            for label, key in CORE_RATES:
                if stats.get(key):
                    core = stats[key]
                    rows.append([f"packfeed pack, {backend}{mode}: {label}", f"{core:,.0f}", "",
                                 f"{core / rate['hf']:.2f}", f"{core / rate['fast']:.2f}", "", "", ""])  # fmt: skip
            rows.append([f"packfeed pack, {backend}{mode}: whole run per core ({wall:.1f} s, exit {tail:.2f} s after "
                         f"the summary; {stats['driver_windows']}/{stats['windows']} windows by the driver)",
                         f"{whole:,.0f}", "", f"{whole / rate['hf']:.2f}", f"{whole / rate['fast']:.2f}",
                         f"{stats['first_row_seconds']:.2f}", *ray_columns(stats)])  # fmt: skip
            phases[backend + mode] = stats.get("startup_seconds", {})
    if alone and "fast" in backends and len(raw_files) > 1:  # the goal holds for text and chat alike: each alone
        for f, fast_raw in zip(raw_files, raw["fast"]):
            runs = [(ALONE_COPIES, window_samples, "")]
            if full_windows:  # and as a corpus of 64k+ samples is packed: windows of the default 8,192 samples
                runs.append((-(-FULL_WINDOWS * DEFAULT_WINDOW // _rows(f)), None, f" of {DEFAULT_WINDOW:,}"))
            for copies, windows, size in runs:
                alone = repeated(f, copies)
                stats, _, _ = pack([alone], tokenizer, seq_len, "fast", work / "out-one", windows, cache,
                                   "--no-head-start")
                if copies != ALONE_COPIES:
                    alone.unlink()  # hundreds of MB
                own = fast_raw["tokens"] / fast_raw["seconds"]
                for label, key, per in (("actors' steady per core", "steady_tokens_per_second", cores),
                                        *((label, key, 1) for label, key in CORE_RATES)):
                    if stats.get(key):
                        r = stats[key] / per
                        rows.append([f"packfeed pack, fast, actors alone, {f.stem} alone ({copies} copies, "
                                     f"{stats['windows']} windows{size}): {label} (x raw quicktok on {f.stem}: "
                                     f"{r / own:.2f})", f"{r:,.0f}", "", f"{r / rate['hf']:.2f}",
                                     f"{r / rate['fast']:.2f}", "", "", ""])  # fmt: skip
    if {"hf", "fast"} <= set(backends):
        rows.append([f"whole run, HF seconds / fast seconds: {walls['hf', ''] / walls['fast', '']:.2f} "
                     f"(actors alone: {walls['hf', ', actors alone'] / walls['fast', ', actors alone']:.2f})",
                     "", "", "", "", "", "", ""])
    table(f"## {name}: {cores} cores; tokens/s", ["measure", "tokens/s", "", "x raw HF", "x raw quicktok",
          "first row s", "Ray up -> first row s", "Ray start s"], rows)  # fmt: skip
    if "fast" in backends:
        r = reader_rate(work / "out-fast")
        table(f"## {name}: one reader process (row_stream.PackedDir, serve/train's read of a packed directory)",
              ["rows", "rows/s", "token columns MB/s"],
              [[f"{r['rows']:,}", f"{r['rows'] / r['seconds']:,.0f}", f"{r['bytes'] / r['seconds'] / 1e6:,.0f}"]])
    names = list(dict.fromkeys(k for p in phases.values() for k in p))
    table(f"## {name}: start-up by phase (s), stats.json `startup_seconds`", ["back-end", *names, "total"],
          [[b, *(f"{p.get(k, 0):.2f}" for k in names), f"{sum(p.values()):.2f}"] for b, p in phases.items()])


def pc_as_text(path: Path) -> Path:
    """A prompt/completion file as text rows of prompt + completion: what raw quicktok encodes
    of it (bench_tokenize.raw_rate reads text and chat files)."""
    out = path.with_name(path.stem + "-as-text.jsonl")
    with open(path, encoding="utf-8") as src, open(out, "w", encoding="utf-8") as dst:
        for line in src:
            r = json.loads(line)
            dst.write(json.dumps({"text": r["prompt"] + r["completion"]}, ensure_ascii=False) + "\n")
    return out


def run_multilingual(work: Path, args, backends: list[str]) -> None:
    """``--corpus multilingual`` (issue 41): bench/multilingual_corpus.py's text, chats with a
    system turn and prompt/completion, against raw quicktok on all three (chats rendered)."""
    from multilingual_corpus import write_multilingual

    files = write_multilingual(work / "multilingual", args.tokens)
    raw_files = [files["text"], files["chat"], pc_as_text(files["prompt_completion"])]
    run_corpus(f"multilingual corpus (~{args.tokens / 1e6:.1f}M tokens, bench/multilingual_corpus.py), Qwen2.5, "
               "seq_len 4096", list(files.values()), raw_files, qwen_tokenizer(REPO / "runs" / "bench-cache"), 4096,
               work, backends, args.window_samples, alone=False)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_500_000, help="size of the mixed corpus")
    parser.add_argument("--backends", default="hf,fast")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--window-samples", type=int, help="the mix's windows (default: the config's, 8,192)")
    parser.add_argument("--full-windows", action="store_true",
                        help=f"also pack the mix's text and chat files alone in >= {FULL_WINDOWS} windows of "
                             f"{DEFAULT_WINDOW:,} samples (~85M tokens each, ~2 minutes more)")
    parser.add_argument("--corpus", choices=("mixed", "multilingual"), default="mixed",
                        help="mixed: the bundled corpus, then the mix of --tokens; multilingual: "
                             "bench/multilingual_corpus.py's corpus of --tokens alone")
    args = parser.parse_args()
    backends = args.backends.split(",")
    work = Path(tempfile.mkdtemp(prefix="packfeed-bench-startup-"))
    if args.corpus == "multilingual":
        run_multilingual(work, args, backends)
    else:
        run_mixed(work, args, backends)
    if not args.skip_train:
        t = first_training_step(work)
        table("## packfeed train, examples/train_demo.toml, 10 steps", ["first step at s", "data wait, steps 1-10",
              "whole command s"], [[f"{t['first_step_s']:.1f}", f"{t['data_wait']:.0%}", f"{t['wall_s']:.1f}"]])


def run_mixed(work: Path, args, backends: list[str]) -> None:
    """The bundled corpus (bundled tokenizer, seq_len 2048), then the mix of ``--tokens``."""
    from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path

    bundled = [Path(p) for p in demo_corpus_paths()]
    demo_chat = next(p for p in bundled if "chat" in p.name)
    run_corpus("bundled corpus, bundled tokenizer, seq_len 2048", bundled, [demo_chat], demo_tokenizer_path(), 2048,
               work, backends)
    corpora = write_corpora(work, args.tokens * 2 // 5)
    mixed = [corpora["text"], corpora["chat"], write_prompt_completion(work, args.tokens // 5)]
    run_corpus(f"mixed corpus (~{args.tokens / 1e6:.1f}M tokens), Qwen2.5, seq_len 4096", mixed,
               [corpora["text"], corpora["chat"]], qwen_tokenizer(REPO / "runs" / "bench-cache"), 4096, work, backends,
               args.window_samples, args.full_windows)


if __name__ == "__main__":
    main()
