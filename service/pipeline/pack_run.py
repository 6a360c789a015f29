"""``run_pack``: a data config's packed rows into a Parquet dataset directory (``packfeed pack``).

::

    DataConfig -> StreamPlan -> check_inputs (before Ray) -> PackingPipeline, its actors writing
                                                             the part files (part_sink.py)
                                                          -> the driver: counts, stats.json, report

While an embedded Ray starts (the checks in a thread: ``_check_while_ray_starts``): the plan
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
accounting and writes the metadata last. ``stats.json`` holds the start-up by phase
(``startup_seconds``, startup.py), adding up to ``first_row_seconds``. The
run ends with the packing report on stdout, and a ValueError, saying why, when nothing was
packed, when a source delivered nothing, or when more than the config's ``max_skip_fraction``
of the samples read was bad (the directory is then marked failed).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from packfeed.service import storage
from packfeed.service.data.config import DataConfig
from packfeed.service.pipeline.scaling import PackingScaling, check_packing, flags_set

logger = logging.getLogger("packfeed")


def run_pack(config: DataConfig, output: str | Path, *, scaling: PackingScaling = PackingScaling(),
             address: str | None = None, overwrite: bool = False, validate: bool = False,
             progress_seconds: float = 10.0, head_start: bool = True) -> dict[str, Any]:
    """Pack ``config`` into ``output`` (an absolute path or a URI) with the packing actors
    ``scaling`` on the Ray at ``address`` (see ``init_ray``); returns the stats written to its
    stats.json. ``validate`` checks every row against the row convention; ``progress_seconds``:
    seconds between progress lines (no TTY); ``head_start``: the driver packs the first
    windows while an embedded Ray starts (head_start.py)."""
    from packfeed.service.pipeline.startup import StartupClock

    clock = StartupClock()  # first: every figure of the report counts from here
    from packfeed.service.data.plan import build_plan
    from packfeed.service.data.probe import check_inputs
    from packfeed.service.pipeline.head_start import HeadStart
    from packfeed.service.packed.location import kept_scan
    from packfeed.service.packed.writer import ParquetRowWriter, prepare_output
    from packfeed.service.tokenize.samples import load_tokenizer

    output = os.fspath(output)
    joined = _join_first(address, clock)
    # the packing actors checked against the Ray joined, or the one that would start, before the
    # head start decides whether it starts: the same flags fail the same way on any corpus
    check_packing(scaling)
    unused = flags_set(scaling) + (["--address local"] if address == "local" else [])
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
            if not head_start or joined is not None:  # a head start packs now; Ray Data only if its actors start
                _import_pipeline()
                clock.mark("pipeline_imports")
            return plan, inputs, tokenizer, tokenizer.ship()

        def driver_packs(checked: tuple) -> HeadStart:
            plan, _, _, shipped = checked
            return HeadStart(config, plan, shipped, output=output, validate=validate, clock=clock, scaling=scaling)

        head = None
        if joined is None:
            (plan, inputs, tokenizer, shipped), ray, head = _check_while_ray_starts(
                check, address, clock, driver_packs if head_start else None)
        else:
            (plan, inputs, tokenizer, shipped), ray = check(), joined

        def open_writer() -> ParquetRowWriter:
            writer = ParquetRowWriter(output, seq_len=config.seq_len, config_hash=config.config_hash(),
                                      overwrite=overwrite, inputs=inputs)
            publish_scan()
            return writer

        try:
            return _pack(config, plan, scaling, open_writer, tokenizer, shipped, clock, ray, head, output=output,
                         validate=validate, progress_seconds=progress_seconds, unused=unused)
        finally:
            if head is not None:
                head.abandon()  # a failed run: the driver packs and writes no more (a finished one: no-op)


def _import_pipeline() -> None:
    """Import what building the pipeline imports (Ray Data, ~0.4 s on this machine) in the
    checks' thread, while an embedded Ray is still starting, not after it is up."""
    import ray.data

    import packfeed.service.pipeline.part_sink  # noqa: F401
    import packfeed.service.pipeline.ray_pipeline  # noqa: F401

    ray.data.DataContext.get_current()  # its first call imports Ray Data's issue detectors


@dataclass(frozen=True)
class RayTimes:
    """When the run began (the command's start, ``StartupClock.began``: every figure of the
    report counts from it, whichever Ray) and Ray was up (``time.perf_counter``; None: no Ray
    started, the driver packs every window; this process's own Ray: up from the start), and
    Ray's start in seconds (a cluster joined before the plan: the join's; this process's own Ray: 0).

    Before, a joined cluster's (and this process's own Ray's) run counted from the end of
    its checks: a Ray job's report said ``seconds 6.75`` with its first row at 9.22."""

    began: float
    up: float | None
    seconds: float


