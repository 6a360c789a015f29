"""``run_pack``: a data config's packed rows into a Parquet dataset directory (``packfeed pack``).

::

    DataConfig -> StreamPlan -> check_inputs (before Ray) -> PackingPipeline, its actors writing
                                                             the part files (part_sink.py)
                                                          -> the driver: counts, stats.json, report

While an embedded Ray starts (the checks in a thread: ``_check_while_ray_starts``): the plan
(every input scanned, or its scan reused from the output's ``.packfeed/scan.npz``), the output
location (over no input, ours or empty), the tokenizer (snapshots.py: without transformers from
the second run on), and a probe of every input's first rows (formats detected, a source with no
valid sample refused), then Ray Data's import; a check that fails shuts that Ray down before its
error is raised. A cluster to join is joined before the plan (its nodes scan). A previous output is
removed (``overwrite``), and anything written to the output, only once all of them, Ray and the
placement of the packing actors passed. The output may be a
local directory or a URI (``s3://bucket/prefix``): packed/writer.py says how it is written. The
packing actors write the rows (one part file per window, numbered in stream order: the driver
never holds a row), on a store or a Ray of one node (``_actors_write``: a local output of a
multi-node cluster is the driver's disk, and the driver writes it); the driver lists the part files before they exist, sums the windows'
accounting and writes the metadata last. ``stats.json`` holds the start-up by phase
(``startup_seconds``, startup.py), adding up to ``first_row_seconds``. The
run ends with the packing report on stdout, and a ValueError, saying why, when nothing was
packed, when a source delivered nothing, or when more than the config's ``max_skip_fraction``
of the samples read was bad (the directory is then marked failed).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

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
    from packfeed.service.pipeline.startup import StartupClock
    from packfeed.service.tokenize.samples import load_tokenizer

    clock = StartupClock()
    output = os.fspath(output)
    joined = _join_first(address, clock)
    # the scan manifest the output kept, used (and updated) in a copy: nothing is written to the
    # output before every check passed
    with kept_scan(output) as (scan_cache, publish_scan):

        def check() -> tuple[Any, list[str], Any]:
            plan = build_plan(config, scan_cache=scan_cache)
            clock.mark("plan")
            # the files read, and the directories and URIs given: an output may not be, hold or
            # lie inside any (a glob on a store: nor where it would read the output at a later run)
            given = [p for p in config.inputs if storage.is_remote(p) or os.path.isdir(p)]
            inputs = [f.path for s in plan.sources for f in s.files] + given
            prepare_output(output, inputs=inputs, overwrite=overwrite, clear=False)
            tokenizer = load_tokenizer(config.tokenizer, snapshot=True, loss=config.loss, add_eos=config.add_eos,
                                       backend=config.tokenizer_backend)
            clock.mark("tokenizer_load")
            check_inputs(plan, tokenizer)
            clock.mark("probe")
            _import_pipeline()
            clock.mark("pipeline_imports")
            return plan, inputs, tokenizer

        if joined is None:
            (plan, inputs, tokenizer), ray = _check_while_ray_starts(check, address, clock)
        else:
            (plan, inputs, tokenizer), ray = check(), RayTimes(time.perf_counter(), time.perf_counter(), joined)

        def open_writer() -> ParquetRowWriter:
            writer = ParquetRowWriter(output, seq_len=config.seq_len, config_hash=config.config_hash(),
                                      overwrite=overwrite, inputs=inputs)
            publish_scan()
            return writer

        return _pack(config, plan, scaling, open_writer, tokenizer, clock, ray, output=output, validate=validate,
                     progress_seconds=progress_seconds)


def _import_pipeline() -> None:
    """Import what building the pipeline imports (Ray Data, ~0.4 s on this machine) in the
    checks' thread, while an embedded Ray is still starting, not after it is up."""
    import ray.data

    import packfeed.service.pipeline.part_sink  # noqa: F401
    import packfeed.service.pipeline.ray_pipeline  # noqa: F401

    ray.data.DataContext.get_current()  # its first call imports Ray Data's issue detectors


