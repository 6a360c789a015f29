"""The Ray Data pipeline: planned windows -> packing actors -> a stream of packed rows.

::

    StreamPlan (driver)  ->  from_items(window numbers,  ->  map_batches(WindowActor)
                             one block per window)           read + tokenize + pack,
                                                             one window per call
                                                         ->  Arrow blocks of rows + "window" + "stats"

The actors hold the tokenizers (one per loss mode, from the driver's ``ShippedTokenizer``
when given: no transformers import in the actor) and call ``process_window``; they hold
no packing logic. Each window is packed whole inside one call, so no partial row is carried
between calls and no tail is lost at the end of the stream (Ray Data has no end-of-stream
hook). With ``preserve_order`` the stream order is the plan order: the same config and seed
give byte-identical rows in the same order, whatever the number of workers.

With a ``PartSink`` (``packfeed pack``) the actors write each window's rows to its Parquet
part file themselves, in parallel (part_sink.py), and the stream carries one small row per
window instead: ``window``, ``rows``, ``tokens``, ``file``, ``stats`` and, on an actor's first
window, ``timings`` (when its process started, imported, loaded the tokenizer, packed and
wrote: the start-up by phase). The driver touches no actor's row. When the driver packs windows too
(``pack``'s head start, head_start.py), an actor first claims each window in the row ledger and
returns one it lost to the driver at once, as a row without stats.

A window's accounting (``WindowStats`` as JSON) travels in the ``stats`` column of its first
row; a window whose samples were all skipped sends one stats-only row (no tokens) instead,
since Ray Data drops empty blocks. So the driver's totals are complete when the stream ends,
and no actor holds them (a lost actor cannot lose them, a restarted reader leaks nothing).

``PackingPipeline`` is what reads it: ``packfeed pack`` (packjob/pack_run.py) writes its rows
to a directory, and the row stream of serve and train (delivery/row_stream.py) restarts one
from any window for the hub. Its actors are a ``PackingScaling`` (scaling.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import ray

from packfeed.client.rows import PackedRows, renumber_rows
from packfeed.service import faults
from packfeed.service.packed.arrow_rows import ROW_SCHEMA, rows_from_arrow, rows_to_arrow
from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import StreamPlan
from packfeed.service.metrics import WindowMetrics
from packfeed.service.pipeline.collector import collector_paused, freeze_setup
from packfeed.service.packed.part_sink import PartSink
from packfeed.service.cluster.placement import node_resources
from packfeed.service.cluster.raycluster import stopping_block_prefetchers
from packfeed.service.cluster.scaling import PackingScaling
from packfeed.service.pipeline.stats import RunStats, WindowStats, fold_window, new_run_stats

PIPELINE_SCHEMA = ROW_SCHEMA.append(pa.field("window", pa.int64())).append(pa.field("stats", pa.string()))


@dataclass
class ActorTimings:
    """A packing actor's start-up, wall clock (``time.time``), as startup.py's
    ``ACTOR_PHASES`` name its instants: when its process started, its ``__init__`` began,
    packfeed's imports and its tokenizers were done (filled in ``__init__``), and on its first window
    when the call began, the rows were packed and written (filled around ``process_window``
    and the write). Said once, with the actor's first window: the ``timings`` column, as JSON
    of the instants set (a first window the driver packed: the first four)."""

    process_created: float
    init_start: float
    imports_done: float | None = None
    tokenizer_done: float | None = None
    call_start: float | None = None
    packed: float | None = None
    written: float | None = None

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in dataclasses.asdict(self).items() if v is not None})


class WindowActor:
    """Ray Data callable class: a window number in, that window's packed rows out."""

    def __init__(self, config: DataConfig, plan: StreamPlan, threads: int, faults_env: dict | None = None,
                 sink: PartSink | None = None, tokenizer: Any = None) -> None:
        self.timings: ActorTimings | None = ActorTimings(_process_created(), time.time())
        faults.adopt(faults_env)  # the driver's $PACKFEED_FAULTS (Ray started this process before it was set)
        # The Rust tokenizer sizes its thread pool once, on first use: match the CPUs the
        # actor was given instead of fighting the other actors for every core.
        os.environ["RAYON_NUM_THREADS"] = str(threads)
        # here, not at the top: its import is a phase of its own (actor_packfeed_imports_s, startup.py)
        from packfeed.service.pipeline.window import process_window, window_tokenizers

        self.process_window = process_window

        self.timings.imports_done = time.time()
        self.config, self.plan, self.sink = config, plan, sink
        self.tokenizers = window_tokenizers(config, plan, config.tokenizer if tokenizer is None else tokenizer, threads)
        self.timings.tokenizer_done = time.time()
        self.metrics = WindowMetrics()  # Ray's metrics: packing shows on the cluster's endpoint
        self.source_names = [s.name for s in plan.sources]
        self.threads, self.packed_windows = threads, 0
        freeze_setup()  # the set-up's objects are never walked by the collector again (collector.py)

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        return pa.concat_tables([self._window(int(k)) for k in batch["window"]])

    def _window(self, k: int) -> pa.Table:
        """Window ``k`` packed: its rows (no sink), or written to its part file and said in one
        row (``written_table``), with this actor's timings on its first window."""
        called = time.time()
        if self.sink is not None and self.sink.driver_claims and not self.sink.ledger.claim(k, "actors"):
            return written_table(k, None, None, None, self._take_timings())  # the driver's
        busy_from, cpu_from = time.perf_counter(), time.process_time()
        faults.point("packer-window", k)
        with collector_paused():  # no collector pass inside a window's work (collector.py)
            rows, stats = self.process_window(self.plan.window(k), self.tokenizers, self.config, self.plan)
            self.metrics.record(stats, self.source_names)
            if self.sink is None:
                return window_table(k, rows, stats)
            packed = time.time()
            name, numbering = self.sink.write(k, rows)
        timings = self._take_timings()
        if timings is not None:
            timings.call_start, timings.packed, timings.written = called, packed, time.time()
        # for the rates per packing core: this window's seconds (wall clock times the actor's
        # CPUs) and the CPU time this process spent on it, both less the wait for the window
        # before to be numbered; none for the actor's first (proof, imports)
        spent = None
        if self.packed_windows:
            wall = time.perf_counter() - busy_from - numbering[0]
            spent = (wall * self.threads, time.process_time() - cpu_from - numbering[1])
        self.packed_windows += 1
        return written_table(k, rows, name, stats, timings, spent)

    def _take_timings(self) -> ActorTimings | None:
        """The actor's start-up, said with its first window only."""
        timings, self.timings = self.timings, None
        return timings


