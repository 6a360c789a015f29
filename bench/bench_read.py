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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
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


if __name__ == "__main__":
    main()
