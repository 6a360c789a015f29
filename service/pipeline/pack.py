"""``run_pack``: a data config's packed rows into a Parquet dataset directory (``packfeed pack``).

::

    DataConfig -> StreamPlan -> check_inputs (before Ray) -> PackingPipeline -> ParquetRowWriter
                                                                             -> stats.json, report

Before Ray starts: the plan (every input scanned, or its scan reused from the output's
``.packfeed/scan.npz``), the output location (over no input, ours or empty), the tokenizer, and
a probe of every input's first rows (formats detected, a source with no valid sample refused);
a previous output is removed (``overwrite``), and anything written to the output, only once all
of them, Ray and the placement of the packing actors passed. The output may be a
local directory or a URI (``s3://bucket/prefix``): packed/writer.py says how it is written. The
run ends with the packing report on stdout, and a ValueError, saying why, when nothing was
packed, when a source delivered nothing, or when more than the config's ``max_skip_fraction``
of the samples read was bad (the directory is then marked failed).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from packfeed.service import storage
from packfeed.service.data.config import DataConfig
from packfeed.service.pipeline.scaling import PackingScaling

logger = logging.getLogger("packfeed")


def run_pack(config: DataConfig, output: str | Path, *, scaling: PackingScaling = PackingScaling(),
             address: str | None = None, overwrite: bool = False, validate: bool = False,
             progress_seconds: float = 10.0) -> dict[str, Any]:
    """Pack ``config`` into ``output`` (an absolute path or a URI) with the packing actors
    ``scaling`` on the Ray at ``address`` (see ``init_ray``); returns the stats written to its
    stats.json. ``validate`` checks every row against the row convention; ``progress_seconds``:
    seconds between progress lines (no TTY)."""
    from packfeed.service.data.plan import build_plan
    from packfeed.service.data.probe import check_inputs
    from packfeed.service.packed.location import kept_scan
    from packfeed.service.packed.writer import ParquetRowWriter, prepare_output
    from packfeed.service.tokenize.samples import load_tokenizer

    output = os.fspath(output)
    joined = _join_first(address)
    # the scan manifest the output kept, used (and updated) in a copy: nothing is written to the
    # output before every check passed
    with kept_scan(output) as (scan_cache, publish_scan):
        plan = build_plan(config, scan_cache=scan_cache)
        # the files read, and the directories and URIs given: an output may not be, hold or lie
        # inside any (a glob on a store: nor where it would read the output at a later run)
        given = [p for p in config.inputs if storage.is_remote(p) or os.path.isdir(p)]
        inputs = [f.path for s in plan.sources for f in s.files] + given
        prepare_output(output, inputs=inputs, overwrite=overwrite, clear=False)
        tokenizer = load_tokenizer(config.tokenizer, loss=config.loss, add_eos=config.add_eos,
                                   backend=config.tokenizer_backend)
        check_inputs(plan, tokenizer)

        def open_writer() -> ParquetRowWriter:
            writer = ParquetRowWriter(output, seq_len=config.seq_len, config_hash=config.config_hash(),
                                      overwrite=overwrite, inputs=inputs)
            publish_scan()
            return writer

        return _pack(config, plan, scaling, open_writer, tokenizer, address=address, validate=validate,
                     progress_seconds=progress_seconds, joined=joined)


def _join_first(address: str | None) -> float | None:
    """Join a cluster before planning (``joins_a_cluster``: the scan runs on its nodes); the
    seconds it took, None when Ray starts after the plan."""
    from packfeed.service.pipeline.raycluster import init_ray, joins_a_cluster

    if not joins_a_cluster(address):
        return None
    start = time.perf_counter()
    logger.info(init_ray(address))
    return time.perf_counter() - start


def _pack(config, plan, scaling, open_writer, tokenizer, *, address, validate, progress_seconds,
          joined: float | None = None) -> dict[str, Any]:
    from packfeed.client.rows import check_rows
    from packfeed.service.pipeline.ray_pipeline import PackingPipeline
    from packfeed.service.pipeline.raycluster import init_ray
    from packfeed.service.pipeline.scaling import place_packing
    from packfeed.service.packed.location import META_DIR
    from packfeed.service.pipeline.stats import format_summary, run_failure
    from packfeed.service.progress import Progress

    start = time.perf_counter()
    if joined is None:
        logger.info(init_ray(address))
    ray_init_seconds = time.perf_counter() - start if joined is None else joined
    pipeline = PackingPipeline(config, plan, scaling=place_packing(scaling, num_windows=plan.num_windows))
    # every check passed (inputs, tokenizer, probe, Ray, placement): only now may overwrite
    # remove the previous output
    writer = open_writer()
    if pipeline.num_workers > len(pipeline.windows):
        logger.warning("%d windows for %d packing workers: some workers idle", len(pipeline.windows), pipeline.num_workers)
    logger.info("packing %s samples (%d epoch(s)) in %d windows of %s on %d workers -> %s",
                f"{plan.samples_per_epoch * plan.epochs:,}", plan.epochs, plan.num_windows,
                f"{plan.window_samples:,}", pipeline.num_workers, storage.display(writer.out_dir))
    progress = Progress("packfeed pack", plan.samples_per_epoch * plan.epochs, seq_len=config.seq_len,
                        interval_s=progress_seconds)
    rows_written = tokens = first_tokens = 0
    first_row_at = None
    epoch_first_rows = []  # global row of each epoch's first window
    try:
        for out in pipeline.iter_windows():
            if out.stats is not None and out.window % plan.windows_per_epoch == 0:
                epoch_first_rows.append(rows_written)
            rows = out.rows
            if not rows.num_rows:
                continue
            if validate:
                check_rows(rows, config.seq_len)
            writer.write(rows)
            rows_written += rows.num_rows
            tokens += rows.num_real_tokens
            if first_row_at is None:
                first_row_at, first_tokens = time.perf_counter(), tokens
            progress.update(samples=pipeline.samples_started, rows=rows_written, tokens=tokens)
    except BaseException:
        writer.abandon()  # the run failed: the part being written ends now, and nothing marks it complete
        raise
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
    if validate:
        logger.info("validated %s rows against the row convention: all correct", f"{rows_written:,}")
    print(f"wrote {stats['rows']:,} rows in {writer.num_files} file(s) to {storage.display(writer.out_dir)} "
          f"(metadata in {META_DIR}/)")
    return stats


def _steady_rate(tokens: int, first_row_at: float | None, end: float, windows: int) -> float | None:
    """Tokens/s once rows flow: the tokens after the first block over the time after it
    (start-up excluded); None when one window made the whole run."""
    if first_row_at is None or windows < 2 or end <= first_row_at:
        return None
    return tokens / (end - first_row_at)