def _check_while_ray_starts(check: Callable[[], Any], address: str | None, clock,
                            then: Callable[[Any], Any] | None = None) -> tuple[Any, RayTimes, Any]:
    """``check()`` (plan, tokenizer, probe) in a thread while this thread starts the embedded
    Ray (seconds of its processes' start-up, mostly waiting): its result, the Ray's times and
    the driver's head start (``then(result)``, whose ``run`` the thread goes on with; None: none).

    With a head start Ray starts only once the checks passed and the driver's first window
    says packing actors would help (``HeadStart.wants_ray``): a run the driver packs sooner
    alone starts no Ray at all (``RayTimes.up`` None), and a refused command answers at once.
    A larger run starts its Ray that much later (the checks, ~1-1.5 s on 2 cores, and a part of
    the first window) than it would beside the checks.

    Ray starts in the main thread: its processes get the kernel's parent-death signal when the
    thread that started them ends, and its driver shuts down slowly (measured: 10 s more) from
    another thread than the one that started it. Without a head start a check that fails shuts
    the Ray down before its error is raised (a refused command leaves no Ray; it answers once
    Ray is up, seconds later than a check alone: the price of the overlap); a check's error
    comes before Ray's."""
    from packfeed.service.pipeline.raycluster import init_ray, ray_initialised, shutdown_ray

    if ray_initialised():  # this process's own Ray (tests, Ray jobs): no start to overlap
        result = check()
        logger.info(init_ray(address))
        return result, RayTimes(clock.began, clock.began, 0.0), None
    outcome: dict[str, Any] = {}
    checked = threading.Event()

    def run() -> None:
        try:
            outcome["result"] = check()
            outcome["head"] = then(outcome["result"]) if then is not None else None
        except BaseException as exc:  # raised in the main thread
            outcome["error"] = exc
        finally:
            checked.set()
        if outcome.get("head") is not None:
            outcome["head"].run()

    checking = threading.Thread(target=run, name="packfeed-checks", daemon=True)
    began = clock.began
    checking.start()
    if then is not None:  # the head start: Ray only when its packing actors would help
        checked.wait()
        if "error" in outcome:
            raise outcome["error"]
        head = outcome["head"]
        if not head.wants_ray():
            if head.error is not None:  # its first window failed: nothing is written
                head.abandon()
                raise head.error
            return outcome["result"], RayTimes(began, None, 0.0), head
    ray_began = time.perf_counter()
    try:
        line = init_ray(address, quiet_driver_stderr=True)
    except Exception:
        checked.wait()
        if outcome.get("head") is not None:
            outcome["head"].abandon()
        if "error" in outcome:
            raise outcome["error"] from None  # the user's to fix first
        raise
    up = time.perf_counter()
    logger.info(line)
    checked.wait()
    if "error" in outcome:
        shutdown_ray()
        raise outcome["error"]
    clock.mark("ray_start")
    return outcome["result"], RayTimes(began, up, up - ray_began), outcome["head"]


def _join_first(address: str | None, clock) -> RayTimes | None:
    """Join a cluster before planning (``joins_a_cluster``: the scan runs on its nodes): when
    it was up and the seconds it took; None when an embedded Ray starts while the checks run."""
    from packfeed.service.pipeline.raycluster import init_ray, joins_a_cluster

    if not joins_a_cluster(address):
        return None
    start = time.perf_counter()
    logger.info(init_ray(address, quiet_driver_stderr=True))
    clock.mark("ray_start")
    up = time.perf_counter()
    return RayTimes(clock.began, up, up - start)