def _process_created() -> float:
    """When this process started (wall clock), for the start-up by phase."""
    return psutil.Process().create_time()


def written_table(window: int, rows: PackedRows | None, file: str | None, stats: WindowStats | None,
                  timings: ActorTimings | None, spent: tuple[float, float] | None = None) -> pa.Table:
    """What the driver gets of a window an actor wrote (``PartSink``): one row, no tokens
    (``rows`` and ``stats`` None: the driver packed that window, head_start.py). ``spent``:
    (``core_seconds``, ``cpu_seconds``) of ``WrittenWindow``."""
    return pa.table({
        "window": pa.array([window], pa.int64()), "rows": pa.array([rows.num_rows if rows else 0], pa.int64()),
        "tokens": pa.array([rows.num_real_tokens if rows else 0], pa.int64()), "file": pa.array([file], pa.string()),
        "stats": pa.array([None if stats is None else stats.to_json()], pa.string()),
        "timings": pa.array([None if timings is None else timings.to_json()], pa.string()),
        "core_seconds": pa.array([spent and spent[0]], pa.float64()),
        "cpu_seconds": pa.array([spent and spent[1]], pa.float64()),
    })  # fmt: skip


def window_table(window: int, rows: PackedRows, stats: WindowStats) -> pa.Table:
    """A window's rows as one Arrow table with its number and (first row) its stats."""
    if rows.num_rows == 0:  # a stats-only row: Ray Data would drop an empty block
        table = ROW_SCHEMA.empty_table().to_pydict()
        empty = {name: [[]] if name != "row_index" else [-1] for name in table}
        table = pa.table(empty, schema=ROW_SCHEMA)
    else:
        table = rows_to_arrow(rows)
    n = table.num_rows
    stats_column = pa.array([stats.to_json()] + [None] * (n - 1), type=pa.string())
    return table.append_column("window", pa.array(np.full(n, window, np.int64))).append_column("stats", stats_column)


