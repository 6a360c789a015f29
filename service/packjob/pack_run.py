"""``run_pack``: a data config's packed rows into a Parquet dataset directory (``packfeed pack``).

::

    DataConfig -> preflight (preflight.py: plan, output, tokenizer, probe; pack's Ray around
                  them: ray_beside.py)
               -> the producers: the driver's head start (head_start.py), the PackingPipeline's
                  actors writing the part files (part_sink.py)
               -> their window outputs, in stream order -> PackReport (pack_report.py)
               -> the writer closed with stats.json, the report on stdout (summary.py)

The checks are every command's, in the same order; pack's Ray is started around them
(ray_beside.py). While an embedded Ray starts (the checks in a thread): the plan
(every input scanned, or its scan reused from the output's ``.packfeed/scan.npz``), the output
location (over no input, ours or empty), the tokenizer (snapshots.py: without transformers from
the second run on), and a probe of every input's first rows (formats detected, a source with no
valid sample refused), then Ray Data's import; a check that fails shuts that Ray down before
its error is raised. With the driver's head start (head_start.py) the driver packs the first
windows from the end of its checks, and an embedded Ray starts only after them, when its
packing actors would finish sooner than the driver alone (no Ray for a small run; Ray Data is
imported only if packing actors start). A cluster to join is joined before the plan (its
nodes scan). A previous output is removed (``overwrite``), and anything written to the output,
only once all of them, Ray and the placement of the packing actors (when Ray starts) passed.
The output may be a local directory or a URI (``s3://bucket/prefix``): packed/writer.py says
how it is written. The packing actors write the rows (one part file per window, numbered
in stream order: the driver holds only the rows of its head start), on a store or a Ray of one
node (``_actors_write``: a local output of a multi-node cluster is the driver's disk, and the
driver writes it); the driver lists the part files before they exist, sums the windows'
accounting (``PackReport``) and writes the metadata last. ``stats.json`` holds the start-up by
phase (``startup_seconds``, startup.py), adding up to ``first_row_seconds``. The
run ends with the packing report on stdout, and a ValueError, saying why, when nothing was
packed, when a source delivered nothing, or when more than the config's ``max_skip_fraction``
of the samples read was bad (the directory is then marked failed).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from packfeed.client.rows import check_rows
from packfeed.service import storage
from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import StreamPlan
from packfeed.service.packed.location import META_DIR, kept_scan
from packfeed.service.packed.writer import ParquetRowWriter, prepare_output
from packfeed.service.packjob.head_start import HeadStart
from packfeed.service.packjob.pack_report import PackReport
from packfeed.service.packed.part_sink import PartSink, RowLedger, part_name
from packfeed.service.pipeline.preflight import Checked, preflight
from packfeed.service.packjob.ray_beside import RayBesideChecks, RayTimes
from packfeed.service.cluster.scaling import PackingScaling, flags_set, place_packing
from packfeed.service.pipeline.startup import StartupClock
from packfeed.service.pipeline.stats import RunStats, new_run_stats
from packfeed.service.pipeline.summary import format_summary, run_failure
from packfeed.service.progress import Progress

logger = logging.getLogger("packfeed")


def run_pack(config: DataConfig, output: str | Path, *, scaling: PackingScaling = PackingScaling(),
             address: str | None = None, overwrite: bool = False, validate: bool = False,
             progress_seconds: float = 10.0, head_start: bool = True) -> dict[str, Any]:
    """Pack ``config`` into ``output`` (an absolute path or a URI) with the packing actors
    ``scaling`` on the Ray at ``address`` (see ``init_ray``); returns the stats written to its
    stats.json. ``validate`` checks every row against the row convention; ``progress_seconds``:
    seconds between progress lines (no TTY); ``head_start``: the driver packs the first
    windows while an embedded Ray starts (head_start.py)."""
    clock = StartupClock()  # first: every figure of the report counts from here
    output = os.fspath(output)
    unused = flags_set(scaling) + (["--address local"] if address == "local" else [])

    def driver_packs(checked: Checked, shipped: Any) -> HeadStart:
        return HeadStart(config, checked.plan, shipped, output=output, validate=validate, clock=clock, scaling=scaling)

    def check_output(plan: StreamPlan) -> bool:
        prepare_output(output, inputs=_read_paths(config, plan), overwrite=overwrite, clear=False)
        return True

    ray = RayBesideChecks(address, clock, scaling, driver_packs if head_start else None)
    # the scan manifest the output kept, used (and updated) in a copy: nothing is written to the
    # output before every check passed
    with kept_scan(output) as (scan_cache, publish_scan):
        checked = preflight(config, ray, scan_cache=scan_cache, check_plan=check_output, clock=clock)

        def open_writer() -> ParquetRowWriter:
            writer = ParquetRowWriter(output, seq_len=config.seq_len, config_hash=config.config_hash(),
                                      overwrite=overwrite, inputs=_read_paths(config, checked.plan))
            publish_scan()
            return writer

        try:
            return _pack(config, checked, ray, scaling, open_writer, clock, output=output, validate=validate,
                         progress_seconds=progress_seconds, unused=unused)
        finally:
            if ray.head is not None:
                ray.head.abandon()  # a failed run: the driver packs and writes no more (a finished one: no-op)


def _read_paths(config: DataConfig, plan: StreamPlan) -> list[str]:
    """The files read, and the directories and URIs given: an output may not be, hold or lie
    inside any (a glob on a store: nor where it would read the output at a later run)."""
    given = [p for p in config.inputs if storage.is_remote(p) or os.path.isdir(p)]
    return [f.path for s in plan.sources for f in s.files] + given


@dataclass
class _Producers:
    """Who packs which windows: the driver's head start (``head``: the windows before
    ``start_window``, and those it claims after; None: none), the packing actors of
    ``pipeline`` (from ``start_window``; None: none), which write their part files through
    ``sink`` (None: the driver writes their rows, or there are no actors); ``total``: the
    run's accounting."""

    head: HeadStart | None
    pipeline: Any
    sink: PartSink | None
    start_window: int
    total: RunStats


