"""The Ray Data pipeline: planned windows -> packing actors -> a stream of packed rows.

::

    plan_windows (driver)  ->  from_items(window indices,  ->  map_batches(WindowActor)
    list[WindowSpec]           seeded order; one block        read + tokenize + pack,
                               per window)                    one window per call
                                                          ->  Arrow tables of rows (+ "window")

The actors hold the tokenizer (loaded once per actor) and call ``process_window``; they hold
no packing logic. Each window is packed whole inside one call, so no partial row is carried
between calls and no tail is lost at the end of the stream (Ray Data has no end-of-stream
hook). With ``preserve_order`` the stream order is the plan order: the same inputs, config and
seed give byte-identical rows in the same order, whatever the number of workers.

Every window's stats go to a small ``StatsSink`` actor before its rows are returned, keyed by
window index (a retried window overwrites itself), so the driver's totals are complete when
the stream ends.

``PackedStream`` is the one entry point reused by ``packfeed pack``, the trainer and the gRPC
server.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import ray

from packfeed.client.rows import PackedRows
from packfeed.service.arrow_rows import rows_from_arrow, rows_to_arrow
from packfeed.service.config import DataConfig
from packfeed.service.sources import WindowSpec, plan_windows
from packfeed.service.stats import WindowStats

logger = logging.getLogger(__name__)

# Embedded Ray's shared-memory object store; Ray's default (30% of RAM) is more than a small
# machine can spare and backpressure keeps the stream well under this.
DEFAULT_OBJECT_STORE_BYTES = 1 << 30


def init_ray(address: str | None = None, *, num_cpus: int | None = None, dashboard: bool = False) -> str:
    """Join ``address`` (or ``$RAY_ADDRESS``), else start an embedded single-node Ray.

    Does nothing when Ray is already initialised (tests, Ray jobs). ``address="local"`` always
    starts a fresh embedded Ray, never a stale cluster left by ``ray start``. ``dashboard``
    starts Ray's dashboard on 127.0.0.1 with the embedded Ray: Ray Train needs its State API
    (without it Ray Train's placement-group cleaner warns every second); packing alone does
    not, and starts faster without. Returns a line saying which Ray is used, for the user.
    """
    if ray.is_initialized():
        return "Ray: already initialised in this process"
    address = address or os.environ.get("RAY_ADDRESS")
    if address and address != "local":
        ray.init(address=address, logging_level=logging.WARNING)
        return f"Ray: joined the cluster at {address} ({ray.cluster_resources().get('CPU', 0):g} CPUs)"
    num_cpus = num_cpus or os.cpu_count() or 1
    ray.init(
        address="local",
        num_cpus=num_cpus,
        object_store_memory=DEFAULT_OBJECT_STORE_BYTES,
        include_dashboard=dashboard,
        dashboard_host="127.0.0.1",
        logging_level=logging.WARNING,
    )
    return f"Ray: started an embedded local Ray ({num_cpus} CPUs)"


@ray.remote(num_cpus=0)
class StatsSink:
    """Collects one WindowStats per window index."""

    def __init__(self) -> None:
        self._by_window: dict[int, WindowStats] = {}

    def record(self, window_index: int, stats: WindowStats) -> None:
        self._by_window[window_index] = stats

    def total(self) -> WindowStats:
        total = WindowStats()
        for index in sorted(self._by_window):
            total.merge(self._by_window[index])
        return total


class WindowActor:
    """Ray Data callable class: a window index in, that window's packed rows out."""

    def __init__(
        self, config: DataConfig, windows: list[WindowSpec], sink: "ray.actor.ActorHandle", threads: int
    ) -> None:
        # The Rust tokenizer sizes its thread pool once, on first use: match the CPUs the
        # actor was given instead of fighting the other actors for every core.
        os.environ["RAYON_NUM_THREADS"] = str(threads)
        from packfeed.service.tokenize import SampleTokenizer

        self.config = config
        self.windows = {w.index: w for w in windows}
        self.sink = sink
        self.tokenizer = SampleTokenizer(
            config.tokenizer, loss=config.loss, add_eos=config.add_eos, strict=config.strict,
            backend=config.tokenizer_backend, num_threads=threads,
        )  # fmt: skip

    def __call__(self, batch: dict[str, np.ndarray]):
        from packfeed.service.window import process_window

        tables = []
        for index in batch["window"]:
            spec = self.windows[int(index)]
            rows, stats = process_window(spec, self.tokenizer, self.config)
            stats.note_tokenizer(self.tokenizer)
            # Synchronous: the totals must be in the sink before the rows can be consumed.
            ray.get(self.sink.record.remote(spec.index, stats))
            window = pa.array(np.full(rows.num_rows, spec.index, dtype=np.int64))
            tables.append(rows_to_arrow(rows).append_column("window", window))
        return pa.concat_tables(tables)


@dataclass(frozen=True, kw_only=True)
class Scaling:
    """How many packing actors and how many CPUs each (fractional is fine)."""

    num_workers: int | None = None  # None: one per CPU of the cluster
    cpus_per_worker: float = 1.0

    def __post_init__(self) -> None:
        if self.num_workers is not None and self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.cpus_per_worker <= 0:
            raise ValueError(f"cpus_per_worker must be > 0, got {self.cpus_per_worker}")


class PackedStream:
    """The packed stream of ``config``: a Ray dataset plus the plan and the run's stats.

    ``dataset`` is what the trainer feeds to Ray Train; ``iter_rows()`` is what the CLI and the
    gRPC server read, with a global ``row_index`` (the row's position in the stream).
    """

    def __init__(self, config: DataConfig, *, scaling: Scaling = Scaling(), start_window: int = 0) -> None:
        """``start_window``: skip the first windows of the (seeded) plan order, so the stream
        starts at that window; used by the trainer to resume without re-packing what it
        consumed. ``self.windows`` then lists only the windows streamed."""
        self.config = config
        self.windows: list[WindowSpec] = plan_windows(
            config.inputs, window_samples=config.window_samples, format=config.format
        )
        # Which inputs are read first is shuffled at window level by the seed.
        order = np.random.default_rng(config.seed).permutation(len(self.windows))
        self.windows = [self.windows[i] for i in order]
        if not 0 <= start_window <= len(self.windows):
            raise ValueError(f"start_window must be in [0, {len(self.windows)}] (windows planned), got {start_window}")
        self.start_window = start_window
        self.windows = self.windows[start_window:]
        self.num_samples = sum(w.num_samples for w in self.windows)
        self.samples_started = 0  # samples of the windows whose rows have started to arrive
        self._sink = StatsSink.remote()

        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        # A bad sample under --strict must reach the user as itself (file, row, reason).
        ctx.raise_original_map_exception = True
        cpus = float(ray.cluster_resources().get("CPU", 1))
        num_workers = scaling.num_workers or max(1, int(cpus // scaling.cpus_per_worker))
        num_workers = max(1, min(num_workers, len(self.windows)))
        self.num_workers = num_workers
        self.dataset = ray.data.from_items(
            [{"window": w.index} for w in self.windows], override_num_blocks=max(1, len(self.windows))
        ).map_batches(
            WindowActor,
            fn_constructor_args=(config, self.windows, self._sink, max(1, int(scaling.cpus_per_worker))),
            batch_size=1,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=num_workers),
            num_cpus=scaling.cpus_per_worker,
        )

    def iter_rows(self, first_row: int = 0) -> Iterator[PackedRows]:
        """Yield the rows in stream order, one window's block at a time, global row_index set
        (counting from ``first_row``: the index of the first row of ``start_window``)."""
        for _, rows in self.iter_windows(first_row):
            yield rows

    def iter_windows(self, first_row: int = 0) -> Iterator[tuple[int, PackedRows]]:
        """Like ``iter_rows``, each block paired with its window's position in the seeded plan
        order (``start_window`` for the first window streamed). Windows whose samples were all
        skipped yield nothing."""
        next_index = first_row
        position = {w.index: self.start_window + i for i, w in enumerate(self.windows)}
        samples_in_window = {w.index: w.num_samples for w in self.windows}
        seen: set[int] = set()
        if not self.windows:
            return
        for table in self.dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
            windows = table.column("window").to_numpy()
            for window in set(windows.tolist()) - seen:
                seen.add(window)
                self.samples_started += samples_in_window[window]
            # One block is one window's rows in practice; split in case Ray merges blocks.
            cuts = [0, *(np.flatnonzero(np.diff(windows)) + 1).tolist(), len(windows)]
            for lo, hi in zip(cuts[:-1], cuts[1:]):
                if hi == lo:
                    continue
                rows = rows_from_arrow(table.slice(lo, hi - lo))
                rows = dataclasses.replace(rows, row_index=np.arange(next_index, next_index + rows.num_rows))
                next_index += rows.num_rows
                yield position[int(windows[lo])], rows

    def stats(self) -> WindowStats:
        """Totals over the windows packed so far (all of them once iteration has ended)."""
        return ray.get(self._sink.total.remote())