@dataclass(frozen=True)
class RayTimes:
    """When Ray's start began and ended (``time.perf_counter``), and its seconds (a cluster
    joined before the plan: the join's; this process's own Ray: 0)."""

    began: float
    up: float
    seconds: float


def _check_while_ray_starts(check: Callable[[], Any], address: str | None, clock) -> tuple[Any, RayTimes]:
    """``check()`` (plan, tokenizer, probe) in a thread while this thread starts the embedded
    Ray (seconds of its processes' start-up, mostly waiting): its result and the Ray's times.

    Ray starts in the main thread: its processes get the kernel's parent-death signal when the
    thread that started them ends, and its driver shuts down slowly (measured: 10 s more) from
    another thread than the one that started it. A check that fails shuts the Ray down before
    its error is raised (a refused command leaves no Ray; it answers once Ray is up, seconds
    later than a check alone: the price of the overlap); a check's error comes before Ray's."""
    from packfeed.service.pipeline.raycluster import init_ray, ray_initialised, shutdown_ray

    if ray_initialised():  # this process's own Ray (tests, Ray jobs)
        result = check()
        logger.info(init_ray(address))
        now = time.perf_counter()
        return result, RayTimes(now, now, 0.0)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = check()
        except BaseException as exc:  # raised in the main thread
            outcome["error"] = exc

    checking = threading.Thread(target=run, name="packfeed-checks", daemon=True)
    checking.start()
    began = time.perf_counter()
    try:
        line = init_ray(address)
    except Exception:
        checking.join()
        if "error" in outcome:
            raise outcome["error"] from None  # the user's to fix first
        raise
    up = time.perf_counter()
    logger.info(line)
    checking.join()
    if "error" in outcome:
        shutdown_ray()
        raise outcome["error"]
    clock.mark("ray_start")
    return outcome["result"], RayTimes(began, up, up - began)


def _join_first(address: str | None, clock) -> float | None:
    """Join a cluster before planning (``joins_a_cluster``: the scan runs on its nodes); the
    seconds it took, None when an embedded Ray starts while the checks run."""
    from packfeed.service.pipeline.raycluster import init_ray, joins_a_cluster

    if not joins_a_cluster(address):
        return None
    start = time.perf_counter()
    logger.info(init_ray(address))
    clock.mark("ray_start")
    return time.perf_counter() - start


