"""The driver's account of a ``packfeed pack`` run as its windows arrive: the stats.json figures.

::

    window outputs, stream order (the driver's DriverWindow, the actors' WrittenWindow)
      -> PackReport.add(out): rows, tokens, files, each epoch's first row, when the first row
         came, the actors' busy tokens and seconds
      -> PackReport.to_stats(...): RunStats.to_dict, then the start-up by phase, the rates,
         who packed

The accounting of samples is ``RunStats`` (stats.py: the pipeline folds the actors' windows,
``add`` the driver's); this adds what only the driver sees: the clock. Every figure counts
from the command's start (``StartupClock``, startup.py), whichever Ray the run used
(``RayTimes``, ray_beside.py). The rates: ``steady_tokens_per_second`` once the actors' rows
flow (their first window and the start-up left out), ``core_tokens_per_second`` and
``cpu_tokens_per_second`` over the actors' windows after each one's first (read to written,
per core given and per CPU-second used).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from packfeed.service.data.plan import StreamPlan
from packfeed.service.packjob.head_start import DriverWindow
from packfeed.service.packjob.ray_beside import RayTimes
from packfeed.service.pipeline.startup import StartupClock
from packfeed.service.pipeline.stats import RunStats, fold_window

logger = logging.getLogger("packfeed")


class PackReport:
    """The run's figures from its window outputs (``add``, in stream order) to its stats
    (``to_stats``). ``total``: the run's ``RunStats`` (the pipeline's, which folds the actors'
    windows); ``parts``: the windows are part files (``files`` lists them in stream order)."""

    def __init__(self, plan: StreamPlan, total: RunStats, clock: StartupClock, ray: RayTimes, *,
                 parts: bool) -> None:
        self.plan, self.total, self.clock, self.ray = plan, total, clock, ray
        self.rows = self.tokens = 0  # written so far
        self.samples_started = 0  # samples of the driver's windows (the pipeline counts its own)
        self.driver_windows = 0
        self.files: list[str | None] | None = [] if parts else None  # the part files, in stream order
        self.epoch_first_rows: list[int] = []  # global row of each epoch's first window
        self.first_row_at: float | None = None  # time.perf_counter
        self.first_actor: dict[str, float] | None = None  # start-up of the actor of window 0 (None: the driver's)
        self.first_by_driver = False
        # the actors' windows after each one's first: the rates per core
        self.busy_tokens, self.core_seconds, self.cpu_seconds = 0, 0.0, 0.0
        self.actors_first_at: float | None = None  # the steady rate counts from here ...
        self.actors_first_tokens = 0  # ... and from these tokens

    def add(self, out: Any) -> None:
        """One window output (a ``DriverWindow`` or an actors' ``WrittenWindow``), as it arrives."""
        by_driver = isinstance(out, DriverWindow)
        if not by_driver and out.core_seconds:
            self.busy_tokens, self.core_seconds = self.busy_tokens + out.tokens, self.core_seconds + out.core_seconds
            self.cpu_seconds += out.cpu_seconds
        if out.window == 0:
            self.first_actor, self.first_by_driver = out.timings, by_driver
        if by_driver:
            fold_window(self.total, out.stats)
            self.samples_started += int(self.plan.window_counts(out.window).sum())
            self.driver_windows += 1
        if out.stats is not None and out.window % self.plan.windows_per_epoch == 0:  # a window's first output
            self.epoch_first_rows.append(self.rows)
        if not out.num_rows:
            return
        if self.files is not None:
            self.files.append(out.file)
        self.rows += out.num_rows
        self.tokens += out.tokens
        if self.actors_first_at is None and not by_driver:  # the steady rate counts from here
            self.actors_first_at, self.actors_first_tokens = time.perf_counter(), self.tokens
        if self.first_row_at is None:
            self.first_row_at = time.perf_counter()
            if by_driver:  # written by the driver's thread before this one saw it
                self.first_row_at -= max(0.0, time.time() - out.written_at)

    def to_stats(self, *, seq_len: int, num_workers: int, end: float) -> dict[str, Any]:
        """The stats.json of the run that ended at ``end`` (``time.perf_counter``), every window
        added: ``RunStats.to_dict``, then the start-up and the rates. RuntimeError when a
        window or a planned sample is missing, or a sample is neither packed nor reported."""
        plan, ray = self.plan, self.ray
        if self.driver_windows and ray.up is not None:
            logger.info("the driver packed %d of the %d windows while Ray and the packing actors started",
                        self.driver_windows, plan.num_windows)
        self.total.check_accounting()
        self.total.check_complete(plan.num_windows, plan.epochs)
        stats = self.total.to_dict(seq_len=seq_len, seconds=end - self.clock.began)
        first_row_at = self.first_row_at or end
        startup = self.clock.phases(self.first_actor, self.clock.wall(first_row_at),  # on the clock of ``seconds``
                                    last="first_window_write_s" if self.first_by_driver else "actors_and_first_window_s")
        stats["first_row_seconds"] = round(sum(startup.values()), 3)
        stats["ray_to_first_row_seconds"] = None if ray.up is None else round(first_row_at - ray.up, 3)
        stats["startup_seconds"] = startup
        stats["steady_tokens_per_second"] = steady_rate(self.tokens - self.actors_first_tokens, self.actors_first_at,
                                                        end, plan.num_windows - self.driver_windows)
        stats["core_tokens_per_second"] = self.busy_tokens / self.core_seconds if self.core_seconds else None
        stats["cpu_tokens_per_second"] = self.busy_tokens / self.cpu_seconds if self.cpu_seconds else None
        stats["ray_init_seconds"] = None if ray.up is None else round(ray.seconds, 3)
        stats["num_workers"] = num_workers
        stats["driver_windows"] = self.driver_windows
        stats["epoch_rows"] = [b - a for a, b in zip(self.epoch_first_rows, self.epoch_first_rows[1:] + [self.rows])]
        return stats


def steady_rate(tokens: int, first_row_at: float | None, end: float, windows: int) -> float | None:
    """Tokens/s once the packing actors' rows flow: the tokens after their first window over
    the time after it (start-up excluded; the driver's head start too); None when they packed
    one window or none."""
    if first_row_at is None or windows < 2 or end <= first_row_at:
        return None
    return tokens / (end - first_row_at)
