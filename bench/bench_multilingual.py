"""The packing actor's work per core on the multilingual corpus (issue 41, item 4), against raw
quicktok on one core on the same texts, in one run and one process each.

    taskset -c 1 .venv/bin/python bench/bench_multilingual.py --tokens 2000000 [--profile 25]

Corpus: bench/multilingual_corpus.py (text, chats with a system turn, prompt/completion; 30% of
the samples with NFD snippets; scripts, emoji, special-token lookalikes), Qwen2.5's tokenizer,
seq_len 4096, one source, windows of ``--window-samples``. Reference: raw quicktok
``encode_batch`` on one thread of the same samples as texts (text; prompt + completion; chats
rendered by the chat template), ordinary text (no special-token scan), timing only the calls,
on each window's texts right after the window (the ratio then holds while the shared machine's
load changes), and on the whole files (best of 3) beside it.
Measured: what a packing actor does per window (``process_window``: read, tokenize, pack,
assemble; then the Parquet part written), on one thread, the first window (the fast back-end's
proof) left out: tokens/s and its ratio to raw quicktok, and where the time goes, per stage and
per format (the format's samples alone through ``SampleTokenizer.tokenize``). ``--profile N``
prints cProfile's top N functions of the windows. ``packfeed pack`` on the actors is
bench_startup.py's ``--corpus multilingual``. Measured (2.5M tokens, one core, bench/README.md):
0.25 x raw quicktok before edges in NFC-changed text mapped through the normalization
(service/tokenize/fast/nfc_edges.py; HF had answered every such text), 0.39 x after.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tokenize import REPO, qwen_tokenizer  # noqa: E402
from multilingual_corpus import write_multilingual  # noqa: E402
from report import CHAT_PATH_HEADER, chat_path_rows, raw_quicktok, table  # noqa: E402


def sample_texts(tok, path: Path) -> list[str]:
    """The samples of one file as the raw reference encodes them."""
    texts = []
    with open(path, encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines]
    for r in rows:
        if "messages" in r:
            texts.append(tok.apply_chat_template(r["messages"], tokenize=False))
        elif "prompt" in r:
            texts.append(r["prompt"] + r["completion"])
        else:
            texts.append(r["text"])
    return texts


def reference_texts(tok, records: list) -> list[str]:
    """A window's records as the raw reference encodes them (``sample_texts``)."""
    from packfeed.service.inputs.records import PromptCompletion

    return [r if type(r) is str else r.prompt + r.completion if type(r) is PromptCompletion
            else tok.apply_chat_template(r.messages, tokenize=False) for r in records]


def actor_windows(tokenizer: str, files: list[Path], seq_len: int, window_samples: int, profile: int) -> dict:
    """A packing actor's windows in this process (one thread): seconds per stage and tokens,
    and raw quicktok on each window's texts right after it ("raw_tokens", "raw_seconds"): the
    ratio holds while the machine's load changes (a shared machine)."""
    from transformers import AutoTokenizer

    from packfeed.service.data.config import DataConfig
    from packfeed.service.data.plan import build_plan
    from packfeed.service.inputs.read import read_window
    from packfeed.service.packed.writer import ParquetRowWriter
    from packfeed.service.pipeline import window as win
    from packfeed.service.tokenize.samples import load_tokenizer

    config = DataConfig.from_inputs([str(f) for f in files], tokenizer=tokenizer, seq_len=seq_len,
                                    window_samples=window_samples, tokenizer_backend="fast")  # fmt: skip
    plan = build_plan(config)
    loaded = load_tokenizer(tokenizer, backend="fast", num_threads=1)
    tokenizers = win.window_tokenizers(config, plan, loaded.ship(), 1)  # as the driver ships it
    tok = AutoTokenizer.from_pretrained(tokenizer)
    out = tempfile.mkdtemp(prefix="packfeed-bench-ml-")
    writer = ParquetRowWriter(out, seq_len=seq_len, config_hash=config.config_hash(), overwrite=True)
    t = dict.fromkeys(("read", "tokenize", "pack + assemble", "Parquet", "raw_seconds"), 0.0)
    tokens, raw_tokens, prof = 0, 0, cProfile.Profile() if profile else None
    for k in range(plan.num_windows):
        spec = plan.window(k)
        if k == 1 and prof:
            prof.enable()
        t0 = time.perf_counter()
        raw = read_window(spec)
        t1 = time.perf_counter()
        win._tokenize(raw, [(m, tokenizers[m]) for m in win._loss_modes(raw, plan)], plan)
        t2 = time.perf_counter()
        rows, _ = win.process_window(spec, tokenizers, config, plan)  # the whole window, again: its rows
        t3 = time.perf_counter()
        writer.write(rows)
        t4 = time.perf_counter()
        if prof:
            prof.disable()
        texts = reference_texts(tok, raw.records)
        quick = next(iter(tokenizers.values()))._encoders.encoder.quick
        t5 = time.perf_counter()
        n = len(quick.encode_batch(texts, 1, False)[0])
        t6 = time.perf_counter()
        if prof and k:
            prof.enable()
        if k == 0:  # the proof and first-use costs
            continue
        t["read"] += t1 - t0
        t["tokenize"] += t2 - t1
        t["pack + assemble"] += max(0.0, (t3 - t2) - (t2 - t0))
        t["Parquet"] += t4 - t3
        t["raw_seconds"] += t6 - t5
        tokens += int(rows.num_real_tokens)
        raw_tokens += n
    if prof and plan.num_windows > 1:
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(profile)
    writer.close(config={}, stats={})
    return {"tokens": tokens, "raw_tokens": raw_tokens, **t, "paths": chat_path_rows(tokenizers)}


