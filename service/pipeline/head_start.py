"""The driver's head start: ``packfeed pack`` packs the first windows itself, and starts an
embedded Ray and its packing actors only when they would finish sooner.

::

    checks' thread:  plan, tokenizer, probe | window 0, 1, .. s-1 | s, s+1, .. d-1 (claimed)
    main thread:     wants_ray? ....... yes | Ray starting .........| hand_over(ledger): s
    packing actors:                                                   starting ...... | d, ..

An embedded Ray takes seconds to start and its packing actors seconds more (on 2 cores: Ray
2.4-3 s, the actors 2-2.7 s), while the driver's checks end within about a second. From then
on the checks' thread packs windows 0, 1, ... in order, with the same ``process_window`` and
the same tokenizer the actors get (one encoder thread), numbering their rows itself (window
k's first row is the sum of the rows before it). The main thread asks ``wants_ray``: when the
driver, at its pace, would pack every window before Ray and the actors could start
(``RAY_START_S + ACTORS_START_S``), no Ray starts at all and the driver packs the run alone.
Otherwise Ray starts, and when it is up the main thread hands over: the pipeline gets the
windows from ``s`` (the first the driver has not taken), and from then on the driver and the
actors claim each window in the row ledger (``RowLedger.claim``: the first claim wins; an
actor that loses one returns it at once as the driver's). The driver claims in order and
stops at the first window an actor claimed: its windows are 0 .. d-1, the actors' d .. n-1,
and the actor that packs window d waits in the ledger for where the driver's last one ends
(``RowLedger.publish``; a window the driver failed to pack is published as failed, so no
actor waits for it). When Ray is up and the driver, at its pace so far, would pack what is
left before the actors could start (``ACTORS_START_S``), no actor is started after all.

The rows and files are the actors': the same function of (config, seed, window) and the same
part file per window (``write_part``), byte for byte. Nothing is written before every check
passed (Ray and the placement included, when Ray starts): the driver holds what it
packed until ``release`` (after the previous output is cleared), up to ``max_held_tokens``
real tokens (then it waits), and writes it then. A fault drill ``packer-window:k`` fires here
too when the driver packs window k.

Off (``packfeed pack --no-head-start``, ``run_pack(head_start=False)``): Ray starts beside
the checks and every window is packed on the actors, e.g. to drill a packing actor's failure
at a given window.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

from packfeed.client.rows import PackedRows, check_rows, renumber_rows
from packfeed.service import faults, storage
from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import StreamPlan
from packfeed.service.pipeline.part_sink import RowLedger, part_name
from packfeed.service.pipeline.stats import WindowStats

# Packing actors are started when the driver alone would need longer than this for what is
# left: on an embedded Ray of 2 cores, packing actors took 2-2.7 s from the pipeline's ask to
# their first window on an idle driver (bench/bench_startup.py) and over 6 s while the driver
# packed beside them (15M tokens: the driver took every window first, fast and HF back-ends).
ACTORS_START_S = 6.0
# Before Ray starts: an embedded Ray of 2 cores took 2.4-3 s to start (bench/bench_startup.py).
# When the driver alone would pack every window within RAY_START_S + ACTORS_START_S, no Ray starts.
RAY_START_S = 3.0
# On a machine that other work keeps busy, Ray and its actors start slower: that budget is
# divided by the share of the machine's CPUs the rest of the machine left free while the driver
# packed, down to MIN_FREE_SHARE. Measured beside two busy loops on 2 cores, 12M tokens with
# the HF back-end: 50 s with Ray started (the driver packed every window), 372 s on the actors
# alone (--no-head-start; the first row after 142 s), 16 s on the driver alone.
MIN_FREE_SHARE = 0.25
MAX_HELD_TOKENS = 64_000_000  # ~0.8 GB of rows held while Ray starts, at most (12 bytes per token)


@dataclass
class DriverWindow:
    """A window the driver packed: as the actors' ``WrittenWindow`` says one, plus when it was
    written (``time.time``; the driver's first row, for the start-up by phase)."""

    window: int
    num_rows: int
    tokens: int
    file: str | None
    stats: WindowStats
    timings: None = None
    written_at: float = 0.0


class HeadStart:
    """Windows 0, 1, ... packed by the driver (module docstring): ``run`` in the checks'
    thread; ``hand_over``, ``release``, ``window`` and ``abandon`` in the main thread."""

    def __init__(self, config: DataConfig, plan: StreamPlan, tokenizer: Any, *, output: str, validate: bool = False,
                 max_held_tokens: int = MAX_HELD_TOKENS, clock: Any = None) -> None:
        self.config, self.plan, self.output, self.validate = config, plan, output, validate
        self.tokenizer = tokenizer  # the driver's ShippedTokenizer, the one the actors get
        self.max_held_tokens, self.clock = max_held_tokens, clock
        self._cond = threading.Condition()
        self._next = 0  # the first window not claimed
        self._packed = 0  # windows packed (0 .. _packed - 1)
        self._end_row = 0  # where window _packed - 1 ends
        self._pack_seconds = 0.0  # spent packing windows 0 .. _packed - 1
        self._pack_others = 0.0  # CPU seconds the rest of the machine used meanwhile
        self._first_began: tuple[float, float] | None = None  # window 0's start: wall clock, others' CPU
        self._ledger: RowLedger | None = None  # set at the hand-over: claims go through it
        self._lost = False  # an actor claimed the window the driver wanted next: it stops
        self._released = False
        self._abandoned = False
        self._held: list[tuple[int, PackedRows, WindowStats]] = []
        self._held_tokens = 0
        self._written: list[DriverWindow] = []
        self._packing_ended = False  # the driver claims and packs no more windows
        self._done = False  # ... and has written every window it packed (or failed, or was abandoned)
        self.error: BaseException | None = None

    # ---- the checks' thread ----------------------------------------------------------------
    def run(self) -> None:
        """Pack windows until the last, an actor's claim or ``abandon``; a second thread writes
        them once released (Parquet's encoding and compression release the GIL: on a machine
        with a core to spare, the writes overlap the next windows' packing)."""
        writer = threading.Thread(target=self._write_released, name="packfeed-head-start-writer", daemon=True)
        writer.start()
        try:
            from packfeed.service.pipeline.window import process_window, window_tokenizers

            tokenizers = window_tokenizers(self.config, self.plan, self.tokenizer, threads=1)
            while (k := self._claim()) is not None:
                began, others = time.perf_counter(), others_cpu_seconds()
                if k == 0:
                    with self._cond:
                        self._first_began = began, others
                        self._cond.notify_all()
                faults.point("packer-window", k)
                rows, stats = process_window(self.plan.window(k), tokenizers, self.config, self.plan)
                self._pack_seconds += time.perf_counter() - began
                self._pack_others += others_cpu_seconds() - others
                self._packed_window(k, rows, stats)
        except BaseException as exc:  # raised in the main thread (hand_over, window)
            self._failed(exc)
        finally:
            with self._cond:
                self._packing_ended = True
                self._cond.notify_all()
            writer.join()
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def _claim(self) -> int | None:
        """The next window for the driver, or None: the last is taken, the run ended, or
        (after the hand-over) an actor claimed it first."""
        with self._cond:
            while not (self._ledger or self._released or self._abandoned) and self._held_tokens > self.max_held_tokens:
                self._cond.wait()  # enough held: wait for the output, or for Ray
            if self._abandoned or self._lost or self.error is not None or self._next == self.plan.num_windows:
                return None
            k, ledger = self._next, self._ledger
            if ledger is None:  # before the hand-over every window is the driver's to take
                self._next = k + 1
                return k
        if not ledger.claim(k, "driver"):
            with self._cond:
                self._lost = True
            return None
        with self._cond:
            self._next = k + 1
        return k

    def _packed_window(self, k: int, rows: PackedRows, stats: WindowStats) -> None:
        rows = renumber_rows(rows, self._end_row)
        if self.validate:
            check_rows(rows, self.config.seq_len)
        if k == 0 and self.clock is not None:
            self.clock.mark("driver_window_pack")
        with self._cond:
            self._end_row += rows.num_rows
            self._packed = k + 1
            self._held.append((k, rows, stats))
            self._held_tokens += rows.num_real_tokens
            ledger, end_row = self._ledger, self._end_row
            self._cond.notify_all()
        if ledger is not None:  # for the actor of window k + 1, if an actor packs it
            ledger.publish(k, end_row)

    def _write_released(self) -> None:
        """The writer thread: each packed window in order, once released, until the packing
        ended and nothing is left, or the run was abandoned. After a packing error the windows
        packed before it are written if released already (as the actors' would be), else none."""
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._abandoned or (self._released and (self._held or self._packing_ended))
                                        or (self._packing_ended and self.error is not None))
                    if self._abandoned or not self._released or not self._held:
                        return
                    k, rows, stats = self._held.pop(0)
                name = None
                if rows.num_rows:
                    from packfeed.service.packed.writer import write_part

                    name = part_name(k, self.plan.num_windows)
                    write_part(storage.join(self.output, name), rows, seq_len=self.config.seq_len,
                               config_hash=self.config.config_hash())
                with self._cond:
                    self._held_tokens -= rows.num_real_tokens
                    self._written.append(DriverWindow(k, rows.num_rows, rows.num_real_tokens, name, stats,
                                                      written_at=time.time()))
                    self._cond.notify_all()
        except BaseException as exc:  # the packing stops; raised in the main thread
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        with self._cond:
            self.error = exc
            ledger, last = self._ledger, self._next - 1
            self._cond.notify_all()
        if ledger is not None and 0 <= last < self.plan.num_windows - 1:  # the actor of last + 1 waits on it
            ledger.fail(last, f"the driver could not pack windows up to {last}: {type(exc).__name__}: {exc}")

    # ---- the main thread -------------------------------------------------------------------
    def wants_ray(self, budget_s: float | None = None) -> bool:
        """Before any Ray: would packing actors finish sooner than the driver alone? True once
        the windows left would take the driver longer than ``budget_s`` (default: Ray's start
        and the actors', ``RAY_START_S + ACTORS_START_S``, over the share of the machine the
        other processes left free meanwhile: ``ray_budget``) at its pace: its windows' so far,
        or, while its first window is packing, at least the time that window has taken for
        each window after it. False when the driver would be done sooner, is done, or failed
        (its error: ``self.error``). Waits until it knows (for a large run: a fraction of the
        first window)."""
        budget_s = RAY_START_S + ACTORS_START_S if budget_s is None else budget_s
        n = self.plan.num_windows
        with self._cond:
            while True:
                if self.error is not None or self._packing_ended:
                    return False
                if self._packed:
                    budget = ray_budget(budget_s, free_share(self._pack_others, self._pack_seconds))
                    return (n - self._packed) * self._pack_seconds / self._packed > budget
                if self._first_began is None or n == 1:  # one window: the driver is packing it already
                    self._cond.wait()
                    continue
                wall = time.perf_counter() - self._first_began[0]
                budget = ray_budget(budget_s, free_share(others_cpu_seconds() - self._first_began[1], wall))
                at_least = (n - 1) * wall  # the windows after the first
                if at_least > budget:
                    return True
                self._cond.wait(min(0.1, (budget - at_least) / (n - 1) + 0.005))

    def hand_over(self, ledger: RowLedger, actors_start_s: float = ACTORS_START_S) -> int | None:
        """Ray is up: the first window for the pipeline (every window before it is the
        driver's: packed, or being packed); from now on the driver claims windows in
        ``ledger`` against the actors, and publishes where each of its windows ends there.
        None: no pipeline, the driver packs every window (at its pace so far it would be done
        within ``actors_start_s``, before the actors could start; its first window is waited
        for up to a third of that, to know its pace). The driver's error, if it failed
        before, is raised here."""
        with self._cond:
            self._cond.wait_for(lambda: self._packed or self.error is not None or self._packing_ended,
                                actors_start_s / 3)
            if self.error is not None:
                raise self.error
            left = self.plan.num_windows - self._next
            if self._packed and left * self._pack_seconds / self._packed <= actors_start_s:
                return None
            self._ledger = ledger
            start, packed, end_row = self._next, self._packed, self._end_row
            self._cond.notify_all()
        if 0 < start == packed:
            ledger.publish(start - 1, end_row)  # its last window is packed already
        return start

    def release(self) -> None:
        """Every check passed: the held rows may be written (by the driver's thread)."""
        with self._cond:
            self._released = True
            self._cond.notify_all()

    def abandon(self) -> None:
        """The run failed (or ended): the driver claims, packs and writes no more."""
        with self._cond:
            self._abandoned = True
            self._cond.notify_all()

    def window(self, k: int) -> DriverWindow:
        """The driver's window ``k`` once written; its error instead, if it failed first."""
        with self._cond:
            while len(self._written) <= k and self.error is None and not self._done:
                self._cond.wait()
            if len(self._written) <= k:
                raise self.error or RuntimeError(f"packing: the driver's head start ended before window {k}")
            return self._written[k]


def ray_budget(budget_s: float, free: float) -> float:
    """``budget_s`` (Ray's and the actors' start on an idle machine) where the rest of the
    machine left ``free`` of its CPUs free: slower by as much (Ray's start and its actors get
    no more), down to ``MIN_FREE_SHARE``."""
    return budget_s / min(1.0, max(MIN_FREE_SHARE, free))


def free_share(others_seconds: float, wall_seconds: float) -> float:
    """The share of this machine's CPUs that the other processes left free over
    ``wall_seconds`` in which they used ``others_seconds`` of CPU."""
    return 1.0 - others_seconds / max(wall_seconds * (psutil.cpu_count() or 1), 1e-9)


def others_cpu_seconds() -> float:
    """CPU seconds every process but this one has used on this machine (since its boot):
    the machine's busy time (/proc/stat through psutil) less this process's."""
    t = psutil.cpu_times()
    busy = sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))
    return busy - time.process_time()