@dataclass
class WrittenWindow:
    """One window a packing actor wrote to ``file`` (None: it has no row); ``timings``: the
    writing actor's start-up (wall clock), on its first window only. ``stats`` None: the
    driver packed it (head_start.py), not an actor. ``core_seconds``: the seconds the actor
    spent on it (read to written, wall clock, less the wait for the window before it to be
    numbered: part_sink.py) times its CPUs, which counts the time other processes held the
    actor's cores; ``cpu_seconds``: the CPU time the actor's process spent in the same span
    (all its threads). Both None on the actor's first window."""

    window: int
    num_rows: int
    tokens: int
    file: str | None
    stats: WindowStats | None
    timings: dict[str, float] | None
    core_seconds: float | None = None
    cpu_seconds: float | None = None


@dataclass
class WindowOutput:
    """One window's rows as they arrive (``rows`` may be empty: all samples skipped).

    ``rows.row_index`` is global; ``stats`` is set on the first output of each window.
    """

    window: int
    rows: PackedRows
    stats: WindowStats | None


class PackingPipeline:
    """The packed stream of ``plan``, from window ``start_window`` on: a Ray dataset plus the
    run's stats as windows arrive.

    ``dataset`` is the Ray dataset of blocks; ``iter_windows(first_row)`` is what the CLI, the
    hub and the feeder read, with a global ``row_index`` starting at ``first_row`` (the index
    of the first row of ``start_window``). ``tokenizer``: the driver's ``SampleTokenizer.ship()``
    for the actors (None: each actor loads ``config.tokenizer`` itself, transformers and the
    fast back-end's whole proof included: seconds more per actor).
    """

    def __init__(self, config: DataConfig, plan: StreamPlan, *, scaling: PackingScaling = PackingScaling(),
                 start_window: int = 0, stats: RunStats | None = None, sink: PartSink | None = None,
                 tokenizer: Any = None) -> None:
        if not 0 <= start_window <= plan.num_windows:
            raise ValueError(f"start_window must be in [0, {plan.num_windows}], got {start_window}")
        self.config, self.plan, self.start_window = config, plan, start_window
        self.windows = list(range(start_window, plan.num_windows))
        self.stats = stats if stats is not None else new_run_stats(plan)
        self.samples_started = 0  # samples of the windows whose rows have started to arrive

        poll_tasks_sooner()
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        # A bad sample under --strict must reach the user as itself (file, row, reason).
        ctx.raise_original_map_exception = True
        if scaling.labels is None:  # not placed yet (place_packing): the role default, as it would
            scaling = scaling.placed(node_resources())
        self.num_workers = scaling.num_actors(len(self.windows))
        max_workers = min(scaling.max_workers or 0, len(self.windows))  # never more actors than windows left
        # An actor that writes waits in its call for the windows before its own (part_sink.py):
        # one call at a time per actor, so windows start in the order Ray Data hands them out
        # (several calls in flight may start in any order, and a window could wait on one
        # queued behind it in the same actor).
        in_flight = {"max_tasks_in_flight_per_actor": 1} if sink is not None else {}
        compute = (
            ray.data.ActorPoolStrategy(min_size=self.num_workers, max_size=max_workers, **in_flight)
            if max_workers > self.num_workers
            else ray.data.ActorPoolStrategy(size=self.num_workers, **in_flight)
        )
        remote_args = {"resources": dict(scaling.resources)} if scaling.resources else {}
        if scaling.labels:
            remote_args["label_selector"] = dict(scaling.labels)
        self.dataset = ray.data.from_items(
            [{"window": k} for k in self.windows], override_num_blocks=max(1, len(self.windows))
        ).map_batches(
            WindowActor,
            fn_constructor_args=(config, plan, max(1, int(scaling.cpus_per_worker)), faults.environment(), sink,
                                 tokenizer),
            batch_size=1,
            batch_format="numpy",
            compute=compute,
            num_cpus=scaling.cpus_per_worker,
            **remote_args,
        )

    def iter_rows(self, first_row: int = 0) -> Iterator[PackedRows]:
        """The rows in stream order, in blocks (global ``row_index`` from ``first_row``)."""
        for out in self.iter_windows(first_row):
            if out.rows.num_rows:
                yield out.rows

    def iter_windows(self, first_row: int = 0) -> Iterator[WindowOutput]:
        """Every window's output in stream order; also folds the stats into ``self.stats``."""
        next_index = first_row
        if not self.windows:
            return
        with stopping_block_prefetchers():  # also when the reader is closed mid-stream
            for table in self.dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
                for out in table_outputs(table, first_row=next_index):
                    if out.stats is not None:
                        self._fold(out.stats)
                    next_index += out.rows.num_rows
                    yield out

    def iter_written(self) -> Iterator[WrittenWindow]:
        """What the actors wrote, window by window in stream order (a pipeline with a
        ``PartSink``); also folds the stats into ``self.stats``."""
        if not self.windows:
            return
        with stopping_block_prefetchers():
            for table in self.dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
                for row in table.to_pylist():
                    stats = None if row["stats"] is None else WindowStats.from_json(row["stats"])
                    if stats is not None:  # else the driver's window: its stats come with it
                        self._fold(stats)
                    timings = json.loads(row["timings"]) if row["timings"] is not None else None
                    yield WrittenWindow(row["window"], row["rows"], row["tokens"], row["file"], stats, timings,
                                        row["core_seconds"], row["cpu_seconds"])

    def _fold(self, stats: WindowStats) -> None:
        fold_window(self.stats, stats)
        self.samples_started += int(self.plan.window_counts(stats.window).sum())


