"""The packing actor's work per core on a chat-heavy corpus (issue 54), against raw quicktok on
one core on the same texts, in one run and one process.

    taskset -c 1 .venv/bin/python bench/bench_chat.py --tokens 1000000 [--window-samples 1024,8192] [--profile 25]

Corpus: bench/chat_corpus.py (61% of the samples short chats with a system turn, Python source
text, prompt/completion), Qwen2.5's tokenizer with a chat template that renders as Qwen2.5's
but is written differently (``chat_corpus.QWEN_REWRITTEN``: no template hash knows it), seq_len
4096, one source per file, windows of each ``--window-samples``.

Measured per window size, each way the collector can run (``python``: its default thresholds;
``actor``: as the packing actors run it, pipeline/collector.py: set-up frozen, windows with the
collector paused): what a packing actor does per window (``process_window``: read, tokenize,
pack, assemble; then the Parquet part written), on one thread, the first window (the fast
back-end's proof) left out: tokens/s, its ratio to raw quicktok ``encode_batch`` on one thread
on each window's texts (chats rendered by the template; prompt + completion), timed right after
the window (the ratio holds while the shared machine's load changes); the collector's passes and
seconds inside the windows (``gc.callbacks``); the process's RSS after the last window. Then each
format's samples alone through ``SampleTokenizer.tokenize`` against raw quicktok on that file,
and how the chat samples were tokenized (``ChatRenderer.paths``: from their turns, rendered in
Python, through Jinja; why a template took the slower path). ``--profile N`` prints cProfile's
top N functions of the last run's windows. Every time is the process's CPU time (one thread: the
work, not the shared machine's queue).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_multilingual import reference_texts, sample_texts  # noqa: E402
from bench_tokenize import REPO, qwen_tokenizer  # noqa: E402
from chat_corpus import chat_tokenizer, write_chat_corpus  # noqa: E402
from report import CHAT_PATH_HEADER, chat_path_rows, raw_quicktok, table  # noqa: E402


class CollectorClock:
    """The collector's passes and seconds while ``on`` (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.on, self.passes, self.seconds, self._t0 = False, 0, 0.0, 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if not self.on:
            return
        if phase == "start":
            self._t0 = time.process_time()
        else:
            self.passes += 1
            self.seconds += time.process_time() - self._t0


def actor_windows(tokenizer: str, files: list[Path], seq_len: int, window_samples: int, collector: str,
                  clock: CollectorClock, prof: cProfile.Profile | None) -> dict:
    """A packing actor's windows in this process (one thread), the collector run as ``collector``
    says: tokens, seconds, raw quicktok's tokens and seconds on each window's texts, the
    collector's passes and seconds, RSS after."""
    import psutil
    from transformers import AutoTokenizer

    from packfeed.service.data.config import DataConfig
    from packfeed.service.data.plan import build_plan
    from packfeed.service.inputs.read import read_window
    from packfeed.service.packed.writer import ParquetRowWriter
    from packfeed.service.pipeline import collector as gc_policy
    from packfeed.service.pipeline import window as win
    from packfeed.service.tokenize.samples import load_tokenizer

    config = DataConfig.from_inputs([str(f) for f in files], tokenizer=tokenizer, seq_len=seq_len,
                                    window_samples=window_samples, tokenizer_backend="fast")  # fmt: skip
    plan = build_plan(config)
    loaded = load_tokenizer(tokenizer, backend="fast", num_threads=1)
    tokenizers = win.window_tokenizers(config, plan, loaded.ship(), 1)  # as the driver ships it
    tok = AutoTokenizer.from_pretrained(tokenizer)
    out = tempfile.mkdtemp(prefix="packfeed-bench-chat-")
    writer = ParquetRowWriter(out, seq_len=seq_len, config_hash=config.config_hash(), overwrite=True)
    gc.unfreeze()
    gc.collect()
    if collector == "actor":
        gc_policy.freeze_setup()
    paused = gc_policy.collector_paused if collector == "actor" else _as_is
    seconds, tokens, raw_seconds, raw_tokens = 0.0, 0, 0.0, 0
    for k in range(plan.num_windows):
        spec = plan.window(k)
        clock.on = k > 0
        if prof and k:
            prof.enable()
        t0 = time.process_time()
        with paused():
            rows, _ = win.process_window(spec, tokenizers, config, plan)
            writer.write(rows)
        t1 = time.process_time()
        if prof:
            prof.disable()
        clock.on = False
        texts = reference_texts(tok, read_window(spec).records)
        quick = next(iter(tokenizers.values()))._encoders.encoder.quick
        t2 = time.process_time()
        n = len(quick.encode_batch(texts, 1, False)[0])
        t3 = time.process_time()
        if k == 0:  # the proof and first-use costs
            continue
        seconds += t1 - t0
        tokens += int(rows.num_real_tokens)
        raw_seconds += t3 - t2
        raw_tokens += n
    writer.close(config={}, stats={})
    gc.unfreeze()
    paths = chat_path_rows(tokenizers)
    return {"tokens": tokens, "seconds": seconds, "raw_tokens": raw_tokens, "raw_seconds": raw_seconds,
            "windows": plan.num_windows - 1, "rss": psutil.Process().memory_info().rss, "paths": paths}


