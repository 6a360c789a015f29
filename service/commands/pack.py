"""``packfeed pack``: tokenize and pack a data config into a Parquet dataset directory.

    packfeed pack INPUT... --tokenizer T --seq-len L --output DIR [data flags]
    packfeed pack --config data.toml --output DIR

Before Ray starts: the config, the plan (every input scanned), the output directory, the
tokenizer, and a probe of every input's first rows (formats detected, a source with no valid
sample refused); a previous output is removed (``--overwrite``) only once all of them passed. Then the rows stream into DIR with progress, and the run ends with the
packing report. It exits non-zero, saying why, when nothing was packed, when a source
delivered nothing, or when more than ``--max-skip-fraction`` of the samples read was bad.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from packfeed.service.commands.args import (
    add_data_arguments,
    data_config_from_args,
    load_config_file,
    packing_from_args,
    place_packing,
    positive_number,
    resolve_output,
)

HELP = "tokenize and pack inputs into a Parquet dataset directory"
ORDER = 0
logger = logging.getLogger("packfeed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--output", type=Path, required=True, help="directory for part-*.parquet (and .packfeed/ metadata)")
    out.add_argument("--overwrite", action="store_true", help="replace a previous packfeed output in --output")
    out.add_argument("--validate", action="store_true", help="check every row against the row convention")
    out.add_argument("--progress-seconds", type=float, default=10.0, help="seconds between progress lines (no TTY)")


def run(args: argparse.Namespace) -> int:
    from packfeed.service.data.plan import build_plan
    from packfeed.service.data.probe import describe, probe
    from packfeed.service.tokenize.samples import load_tokenizer
    from packfeed.service.packed.writer import ParquetRowWriter, prepare_output

    positive_number("--progress-seconds", args.progress_seconds)
    base = load_config_file(args.config)
    config = data_config_from_args(args, base)
    packing = packing_from_args(args, base)
    output = resolve_output(args.output)
    plan = build_plan(config)
    # the files read, and the directories given: an output may not be, hold or lie inside any
    inputs = [f.path for s in plan.sources for f in s.files] + [p for p in config.inputs if os.path.isdir(p)]
    prepare_output(output, inputs=inputs, overwrite=args.overwrite, clear=False)
    tokenizer = load_tokenizer(config.tokenizer, loss=config.loss, add_eos=config.add_eos,
                               backend=config.tokenizer_backend)
    for line in describe(probe(plan, tokenizer), plan):  # and the chat template on the rows it read
        logger.info(line)
    tokenizer.check_backend()  # under auto, a fast back-end refused at load is said now, before Ray

    def open_writer() -> ParquetRowWriter:
        return ParquetRowWriter(output, seq_len=config.seq_len, config_hash=config.config_hash(),
                                overwrite=args.overwrite, inputs=inputs)

    return _pack(args, config, plan, packing, open_writer, tokenizer)


def _pack(args, config, plan, packing, open_writer, tokenizer) -> int:
    from packfeed.client.rows import check_rows
    from packfeed.service.pipeline.ray_pipeline import PackingPipeline
    from packfeed.service.progress import Progress
    from packfeed.service.pipeline.raycluster import init_ray
    from packfeed.service.pipeline.stats import format_summary, run_failure

    start = time.perf_counter()
    logger.info(init_ray(args.address))
    ray_init_seconds = time.perf_counter() - start
    scaling = place_packing(packing, num_windows=plan.num_windows)
    pipeline = PackingPipeline(config, plan, scaling=scaling)
    # every check passed (inputs, tokenizer, probe, Ray, placement): only now may --overwrite
    # remove the previous output
    writer = open_writer()
    if pipeline.num_workers > len(pipeline.windows):
        logger.warning("%d windows for %d packing workers: some workers idle", len(pipeline.windows), pipeline.num_workers)
    logger.info("packing %s samples (%d epoch(s)) in %d windows of %s on %d workers -> %s",
                f"{plan.samples_per_epoch * plan.epochs:,}", plan.epochs, plan.num_windows,
                f"{plan.window_samples:,}", pipeline.num_workers, writer.out_dir)
    progress = Progress("packfeed pack", plan.samples_per_epoch * plan.epochs, seq_len=config.seq_len,
                        interval_s=args.progress_seconds)
    rows_written = tokens = first_tokens = 0
    first_row_at = None
    epoch_first_rows = []  # global row of each epoch's first window
    for out in pipeline.iter_windows():
        if out.stats is not None and out.window % plan.windows_per_epoch == 0:
            epoch_first_rows.append(rows_written)
        rows = out.rows
        if not rows.num_rows:
            continue
        if args.validate:
            check_rows(rows, config.seq_len)
        writer.write(rows)
        rows_written += rows.num_rows
        tokens += rows.num_real_tokens
        if first_row_at is None:
            first_row_at, first_tokens = time.perf_counter(), tokens
        progress.update(samples=pipeline.samples_started, rows=rows_written, tokens=tokens)
    progress.close()
    end = time.perf_counter()
    total = pipeline.stats
    total.check_accounting()
    total.check_complete(plan.num_windows, plan.epochs)
    stats = total.to_dict(seq_len=config.seq_len, seconds=end - start)
    stats["first_row_seconds"] = round((first_row_at or end) - start, 3)
    stats["steady_tokens_per_second"] = _steady_rate(tokens - first_tokens, first_row_at, end, len(pipeline.windows))
    stats["ray_init_seconds"] = round(ray_init_seconds, 3)
    stats["num_workers"] = pipeline.num_workers
    stats["epoch_rows"] = [b - a for a, b in zip(epoch_first_rows, epoch_first_rows[1:] + [rows_written])]
    failure = run_failure(stats, config.max_skip_fraction)
    meta = {
        "data": config.to_dict(), "config_hash": config.config_hash(),
        "tokenizer": {"name": tokenizer.name, "pad_id": tokenizer.pad_id, "vocab_size": tokenizer.vocab_size},
        "plan": {"epochs": plan.epochs, "windows_per_epoch": plan.windows_per_epoch, "window_samples": plan.window_samples,
                 "samples_per_epoch": plan.samples_per_epoch, "sources": plan.summary()},
    }  # fmt: skip
    writer.close(config=meta, stats=stats, status="complete" if failure is None else f"failed: {failure}")
    print(format_summary(stats))
    if failure is not None:
        raise ValueError(failure)
    if args.validate:
        logger.info("validated %s rows against the row convention: all correct", f"{rows_written:,}")
    print(f"wrote {stats['rows']:,} rows in {writer.num_files} file(s) to {writer.out_dir} "
          f"(metadata in {writer.meta.name}/)")
    return 0


def _steady_rate(tokens: int, first_row_at: float | None, end: float, windows: int) -> float | None:
    """Tokens/s once rows flow: the tokens after the first block over the time after it
    (start-up excluded); None when one window made the whole run."""
    if first_row_at is None or windows < 2 or end <= first_row_at:
        return None
    return tokens / (end - first_row_at)
