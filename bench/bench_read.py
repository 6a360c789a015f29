"""Reading a window's JSONL records (issue 54, item 3): the typed decode (typed_records.py)
against the general path alone (msgspec's decode into dicts, records.py's parser), the same
lines in the same run and process.

    taskset -c 1 .venv/bin/python bench/bench_read.py [--tokens 1000000] [--repeat 5]

Corpora: ``chat_corpus.py``'s (chats with a system turn, Python source text,
prompt/completion) and ``multilingual_corpus.py``'s (30% of the samples with NFD snippets,
many scripts: most lines not ASCII), one source per file, format ``auto``; and each corpus's
chats with an ``id`` field beside the record (a line that is not ASCII is then refused, and a
piece stops trying after ``read.TYPED_TRIAL`` lines). Per file: CPU
seconds per line of ``read_window`` over the whole file (one window), the least of
``--repeat``, the typed decoders on and replaced by ones that refuse every line, the settings
in turn; the share of lines the typed decode took; that both gave the same records and skips.
``--windows``: then a packing actor's windows of the chat-heavy corpus (``process_window``,
Qwen2.5 with ``chat_corpus``'s rewritten template, seq_len 4096, 8,192 samples, the first left
out), each packed both ways in turn, four times: the median CPU seconds per window.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat_corpus import write_chat_corpus  # noqa: E402
from multilingual_corpus import write_multilingual  # noqa: E402
from report import table  # noqa: E402


def window_of(path: Path):
    from packfeed.service.inputs.read import Piece, WindowSpec

    num_rows = sum(1 for _ in open(path, "rb"))
    piece = Piece(path=str(path), kind="jsonl", format="auto", source=0, start_row=0, num_rows=num_rows,
                  first_sample_id=0)
    return WindowSpec(index=0, epoch=0, pieces=(piece,)), num_rows


def windows_both_ways(files: list[Path], repeat: int = 4) -> dict[str, float]:
    """Median CPU seconds of ``process_window`` per window, typed decoders on and off in turn."""
    import statistics

    from bench_tokenize import REPO, qwen_tokenizer
    from chat_corpus import chat_tokenizer

    from packfeed.service.data.config import DataConfig
    from packfeed.service.data.plan import build_plan
    from packfeed.service.inputs import read
    from packfeed.service.pipeline import window as win
    from packfeed.service.tokenize.samples import load_tokenizer

    cache = REPO / "runs" / "bench-cache"
    tokenizer = chat_tokenizer(qwen_tokenizer(cache), cache / "qwen2.5-rewritten")
    config = DataConfig.from_inputs([str(f) for f in files], tokenizer=tokenizer, seq_len=4096, window_samples=8192,
                                    tokenizer_backend="fast")  # fmt: skip
    plan = build_plan(config)
    tokenizers = win.window_tokenizers(config, plan, load_tokenizer(tokenizer, backend="fast", num_threads=1).ship(), 1)
    ways = {"typed": read.TYPED_DECODERS, "general": {fmt: (lambda line: None) for fmt in read.TYPED_DECODERS}}
    win.process_window(plan.window(0), tokenizers, config, plan)  # the proof and first-use costs
    seconds = {way: [] for way in ways}
    for rep in range(repeat):
        for k in range(1, plan.num_windows):
            for way in sorted(ways, reverse=rep % 2 == 1):
                read.TYPED_DECODERS = ways[way]
                t0 = time.process_time()
                win.process_window(plan.window(k), tokenizers, config, plan)
                seconds[way].append(time.process_time() - t0)
    read.TYPED_DECODERS = ways["typed"]
    return {way: statistics.median(s) for way, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--windows", action="store_true", help="also a packing actor's windows both ways")
    args = parser.parse_args()
    from packfeed.service.inputs import read

    work = Path(tempfile.mkdtemp(prefix="packfeed-bench-read-"))
    files = {f"chat-heavy {k}": p for k, p in write_chat_corpus(work / "chat", args.tokens).items()}
    files |= {f"multilingual {k}": p for k, p in write_multilingual(work / "ml", args.tokens).items()}
    for name in ("chat-heavy chat", "multilingual chat"):  # other fields beside the record's
        with_id = work / f"{name.replace(' ', '-')}-id.jsonl"
        with_id.write_text("".join(json.dumps({"id": i, **json.loads(line)}, ensure_ascii=False) + "\n"
                                   for i, line in enumerate(open(files[name], encoding="utf-8"))), encoding="utf-8")
        files[f"{name}, an id field"] = with_id
    typed = read.TYPED_DECODERS
    general = {fmt: (lambda line: None) for fmt in typed}
    rows = []
    for name, path in files.items():
        spec, n = window_of(path)
        best = {"typed": float("inf"), "general": float("inf")}
        out = {}
        for _ in range(args.repeat):
            for way, decoders in (("typed", typed), ("general", general)):
                read.TYPED_DECODERS = decoders
                t0 = time.process_time()
                out[way] = read.read_window(spec)
                best[way] = min(best[way], time.process_time() - t0)
        read.TYPED_DECODERS = typed
        same = ([json.dumps(r) for r in out["typed"].records] == [json.dumps(r) for r in out["general"].records]
                and out["typed"].skips == out["general"].skips)
        lines = open(path, "rb").read().splitlines()
        taken = sum(typed["auto"](line) is not None for line in lines)
        rows.append([name, f"{n:,}", f"{best['general'] / n * 1e6:.2f}", f"{best['typed'] / n * 1e6:.2f}",
                     f"{best['general'] / best['typed']:.2f}", f"{taken / n:.0%}", "yes" if same else "NO"])
    table(f"## read_window over each file (one window, format auto), CPU us per line, least of {args.repeat}",
          ["file", "lines", "general path", "typed decode", "general / typed", "lines typed", "same records, skips"],
          rows)
    if args.windows:
        chat_files = list(write_chat_corpus(work / "windows", 3 * args.tokens).values())
        median = windows_both_ways(chat_files)
        table("## process_window on the chat-heavy corpus, windows of 8,192 samples, median CPU s per window",
              ["general path", "typed decode", "typed / general"],
              [[f"{median['general']:.4f}", f"{median['typed']:.4f}", f"{median['typed'] / median['general']:.2f}"]])


if __name__ == "__main__":
    main()