def _pack(config, plan, scaling, open_writer, tokenizer, clock, ray: RayTimes, *, output, validate,
          progress_seconds) -> dict[str, Any]:
    from packfeed.service.pipeline.part_sink import PartSink, RowLedger, part_name
    from packfeed.service.pipeline.ray_pipeline import PackingPipeline
    from packfeed.service.pipeline.scaling import place_packing
    from packfeed.service.packed.location import META_DIR
    from packfeed.service.pipeline.stats import format_summary, run_failure
    from packfeed.service.progress import Progress

    start, ray_init_seconds = ray.began, ray.seconds  # the run's time counts from Ray's start
    sink = None
    if _actors_write(output):
        sink = PartSink(output, seq_len=config.seq_len, config_hash=config.config_hash(),
                        num_windows=plan.num_windows, ledger=RowLedger.new(), validate=validate)
    pipeline = PackingPipeline(config, plan, scaling=place_packing(scaling, num_windows=plan.num_windows), sink=sink,
                               tokenizer=tokenizer.ship())
    # every check passed (inputs, tokenizer, probe, Ray, placement): only now may overwrite
    # remove the previous output
    writer = open_writer()
    if sink is not None:
        writer.list_parts([part_name(k, plan.num_windows) for k in pipeline.windows])
    clock.mark("pipeline")
    if pipeline.num_workers > len(pipeline.windows):
        logger.warning("%d windows for %d packing workers: some workers idle", len(pipeline.windows), pipeline.num_workers)
    logger.info("packing %s samples (%d epoch(s)) in %d windows of %s on %d workers -> %s",
                f"{plan.samples_per_epoch * plan.epochs:,}", plan.epochs, plan.num_windows,
                f"{plan.window_samples:,}", pipeline.num_workers, storage.display(writer.out_dir))
    progress = Progress("packfeed pack", plan.samples_per_epoch * plan.epochs, seq_len=config.seq_len,
                        interval_s=progress_seconds)
    rows_written = tokens = first_tokens = 0
    first_row_at = first_row_wall = None
    first_actor = None  # the start-up of the actor that wrote the first window
    epoch_first_rows = []  # global row of each epoch's first window
    written = [] if sink is not None else None  # the part files the actors wrote, in stream order
    try:
        for out in pipeline.iter_written() if sink is not None else _written_by_driver(pipeline, writer, validate):
            if out.window == pipeline.windows[0]:
                first_actor = out.timings
            if out.stats is not None and out.window % plan.windows_per_epoch == 0:  # a window's first output
                epoch_first_rows.append(rows_written)
            if not out.num_rows:
                continue
            if written is not None:
                written.append(out.file)
            rows_written += out.num_rows
            tokens += out.tokens
            if first_row_at is None:
                first_row_at, first_row_wall, first_tokens = time.perf_counter(), time.time(), tokens
            progress.update(samples=pipeline.samples_started, rows=rows_written, tokens=tokens)
    except BaseException:
        writer.abandon()  # the run failed: nothing marks the output complete
        raise
    finally:
        if sink is not None:
            sink.ledger.close()
    progress.close()
    end = time.perf_counter()
    total = pipeline.stats
    total.check_accounting()
    total.check_complete(plan.num_windows, plan.epochs)
    stats = total.to_dict(seq_len=config.seq_len, seconds=end - start)
    startup = clock.phases(first_actor, first_row_wall or time.time())
    stats["first_row_seconds"] = round(sum(startup.values()), 3)
    stats["ray_to_first_row_seconds"] = round((first_row_at or end) - ray.up, 3)
    stats["startup_seconds"] = startup
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
    if plan.schedule:  # where each schedule entry took effect
        meta["plan"]["stages"] = plan.stage_summary()
    writer.close(config=meta, stats=stats, status="complete" if failure is None else f"failed: {failure}",
                 written=written)
    print(format_summary(stats))
    if failure is not None:
        raise ValueError(failure)
    if validate:
        logger.info("validated %s rows against the row convention: all correct", f"{rows_written:,}")
    print(f"wrote {stats['rows']:,} rows in {writer.num_files} file(s) to {storage.display(writer.out_dir)} "
          f"(metadata in {META_DIR}/)")
    return stats


def _actors_write(output: str) -> bool:
    """Whether the packing actors write the part files: on a store, or on a Ray of one node
    (embedded, or one machine's): a local output of a multi-node cluster is the driver's disk,
    which only the driver writes (its rows cross Ray to it, as they did before)."""
    import ray

    return storage.is_remote(output) or sum(bool(n.get("Alive")) for n in ray.nodes()) <= 1


def _written_by_driver(pipeline, writer, validate: bool):
    """The stream's windows written by the driver (``_actors_write`` false), as the actors'
    ``WrittenWindow``s would say them (``stats`` None: the rest of a window Ray split)."""
    from packfeed.client.rows import check_rows
    from packfeed.service.pipeline.ray_pipeline import WrittenWindow

    for out in pipeline.iter_windows():
        rows = out.rows
        if rows.num_rows:
            if validate:
                check_rows(rows, pipeline.config.seq_len)
            writer.write(rows)
        if out.stats is not None or rows.num_rows:
            yield WrittenWindow(out.window, rows.num_rows, rows.num_real_tokens, None, out.stats, None)


def _steady_rate(tokens: int, first_row_at: float | None, end: float, windows: int) -> float | None:
    """Tokens/s once rows flow: the tokens after the first block over the time after it
    (start-up excluded); None when one window made the whole run."""
    if first_row_at is None or windows < 2 or end <= first_row_at:
        return None
    return tokens / (end - first_row_at)
