"""The driver's head start: ``packfeed pack`` packs the first windows itself, and starts an
embedded Ray and its packing actors only when they would finish sooner.

::

    checks' thread:  plan, tokenizer, probe | window 0, 1, .. s-1 | s, s+1, .. d-1 (claimed)
    main thread:     wants_ray? ....... yes | Ray starting .........| hand_over(ledger): s
    packing actors:                                                   starting ...... | d, ..

An embedded Ray takes seconds to start and its packing actors seconds more (on 2 idle cores:
Ray 2.4-3 s, the actors 2-2.7 s), while the driver's checks end within about a second. From
then on the checks' thread packs windows 0, 1, ... in order, with the same ``process_window``
and the same tokenizer the actors get (one encoder thread), numbering their rows itself
(window k's first row is the sum of the rows before it). The main thread asks ``wants_ray``:
would Ray and its actors end the run sooner than the driver alone (``actors_pay_off_after``)?
The driver does not stop while they start: it packs on, slowed, and their start is slowed
too, by as much as the driver's packing takes of the machine; once they are up, the driver
and the actors share what is left, at most as much faster as they have CPUs beside the
driver's. When they would not end sooner, no Ray starts at all and the driver packs the run
alone. Otherwise Ray starts, and when it is up the main thread hands over: the pipeline gets
the windows from ``s`` (the first the driver has not taken), and from then on the driver and
the actors claim each window in the row ledger (``RowLedger.claim``: the first claim wins; an
actor that loses one returns it at once as the driver's). The driver claims in order and
stops at the first window an actor claimed: its windows are 0 .. d-1, the actors' d .. n-1,
and the actor that packs window d waits in the ledger for where the driver's last one ends
(``RowLedger.publish``; a window the driver failed to pack is published as failed, so no
actor waits for it). The hand-over asks the same question of the actors alone
(``ACTORS_START_S``); the answer that started Ray holds then, unless the driver turned out
faster than its first windows said: no actor is started after all.

Measured (bench/bench_head_start.py, 2 shared cores): the rule was "the driver would not be
done before Ray and the actors start (9 s)", as if they then packed everything left at once; a
12M-token corpus with the HF back-end started Ray (13.7-17.1 s beside the driver) and the driver
still packed all 8 windows (39.3 s; 33.9 s alone), as did 31M tokens with the fast back-end
(15.0 s; 13.9 s alone). On 2 cores the driver alone is the faster choice for every corpus of the
bench with either back-end, 247M tokens with the fast one included (23.2 s; the actors alone
24.3 s): no Ray starts for any.

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

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

from packfeed.client.rows import PackedRows, check_rows, renumber_rows
from packfeed.service import faults, storage
from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import StreamPlan
from packfeed.service.packed.writer import write_part
from packfeed.service.cluster import placement
from packfeed.service.pipeline.collector import collector_paused
from packfeed.service.pipeline import window as windows  # process_window looked up per call: drills slow it
from packfeed.service.packed.part_sink import RowLedger, part_name
from packfeed.service.cluster.scaling import PackingScaling
from packfeed.service.pipeline.stats import WindowStats

# An embedded Ray of 2 idle cores took 2.4-3 s to start, and its packing actors 2-2.7 s from
# the pipeline's ask to their first window (bench/bench_startup.py). 0 for both: Ray and actors
# always start (the drills of tests/integration/pack/test_head_start.py).
RAY_START_S = 3.0
ACTORS_START_S = 2.7
# Beside the driver's packing they start slower and slow it, as if their start asked for this
# many CPUs, shared with the driver's in proportion: on 2 cores, beside the driver packing on
# one, Ray started in 6.3-9 s and the actors took over 6 s (2.5 x), while the driver packed
# its windows 2.2 x slower (1.85 s each against 0.82 s alone, fast back-end). Beside a driver
# that packs through all of it (HF, windows of 9 s) on a machine other work kept busy, Ray
# took 13.7-20.7 s; a shorter GIL switch interval in the driver changed nothing (20.7 s both).
START_CPUS = 4.0
# Once up, each actor packs at this share of a core's pace: per CPU-second as fast as the driver
# (fast back-end, 31M tokens: 6.2M tokens per CPU-second of the actors' processes, 6.1M for the
# driver's windows), but Ray's own processes, the driver's reading of their windows and each
# actor's first one take their share of the cores: 246M tokens in 32 windows, fast back-end,
# 2 cores: two actors alone packed a window in 0.94 s each, the driver alone in 0.64 s (0.68).
ACTORS_EFFICIENCY = 0.7
# On a machine that other work keeps busy Ray and its actors start slower, and the CPUs they
# could pack on are the share of the machine the rest of it left free while the driver packed,
# counted down to MIN_FREE_SHARE (``ray_budget``). Measured beside two busy loops on 2 cores,
# 12M tokens with the HF back-end: 50 s with Ray started (the driver packed every window),
# 372 s on the actors alone (--no-head-start; the first row after 142 s), 16 s on the driver
# alone: no CPU is left for actors, and none start (``actors_pay_off_after``).
MIN_FREE_SHARE = 0.25
MIN_DRIVER_CORES = 0.1  # a driver that waited more than it packed: its pace, not its cores, decides
# Window 0 carries the run's one-time costs (imports, caches, the tokenizer's first calls): with the
# fast back-end, 246M tokens in 32 windows, it took 0.73-0.87 s, the next 31 0.62 s each. Its pace
# (less this, while it packs) says no more than "at least"; the decision waits for window 1's.
FIRST_WINDOW_EXTRA_S = 0.25
MAX_HELD_TOKENS = 64_000_000  # ~0.8 GB of rows held while Ray starts, at most (12 bytes per token)

logger = logging.getLogger("packfeed")


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
                 max_held_tokens: int = MAX_HELD_TOKENS, clock: Any = None, scaling: PackingScaling | None = None) -> None:
        self.config, self.plan, self.output, self.validate = config, plan, output, validate
        self.tokenizer = tokenizer  # the driver's ShippedTokenizer, the one the actors get
        self.max_held_tokens, self.clock = max_held_tokens, clock
        # the embedded Ray that would start: its CPUs, and those its packing actors (``scaling``) would take
        node = placement.embedded_node()
        scaling = PackingScaling() if scaling is None else scaling
        self.cpus = float(node["resources"].get("CPU", 1.0))
        # (an actor of a fraction of a CPU still packs on a whole one when the machine has it)
        self.actor_cpus = scaling.num_actors(plan.num_windows, [node]) * max(1.0, scaling.cpus_per_worker)
        self._cond = threading.Condition()
        self._next = 0  # the first window not claimed
        self._packed = 0  # windows packed (0 .. _packed - 1)
        self._end_row = 0  # where window _packed - 1 ends
        self._pack_seconds = 0.0  # spent packing windows 0 .. _packed - 1
        self._first_seconds = 0.0  # ... window 0 (with the run's one-time costs)
        self._pack_cpu = 0.0  # CPU seconds this process used meanwhile (its packing and writing)
        self._pack_others = 0.0  # CPU seconds the rest of the machine used meanwhile
        self._began: tuple[int, float, float, float] | None = None  # the last window begun: index, wall clock, own and others' CPU
        self._before_ray: tuple[float, float] | None = None  # the machine as wants_ray saw it: free share, driver's cores
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
            tokenizers = windows.window_tokenizers(self.config, self.plan, self.tokenizer, threads=1)
            while (k := self._claim()) is not None:
                began, own, others = time.perf_counter(), time.process_time(), others_cpu_seconds()
                with self._cond:
                    self._began = k, began, own, others
                    self._cond.notify_all()
                faults.point("packer-window", k)
                with collector_paused():  # no collector pass inside a window's work (collector.py)
                    rows, stats = windows.process_window(self.plan.window(k), tokenizers, self.config, self.plan)
                seconds = time.perf_counter() - began
                if k == 0:
                    self._first_seconds = seconds
                self._pack_seconds += seconds
                self._pack_cpu += time.process_time() - own
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
    def wants_ray(self, start_s: float | None = None) -> bool:
        """Before any Ray: would Ray and packing actors that start in ``start_s`` seconds on an
        idle machine (default ``RAY_START_S + ACTORS_START_S``) end the run sooner than the
        driver alone (``actors_pay_off_after``, with the machine as its windows found it: the
        share the other processes left free, the cores its packing used)? Its seconds left
        are the windows left at its pace: that of its windows after the first once it has
        one (window 0 carries the run's one-time costs: ``FIRST_WINDOW_EXTRA_S``), or, while a
        window is packing, at least the time it has taken for each window after it. A yes on
        window 0's pace alone waits for window 1's (a no holds: the true pace is faster). False
        when the driver would be done sooner, is done, or failed (its error: ``self.error``).
        Waits until it knows (for a large run: a fraction of the first window or two)."""
        start_s = RAY_START_S + ACTORS_START_S if start_s is None else start_s
        n = self.plan.num_windows
        with self._cond:
            while True:
                if self.error is not None or self._packing_ended:
                    return False
                if self._packed:
                    machine = self._machine(self._pack_seconds, self._pack_cpu, self._pack_others)
                    left = n - self._packed
                    left_s, after = left * self._pace(), self._pays_off_after(start_s, left, *machine)
                    held = self._held_tokens > self.max_held_tokens  # the driver waits: no next window to wait for
                    if left_s <= after or self._packed > 1 or left < 2 or held:
                        if left_s > after:
                            self._before_ray = machine
                        return self._decided("Ray?", left_s > after, left_s, after, left, machine)
                current = self._began
                if current is None or current[0] != self._packed or n - self._packed < 2:
                    self._cond.wait()  # nothing packing, or the last window: its end
                    continue
                k, began, own, others = current
                wall = time.perf_counter() - began
                machine = self._machine(wall, time.process_time() - own, others_cpu_seconds() - others)
                left = n - k - 1
                after = self._pays_off_after(start_s, left, *machine)
                at_least = left * max(0.0, wall - (FIRST_WINDOW_EXTRA_S if k == 0 else 0.0))  # the windows after it
                if at_least > after:
                    self._before_ray = machine
                    return self._decided(f"Ray? (window {k} still packing)", True, at_least, after, left, machine)
                self._cond.wait(min(0.1, (after - at_least) / left + 0.005) if after < math.inf else None)

    def _pace(self) -> float:
        """The driver's seconds per window: of its windows after the first once there is one."""
        if self._packed > 1:
            return (self._pack_seconds - self._first_seconds) / (self._packed - 1)
        return self._pack_seconds / self._packed

    def _machine(self, wall: float, own_cpu: float, others_cpu: float) -> tuple[float, float]:
        """The share of the machine the other processes left free over ``wall`` seconds of the
        driver's packing, and the cores its packing used."""
        return free_share(others_cpu, wall), own_cpu / max(wall, 1e-9)

    def _pays_off_after(self, start_s: float, windows: int, free: float, driver_cores: float) -> float:
        return actors_pay_off_after(start_s, cpus=self.cpus, free=free, driver_cores=driver_cores,
                                    actor_cpus=self.actor_cpus, windows=windows)

    def _decided(self, what: str, wanted: bool, left_s: float, after: float, windows: int,
                 machine: tuple[float, float]) -> bool:
        logger.debug("head start: %s %s: %d window(s), %.1f s of the driver's left; actors pay off above %.1f s "
                     "(%g CPUs, %.0f%% free, the driver's packing on %.2f cores, the actors' %g CPUs)", what,
                     "yes" if wanted else "no", windows, left_s, after, self.cpus, 100 * machine[0], machine[1],
                     self.actor_cpus)
        return wanted

    def hand_over(self, ledger: RowLedger, actors_start_s: float | None = None) -> int | None:
        """Ray is up: the first window for the pipeline (every window before it is the
        driver's: packed, or being packed); from now on the driver claims windows in
        ``ledger`` against the actors, and publishes where each of its windows ends there.
        None: no pipeline, the driver packs every window: at its pace so far, actors that
        start in ``actors_start_s`` (idle) would not end the run sooner (``actors_pay_off_after``,
        with the machine as ``wants_ray`` saw it before Ray: since, Ray's own processes kept it
        busy). That is what ``wants_ray`` foresaw only when the driver turned out faster than
        its first windows said. Its first window is waited for up to a third of
        ``actors_start_s`` (default ``ACTORS_START_S``), to know its pace. The driver's error, if
        it failed before, is raised here."""
        actors_start_s = ACTORS_START_S if actors_start_s is None else actors_start_s
        with self._cond:
            self._cond.wait_for(lambda: self._packed or self.error is not None or self._packing_ended,
                                actors_start_s / 3)
            if self.error is not None:
                raise self.error
            left = self.plan.num_windows - self._next
            if self._packed and actors_start_s > 0:
                machine = self._before_ray or self._machine(self._pack_seconds, self._pack_cpu, self._pack_others)
                left_s, after = left * self._pace(), self._pays_off_after(actors_start_s, left, *machine)
                if not self._decided("actors?", left_s > after, left_s, after, left, machine):
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


def actors_pay_off_after(start_s: float, *, cpus: float, free: float, driver_cores: float, actor_cpus: float,
                         windows: int) -> float:
    """The driver's seconds of packing left (at its pace alone) above which packing actors that
    start in ``start_s`` seconds on an idle machine end the run sooner than the driver alone;
    ``math.inf`` when they never would. ``cpus``: the machine's, as Ray counts them; ``free``:
    the share of them the other processes leave (``free_share``); ``driver_cores``: the cores
    the driver's packing uses (HF's encoder may use more than one); ``actor_cpus``: the actors';
    ``windows``: the windows left, each packed by one process.

    While they start the driver packs on: its packing and their start (``START_CPUS``) share
    the CPUs left free in proportion of what each asks, so their start takes ``stretch`` times
    longer (``ray_budget``: at least as much longer as the machine is busy) and the driver packs
    at ``slowed`` of its pace. Once they are up, the driver and the actors pack what is left
    ``speedup`` times faster than the driver alone: the CPUs they may use together over the
    driver's (no more processes than windows), times ``ACTORS_EFFICIENCY``. With D the driver's
    seconds left and S the start so stretched, the run ends at S + (D - slowed * S) / speedup
    instead of D: sooner only when D > S * (speedup - slowed) / (speedup - 1), and never when
    speedup <= 1 (a machine the rest of it keeps busy, or a driver already on every core).

    For example on 2 idle cores, the driver on one, two actors, Ray's start and theirs 5.7 s:
    stretch 2.5 (14.3 s), slowed 0.4, speedup 1.4: actors pay off above 35.6 s of the driver's
    packing (measured: 246M tokens, fast back-end, 20 s alone: 22.5 s, Ray and actors 25.7 s,
    the actors alone 23.4 s). The HF back-end's driver encodes on 1.7-1.8 of the 2 cores: never.
    With 16 idle cores and 16 actors: stretch 1, slowed 1, speedup 11.2: above 5.7 s."""
    if start_s <= 0:  # nothing to wait for: the drills' setting (RAY_START_S = ACTORS_START_S = 0)
        return 0.0
    usable = cpus * min(1.0, max(MIN_FREE_SHARE, free))  # the CPUs this run may have
    driver = min(usable, max(MIN_DRIVER_CORES, driver_cores))
    speedup = ACTORS_EFFICIENCY * min(usable, driver + actor_cpus, windows * driver) / driver
    if speedup <= 1.0:
        return math.inf
    start = ray_budget(start_s * max(1.0, (driver + START_CPUS) / cpus), free)
    slowed = min(1.0, usable / (driver + START_CPUS))
    return start * (speedup - slowed) / (speedup - 1.0)


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