def _choose_producers(config: DataConfig, plan: StreamPlan, scaling: PackingScaling, ray: RayBesideChecks, *,
                      output: str, validate: bool) -> _Producers:
    times, head = ray.times, ray.head
    sink, start_window = None, 0  # the driver packs windows 0 .. start_window - 1
    if times.up is None:  # no Ray started (head start): the driver packs every window
        start_window = plan.num_windows
    elif _actors_write(output):
        sink = PartSink(output, seq_len=config.seq_len, config_hash=config.config_hash(),
                        num_windows=plan.num_windows, ledger=RowLedger.new(), validate=validate,
                        driver_claims=head is not None)
        if head is not None:
            start_window = head.hand_over(sink.ledger)
            if start_window is None:  # the driver finishes sooner alone
                start_window = plan.num_windows
    elif head is not None:  # not on an embedded Ray (one node): the pipeline packs every window
        head.abandon()
        head = None
    total = new_run_stats(plan)
    pipeline = None
    if start_window < plan.num_windows:
        from packfeed.service.pipeline.ray_pipeline import PackingPipeline  # imports Ray: only when actors pack

        pipeline = PackingPipeline(config, plan, scaling=place_packing(scaling, num_windows=plan.num_windows - start_window),
                                   start_window=start_window, stats=total, sink=sink, tokenizer=ray.shipped)
    return _Producers(head, pipeline, sink, start_window, total)


def _pack(config: DataConfig, checked: Checked, ray: RayBesideChecks, scaling: PackingScaling,
          open_writer: Callable[[], ParquetRowWriter], clock: StartupClock, *, output: str, validate: bool,
          progress_seconds: float, unused: list[str] = ()) -> dict[str, Any]:
    """Choose the producers, read their windows' outputs in stream order into the report, close
    the writer with it."""
    plan = checked.plan
    producers = _choose_producers(config, plan, scaling, ray, output=output, validate=validate)
    head, pipeline, sink = producers.head, producers.pipeline, producers.sink
    parts = ray.times.up is None or sink is not None  # a part file per window, by the process that packed it
    # every check passed (inputs, tokenizer, probe, Ray, placement): only now may overwrite
    # remove the previous output
    writer = open_writer()
    if parts:
        writer.list_parts([part_name(k, plan.num_windows) for k in range(plan.num_windows)])
    if head is not None:
        head.release()
    clock.mark("pipeline")
    num_workers = pipeline.num_workers if pipeline is not None else 0
    _say_start(plan, producers, ray.times, writer, unused)
    progress = Progress("packfeed pack", plan.samples_per_epoch * plan.epochs, seq_len=config.seq_len,
                        interval_s=progress_seconds)
    report = PackReport(plan, producers.total, clock, ray.times, parts=parts)
    try:
        for out in _outputs(pipeline, head, producers.start_window, writer if sink is None else None, validate):
            report.add(out)
            if out.num_rows:
                progress.update(samples=report.samples_started + (pipeline.samples_started if pipeline else 0),
                                rows=report.rows, tokens=report.tokens)
    except BaseException:
        writer.abandon()  # the run failed: nothing marks the output complete
        if head is not None and head.error is not None:
            raise head.error from None  # the pipeline's first window failed on it (or waited): the cause
        raise
    finally:
        if sink is not None:
            sink.ledger.close()
    progress.close()
    stats = report.to_stats(seq_len=config.seq_len, num_workers=num_workers, end=time.perf_counter())
    return _close(config, checked, writer, stats, report, validate=validate)


