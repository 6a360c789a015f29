"""What a packing actor's Parquet part costs per token, per writer setting, against the
settings the part files were written with before issue 54 (``BEFORE``), in one run and one
process.

    taskset -c 1 .venv/bin/python bench/bench_write.py [--tokens 2000000] [--window-samples 8192] [--repeat 3]

Rows: ``bench_chat.py``'s chat-heavy corpus packed by ``process_window`` (Qwen2.5, seq_len
4096, the fast back-end), one part per window as the actors write them. Each setting writes
every window's part ``--repeat`` times, the settings in turn (the ratios hold while the shared
machine's load changes); per setting: the least CPU seconds of the process per million real
tokens over the repeats, the files' MiB per million real tokens, both as ratios to
``BEFORE``, and whether every part reads back (``rows_from_arrow(pq.read_table(...,
schema=ROW_SCHEMA))``, as ``read_packed_dir`` reads it) to the rows written. ``now`` is
``writer.write_part`` itself: what ``packfeed pack`` writes (``BEFORE``'s settings: plain
encodings every Parquet reader reads).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tokenize import REPO, qwen_tokenizer  # noqa: E402
from chat_corpus import chat_tokenizer, write_chat_corpus  # noqa: E402
from report import table  # noqa: E402

# The part files' settings before issue 54 (packed/writer.py's open_part then).
BEFORE = {"compression": "zstd", "use_dictionary": False, "write_statistics": ["row_index"]}
TOKEN_COLUMNS = ["input_ids", "labels", "position_ids"]

def leaf(column: str) -> str:
    """The Parquet path of a list column's values (what per-column settings are keyed by)."""
    return f"{column}.list.element"


def each(columns: list[str], value: str) -> dict[str, str]:
    return {leaf(c): value for c in columns}


# name -> what differs from BEFORE
SETTINGS: dict[str, dict] = {
    "zstd level 3": {"compression_level": 3},
    "zstd level -1": {"compression_level": -1},
    "lz4": {"compression": "lz4"},
    "no compression": {"compression": "none"},
    "data pages v2": {"data_page_version": "2.0"},
    "data pages 8 MiB": {"data_page_size": 8 << 20},
    "write batches 64k values": {"write_batch_size": 1 << 16},
    "position_ids DELTA_BINARY_PACKED": {"column_encoding": each(["position_ids"], "DELTA_BINARY_PACKED")},
    "input_ids, labels BYTE_STREAM_SPLIT": {"column_encoding": each(TOKEN_COLUMNS[:2], "BYTE_STREAM_SPLIT")},
    "token columns BYTE_STREAM_SPLIT": {"column_encoding": each(TOKEN_COLUMNS, "BYTE_STREAM_SPLIT")},
    "input_ids, labels BYTE_STREAM_SPLIT, lz4": {"column_encoding": each(TOKEN_COLUMNS[:2], "BYTE_STREAM_SPLIT"),
                                                 "compression": "lz4"},
}


def window_rows(tokenizer: str, files: list[Path], seq_len: int, window_samples: int) -> list:
    """Every window's rows as a packing actor packs them (one thread)."""
    from packfeed.service.data.config import DataConfig
    from packfeed.service.data.plan import build_plan
    from packfeed.service.pipeline import window as win
    from packfeed.service.tokenize.samples import load_tokenizer

    config = DataConfig.from_inputs([str(f) for f in files], tokenizer=tokenizer, seq_len=seq_len,
                                    window_samples=window_samples, tokenizer_backend="fast")  # fmt: skip
    plan = build_plan(config)
    loaded = load_tokenizer(tokenizer, backend="fast", num_threads=1)
    tokenizers = win.window_tokenizers(config, plan, loaded.ship(), 1)
    return [win.process_window(plan.window(k), tokenizers, config, plan)[0] for k in range(plan.num_windows)]


def write_with(settings: dict | None, rows, path: str, seq_len: int) -> None:
    """One part of ``rows`` at ``path``: ``write_part`` itself (``settings`` None) or BEFORE with
    ``settings`` over it (the schema, metadata, row groups and allocator of ``open_part``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packfeed.service.packed.arrow_rows import PART_SCHEMA, rows_to_arrow
    from packfeed.service.packed.writer import part_metadata, rows_per_group, write_part

    if settings is None:
        write_part(path, rows, seq_len=seq_len, config_hash="bench")
        return
    table_ = rows_to_arrow(rows, PART_SCHEMA)
    schema = table_.schema.with_metadata(part_metadata(seq_len, "bench"))
    with pq.ParquetWriter(path, schema, memory_pool=pa.system_memory_pool(), **{**BEFORE, **settings}) as w:
        w.write_table(table_, row_group_size=rows_per_group(seq_len))


def same_rows(path: str, rows) -> bool:
    import numpy as np
    import pyarrow.parquet as pq

    from packfeed.service.packed.arrow_rows import ROW_SCHEMA, rows_from_arrow

    back = rows_from_arrow(pq.read_table(path, schema=ROW_SCHEMA))
    return all(np.array_equal(getattr(back, f), getattr(rows, f))
               for f in ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "segment_splits",
                         "row_index", "pair_roles"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2_000_000)
    parser.add_argument("--window-samples", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    cache = REPO / "runs" / "bench-cache"
    tokenizer = chat_tokenizer(qwen_tokenizer(cache), cache / "qwen2.5-rewritten")
    files = list(write_chat_corpus(Path(tempfile.mkdtemp(prefix="packfeed-chat-")), args.tokens).values())
    windows = window_rows(tokenizer, files, args.seq_len, args.window_samples)
    tokens = sum(int(r.num_real_tokens) for r in windows)
    out = Path(tempfile.mkdtemp(prefix="packfeed-bench-write-"))
    variants: dict[str, dict | None] = {"before": {}, "now (write_part)": None, **SETTINGS}
    best = dict.fromkeys(variants, float("inf"))
    size, same = {}, {}
    for _ in range(args.repeat):
        for name, settings in variants.items():
            paths = [str(out / f"{i}.parquet") for i in range(len(windows))]
            t0 = time.process_time()
            for rows, path in zip(windows, paths):
                write_with(settings, rows, path, args.seq_len)
            best[name] = min(best[name], time.process_time() - t0)
            size[name] = sum(os.path.getsize(p) for p in paths)
            same[name] = all(same_rows(p, rows) for rows, p in zip(windows, paths))
    per_m = 1e6 / tokens
    lines = [[name, f"{best[name] * per_m:.4f}", f"{best[name] / best['before']:.2f}",
              f"{size[name] / 2**20 * per_m:.2f}", f"{size[name] / size['before']:.2f}",
              "yes" if same[name] else "NO"] for name in variants]
    table(f"## Parquet part writes: {len(windows)} windows of {args.window_samples:,} samples, "
          f"{tokens / 1e6:.2f}M real tokens, seq_len {args.seq_len}, chat-heavy corpus (least of {args.repeat})",
          ["setting", "CPU s per M tokens", "x before", "MiB per M tokens", "size x before", "rows read back"], lines)


if __name__ == "__main__":
    main()