def table_outputs(table: pa.Table, *, first_row: int) -> list[WindowOutput]:
    """A block of the pipeline as WindowOutputs (one per window in it; one block is one
    window in practice, split in case Ray merges blocks), rows numbered from ``first_row``."""
    windows = table.column("window").to_numpy()
    stats_column = table.column("stats")
    with_stats = np.flatnonzero(pc.is_valid(stats_column).to_numpy(zero_copy_only=False))  # no per-row Python
    cuts = [0, *(np.flatnonzero(np.diff(windows)) + 1).tolist(), len(windows)]
    outputs = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        part = table.slice(lo, hi - lo)
        at = with_stats[(with_stats >= lo) & (with_stats < hi)]
        cell = stats_column[int(at[0])].as_py() if len(at) else None
        real = part.filter(pc.not_equal(part.column("row_index"), -1))
        rows = rows_from_arrow(real)
        rows = renumber_rows(rows, first_row)
        first_row += rows.num_rows
        outputs.append(WindowOutput(int(windows[lo]), rows, WindowStats.from_json(cell) if cell is not None else None))
    return outputs


# Ray Data's executor waits up to WAIT_FOR_TASK_COMPLETION_TIMEOUT_S (0.1 s in Ray 2.60) for
# all of its running tasks before it looks at those done: a packing actor idled ~0.085 s after
# each window (it runs one call at a time, part_sink.py), as long as packing a window of 500k
# tokens. At 0.01 s: ~0.03 s, the same driver CPU over a run (measured: 3.69 vs 3.72 s).
RAY_DATA_TASK_POLL_S = 0.01


def poll_tasks_sooner() -> bool:
    """Lower Ray Data's wait for finished tasks in this process (its executor runs in the
    driver) to ``RAY_DATA_TASK_POLL_S``; False, changing nothing, where Ray Data has no such
    constant (another Ray version)."""
    try:
        from ray.data._internal.execution import streaming_executor_state as state
    except ImportError:
        return False
    wait = getattr(state, "WAIT_FOR_TASK_COMPLETION_TIMEOUT_S", None)
    if not isinstance(wait, (int, float)):
        return False
    state.WAIT_FOR_TASK_COMPLETION_TIMEOUT_S = min(wait, RAY_DATA_TASK_POLL_S)
    return True