def _say_start(plan: StreamPlan, producers: _Producers, ray: RayTimes, writer: ParquetRowWriter,
               unused: list[str]) -> None:
    """The run's first lines: what is packed, by whom, to where; flags the driver did not need."""
    pipeline = producers.pipeline
    num_workers = pipeline.num_workers if pipeline is not None else 0
    if pipeline is not None and pipeline.num_workers > len(pipeline.windows):
        logger.warning("%d windows for %d packing workers: some workers idle", len(pipeline.windows), pipeline.num_workers)
    logger.info("packing %s samples (%d epoch(s)) in %d windows of %s %s -> %s",
                f"{plan.samples_per_epoch * plan.epochs:,}", plan.epochs, plan.num_windows,
                f"{plan.window_samples:,}", _packers(num_workers, producers.head is not None, producers.start_window,
                                                     plan.num_windows, ray.up is not None),
                storage.display(writer.out_dir))
    if pipeline is None and unused:  # checked to fit (check_packing), then not needed
        logger.info("%s unused: the driver packed every window, sooner than %s would have started", ", ".join(unused),
                    "packing actors" if ray.up is not None else "Ray and packing actors")


def _close(config: DataConfig, checked: Checked, writer: ParquetRowWriter, stats: dict[str, Any], report: PackReport,
           *, validate: bool) -> dict[str, Any]:
    """The metadata written last, the output marked complete (or failed, and ValueError saying
    why: ``run_failure``), the report on stdout."""
    plan, tokenizer = checked.plan, checked.tokenizer
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
                 written=report.files)
    print(format_summary(stats))
    if failure is not None:
        raise ValueError(failure)
    if validate:
        logger.info("validated %s rows against the row convention: all correct", f"{report.rows:,}")
    print(f"wrote {stats['rows']:,} rows in {writer.num_files} file(s) to {storage.display(writer.out_dir)} "
          f"(metadata in {META_DIR}/)")
    return stats


def _outputs(pipeline, head, start_window: int, writer, validate: bool):
    """Every window's output in stream order: the driver's (``head``: the windows before
    ``start_window``, and those it claimed after, which the pipeline gives back as the
    driver's), the actors'. The actors write their part files (``writer`` None) or give the
    driver the rows to write. The pipeline is started first: its actors start while the
    driver packs and writes."""
    if pipeline is None:
        for k in range(start_window):
            yield head.window(k)
        return
    stream = pipeline.iter_written() if writer is None else _written_by_driver(pipeline, writer, validate)
    first = next(stream, None)  # the actors start now
    for k in range(start_window):
        yield head.window(k)
    if first is not None:
        for out in itertools.chain([first], stream):
            yield head.window(out.window) if out.stats is None else out


def _packers(num_workers: int, head_start: bool, start_window: int, num_windows: int, ray_up: bool) -> str:
    """Who packs: "on 2 workers", "on 2 workers and the driver (3 windows so far)"."""
    if not ray_up:
        return "on the driver (sooner than starting Ray and packing actors: no Ray started)"
    if start_window == num_windows:
        return "on the driver (sooner than starting packing actors)"
    if not head_start:
        return f"on {num_workers} workers"
    return f"on {num_workers} workers and the driver ({start_window} window(s) while Ray started)"


def _actors_write(output: str) -> bool:
    """Whether the packing actors write the part files: on a store, or on a Ray of one node
    (embedded, or one machine's): a local output of a multi-node cluster is the driver's disk,
    which only the driver writes (its rows cross Ray to it, as they did before)."""
    import ray  # only once Ray is up

    return storage.is_remote(output) or sum(bool(n.get("Alive")) for n in ray.nodes()) <= 1


def _written_by_driver(pipeline, writer, validate: bool):
    """The stream's windows written by the driver (``_actors_write`` false), as the actors'
    ``WrittenWindow``s would say them (``stats`` None: the rest of a window Ray split)."""
    from packfeed.service.pipeline.ray_pipeline import WrittenWindow  # imports Ray: a pipeline runs

    for out in pipeline.iter_windows():
        rows = out.rows
        if rows.num_rows:
            if validate:
                check_rows(rows, pipeline.config.seq_len)
            writer.write(rows)
        if out.stats is not None or rows.num_rows:
            yield WrittenWindow(out.window, rows.num_rows, rows.num_real_tokens, None, out.stats, None)