def per_format(tokenizer: str, files: list[Path], seq_len: int) -> dict[str, tuple[int, float]]:
    """Each file's samples alone through ``SampleTokenizer.tokenize`` (fast, one thread), three
    times, the best of the last two: (tokens, CPU seconds)."""
    from packfeed.service.data.config import DataConfig
    from packfeed.service.data.plan import build_plan
    from packfeed.service.inputs.read import read_window
    from packfeed.service.tokenize.samples import load_tokenizer

    st = load_tokenizer(tokenizer, backend="fast", num_threads=1)
    out = {}
    for f in files:
        config = DataConfig.from_inputs([str(f)], tokenizer=tokenizer, seq_len=seq_len, window_samples=1 << 30)
        raw = read_window(build_plan(config).window(0))
        st.tokenize(raw)
        best = None
        for _ in range(2):
            t0 = time.process_time()
            samples = st.tokenize(raw)
            best = min(best or 1e9, time.process_time() - t0)
        out[f.stem] = (len(samples.tokens), best)
    return out


class _as_is:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--window-samples", default="1024,8192", help="comma-separated window sizes")
    parser.add_argument("--collector", default="python,actor", help="python, actor or both (comma-separated)")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions of the windows")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from packfeed.service.tokenize.fast.backend import load_fast

    cache = REPO / "runs" / "bench-cache"
    tokenizer = chat_tokenizer(qwen_tokenizer(cache), cache / "qwen2.5-rewritten")
    files = list(write_chat_corpus(Path(tempfile.mkdtemp(prefix="packfeed-chat-")), args.tokens).values())
    tok = AutoTokenizer.from_pretrained(tokenizer)
    quick = load_fast(tok.backend_tokenizer, threads=1)[0].quick
    raw = {f.stem: raw_quicktok(quick, sample_texts(tok, f), clock=time.process_time) for f in files}
    clock = CollectorClock()
    prof = cProfile.Profile() if args.profile else None
    rows, paths = [], []
    for w in [int(x) for x in args.window_samples.split(",")]:
        for collector in args.collector.split(","):
            clock.passes, clock.seconds = 0, 0.0
            run = actor_windows(tokenizer, files, args.seq_len, w, collector, clock, prof)
            rate, beside = run["tokens"] / run["seconds"], run["raw_tokens"] / run["raw_seconds"]
            rows.append([f"{w:,}", collector, f"{run['windows']}", f"{rate:,.0f}", f"{beside:,.0f}",
                         f"{rate / beside:.2f}", f"{clock.passes} ({clock.seconds / run['seconds']:.0%})",
                         f"{run['rss'] / 2**20:,.0f}"])
            paths = run["paths"]
    table(f"## chat-heavy corpus (~{args.tokens / 1e6:.1f}M tokens), Qwen2.5 with a rewritten template, "
          f"seq_len {args.seq_len}, one core: a packing actor's windows (the first left out)",
          ["window samples", "collector", "windows", "actor tokens/s", "raw quicktok tokens/s", "x raw quicktok",
           "collector passes (share of the windows' time)", "RSS after, MiB"], rows)
    per_kind = []
    for k, (n, s) in per_format(tokenizer, files, args.seq_len).items():
        own = raw[k][0] / raw[k][1]
        per_kind.append([k.removeprefix("chat_"), f"{n / s:,.0f}", f"{own:,.0f}", f"{n / s / own:.2f}"])
    table("## each format alone through SampleTokenizer.tokenize (fast, one thread)",
          ["kind", "tokenize tokens/s", "raw quicktok tokens/s, same texts", "x raw quicktok"], per_kind)
    table("## how the chat samples were tokenized (the last run's actor)", CHAT_PATH_HEADER, paths)
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(args.profile)


if __name__ == "__main__":
    main()