def _pack(config, plan, scaling, open_writer, tokenizer, shipped, clock, ray: RayTimes, head, *, output, validate,
          progress_seconds, unused: list[str] = ()) -> dict[str, Any]:
    from packfeed.service.pipeline.part_sink import PartSink, RowLedger, part_name
    from packfeed.service.pipeline.head_start import DriverWindow
    from packfeed.service.pipeline.scaling import place_packing
    from packfeed.service.packed.location import META_DIR
    from packfeed.service.pipeline.stats import fold_window, format_summary, new_run_stats, run_failure
    from packfeed.service.progress import Progress

    start, ray_init_seconds = clock.began, ray.seconds  # every figure counts from the command's start
    sink, start_window = None, 0  # the driver packs windows 0 .. start_window - 1
    if ray.up is None:  # no Ray started (head start): the driver packs every window
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
    parts = ray.up is None or sink is not None  # a part file per window, by the process that packed it
    total = new_run_stats(plan)
    pipeline = None
    if start_window < plan.num_windows:
        from packfeed.service.pipeline.ray_pipeline import PackingPipeline  # imports Ray: only when actors pack

        pipeline = PackingPipeline(config, plan, scaling=place_packing(scaling, num_windows=plan.num_windows - start_window),
                                   start_window=start_window, stats=total, sink=sink, tokenizer=shipped)
    # every check passed (inputs, tokenizer, probe, Ray, placement): only now may overwrite
    # remove the previous output
    writer = open_writer()
    if parts:
        writer.list_parts([part_name(k, plan.num_windows) for k in range(plan.num_windows)])
    if head is not None:
        head.release()
    clock.mark("pipeline")
    num_workers = pipeline.num_workers if pipeline is not None else 0
    if pipeline is not None and pipeline.num_workers > len(pipeline.windows):
        logger.warning("%d windows for %d packing workers: some workers idle", len(pipeline.windows), pipeline.num_workers)
    logger.info("packing %s samples (%d epoch(s)) in %d windows of %s %s -> %s",
                f"{plan.samples_per_epoch * plan.epochs:,}", plan.epochs, plan.num_windows,
                f"{plan.window_samples:,}", _packers(num_workers, head is not None, start_window, plan.num_windows,
                                                     ray.up is not None),
                storage.display(writer.out_dir))
    if pipeline is None and unused:  # checked to fit (check_packing), then not needed
        logger.info("%s unused: the driver packed every window, sooner than %s would have started", ", ".join(unused),
                    "packing actors" if ray.up is not None else "Ray and packing actors")
    progress = Progress("packfeed pack", plan.samples_per_epoch * plan.epochs, seq_len=config.seq_len,
                        interval_s=progress_seconds)
    rows_written = tokens = samples_started = actors_first_tokens = driver_windows = 0
    busy_tokens, core_seconds, cpu_seconds = 0, 0.0, 0.0  # the actors' windows after each one's first: rates per core
    first_row_at = first_row_wall = actors_first_at = None
    first_actor = None  # the start-up of the actor that wrote the first window (None: the driver did)
    first_by_driver = False
    epoch_first_rows = []  # global row of each epoch's first window
    written = [] if parts else None  # the part files the driver and the actors wrote, in stream order
    try:
        for out in _outputs(pipeline, head, start_window, writer if sink is None else None, validate):
            by_driver = isinstance(out, DriverWindow)
            if not by_driver and out.core_seconds:
                busy_tokens, core_seconds = busy_tokens + out.tokens, core_seconds + out.core_seconds
                cpu_seconds += out.cpu_seconds
            if out.window == 0:
                first_actor, first_by_driver = out.timings, by_driver
            if by_driver:
                fold_window(total, out.stats)
                samples_started += int(plan.window_counts(out.window).sum())
                driver_windows += 1
            if out.stats is not None and out.window % plan.windows_per_epoch == 0:  # a window's first output
                epoch_first_rows.append(rows_written)
            if not out.num_rows:
                continue
            if written is not None:
                written.append(out.file)
            rows_written += out.num_rows
            tokens += out.tokens
            if actors_first_at is None and not by_driver:  # the steady rate counts from here
                actors_first_at, actors_first_tokens = time.perf_counter(), tokens
            if first_row_at is None:
                first_row_at, first_row_wall = time.perf_counter(), time.time()
                if by_driver:  # written by the driver's thread before this one saw it
                    first_row_at -= max(0.0, first_row_wall - out.written_at)
            progress.update(samples=samples_started + (pipeline.samples_started if pipeline else 0),
                            rows=rows_written, tokens=tokens)
    except BaseException:
        writer.abandon()  # the run failed: nothing marks the output complete
        if head is not None and head.error is not None:
            raise head.error from None  # the pipeline's first window failed on it (or waited): the cause
        raise
    finally:
        if sink is not None:
            sink.ledger.close()
    progress.close()
    end = time.perf_counter()
    if driver_windows and ray.up is not None:
        logger.info("the driver packed %d of the %d windows while Ray and the packing actors started", driver_windows,
                    plan.num_windows)
    total.check_accounting()
    total.check_complete(plan.num_windows, plan.epochs)
    stats = total.to_dict(seq_len=config.seq_len, seconds=end - start)
    startup = clock.phases(first_actor, clock.wall(first_row_at or end),  # on the clock of ``seconds``
                           last="first_window_write_s" if first_by_driver else "actors_and_first_window_s")
    stats["first_row_seconds"] = round(sum(startup.values()), 3)
    stats["ray_to_first_row_seconds"] = None if ray.up is None else round((first_row_at or end) - ray.up, 3)
    stats["startup_seconds"] = startup
    stats["steady_tokens_per_second"] = _steady_rate(tokens - actors_first_tokens, actors_first_at, end,
                                                     plan.num_windows - driver_windows)
    stats["core_tokens_per_second"] = busy_tokens / core_seconds if core_seconds else None
    stats["cpu_tokens_per_second"] = busy_tokens / cpu_seconds if cpu_seconds else None
    stats["ray_init_seconds"] = None if ray.up is None else round(ray_init_seconds, 3)
    stats["num_workers"] = num_workers
    stats["driver_windows"] = driver_windows
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
    """Tokens/s once the packing actors' rows flow: the tokens after their first window over
    the time after it (start-up excluded; the driver's head start too); None when they packed
    one window or none."""
    if first_row_at is None or windows < 2 or end <= first_row_at:
        return None
    return tokens / (end - first_row_at)