def per_format(tokenizer: str, files: list[Path], seq_len: int) -> dict[str, tuple[int, float]]:
    """Each file's samples alone through ``SampleTokenizer.tokenize`` (fast, one thread), twice,
    the second timed: (tokens, seconds)."""
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
        t0 = time.perf_counter()
        samples = st.tokenize(raw)
        out[f.stem] = (len(samples.tokens), time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2_000_000)
    parser.add_argument("--window-samples", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions of the windows")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from packfeed.service.tokenize.fast.backend import load_fast

    tokenizer = qwen_tokenizer(REPO / "runs" / "bench-cache")
    files = list(write_multilingual(Path(tempfile.mkdtemp(prefix="packfeed-ml-")), args.tokens).values())
    tok = AutoTokenizer.from_pretrained(tokenizer)
    quick = load_fast(tok.backend_tokenizer, threads=1)[0].quick
    raw = {f.stem: raw_quicktok(quick, sample_texts(tok, f)) for f in files}
    ref = sum(n for n, _ in raw.values()) / sum(s for _, s in raw.values())
    actor = actor_windows(tokenizer, files, args.seq_len, args.window_samples, args.profile)
    stages = {k: v for k, v in actor.items() if k not in ("tokens", "raw_tokens", "raw_seconds", "paths")}
    busy = sum(stages.values())
    rate, beside = actor["tokens"] / busy, actor["raw_tokens"] / actor["raw_seconds"]
    rows = [["raw quicktok, 1 thread, after each window, on its texts", f"{beside:,.0f}", "1.00", ""],
            [f"packing actor's windows, 1 thread ({actor['tokens']:,} tokens; first window left out)", f"{rate:,.0f}",
             f"{rate / beside:.2f}", ", ".join(f"{k} {v / busy:.0%}" for k, v in stages.items())],
            ["raw quicktok, 1 thread, whole files (best of 3)", f"{ref:,.0f}", f"{ref / beside:.2f}", ""]]
    rows += [[f"raw quicktok, {k}", f"{n / s:,.0f}", f"{n / s / beside:.2f}", ""] for k, (n, s) in raw.items()]
    for k, (n, s) in per_format(tokenizer, files, args.seq_len).items():
        own = raw[k][0] / raw[k][1]
        rows.append([f"tokenize alone, {k}", f"{n / s:,.0f}", f"{n / s / beside:.2f}",
                     f"x raw quicktok on {k} (whole file): {n / s / own:.2f}"])
    table(f"## multilingual corpus (~{args.tokens / 1e6:.1f}M tokens), Qwen2.5, seq_len {args.seq_len}, one core",
          ["measure", "tokens/s", "x raw quicktok", "where the time goes"], rows)
    table("## how the actor's chat samples were tokenized (each window tokenized twice: once timed alone)",
          CHAT_PATH_HEADER, actor["paths"])


if __name__ == "__main__":
    main()
