"""``packfeed pack``'s Ray: started beside the checks, or after the driver's head start asked for it.

::

    main thread:     [join a cluster]  Ray starting ............. | up (or: no Ray at all)
    checks' thread:  plan, output, tokenizer, probe | the head start packs windows 0, 1, ...

``RayBesideChecks`` is pack's ``RayStart`` (preflight.py): the same checks in the same order as
serve's and train's, but an embedded Ray starts while they run, in the main thread, and with
the driver's head start (head_start.py) only once they passed and its first window says
packing actors would help (``check_while_ray_starts``). A cluster to join is joined before the
plan (its nodes scan), as for every command. ``RayTimes`` says when Ray was up, on the
command's one clock (startup.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from packfeed.service.cluster import raycluster
from packfeed.service.pipeline.preflight import Checked, RayStart
from packfeed.service.cluster.scaling import PackingScaling, check_packing
from packfeed.service.pipeline.startup import StartupClock

logger = logging.getLogger("packfeed")


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


class RayBesideChecks(RayStart):
    """Pack's Ray around the checks (module docstring). ``then(checked, shipped)``: the
    driver's head start, made in the checks' thread once they passed (None: no head start,
    Ray starts beside the checks). After ``preflight``: ``times`` (``RayTimes``), ``head``
    (the head start, None when none goes on) and ``shipped`` (the tokenizer the packing
    actors get, ``SampleTokenizer.ship``, made in the checks' thread)."""

    def __init__(self, address: str | None, clock: StartupClock, scaling: PackingScaling,
                 then: Callable[[Checked, Any], Any] | None = None) -> None:
        super().__init__(address)
        self.clock, self.scaling, self.then = clock, scaling, then
        self.times: RayTimes | None = None
        self.head: Any = None
        self.shipped: Any = None

    def join(self) -> bool:
        self.times = join_first(self.address, self.clock)
        self.joined = self.times is not None
        # the packing actors checked against the Ray joined, or the one that would start, before the
        # head start decides whether it starts: the same flags fail the same way on any corpus
        check_packing(self.scaling)
        return self.joined

    def around(self, checks: Callable[[], Checked | None]) -> Checked:
        def check() -> tuple[Checked, Any]:
            checked = checks()
            if self.then is None or self.joined:  # a head start packs now; Ray Data only if its actors start
                _import_pipeline()
                self.clock.mark("pipeline_imports")
            return checked, checked.tokenizer.ship()

        if self.joined:
            (checked, self.shipped) = check()
            return checked
        then = None if self.then is None else (lambda result: self.then(*result))
        (checked, self.shipped), self.times, self.head = check_while_ray_starts(check, self.address, self.clock, then)
        return checked


def _import_pipeline() -> None:
    """Import what building the pipeline imports (Ray Data: a large import) in the checks'
    thread, while an embedded Ray is still starting, not after it is up."""
    import ray.data  # the import this function is for

    import packfeed.service.pipeline.ray_pipeline  # noqa: F401  (imports Ray)

    ray.data.DataContext.get_current()  # its first call imports Ray Data's issue detectors


def join_first(address: str | None, clock: StartupClock) -> RayTimes | None:
    """Join a cluster before planning (``joins_a_cluster``: the scan runs on its nodes): when
    it was up and the seconds it took; None when an embedded Ray starts while the checks run."""
    if not raycluster.joins_a_cluster(address):
        return None
    start = time.perf_counter()
    logger.info(raycluster.init_ray(address, quiet_driver_stderr=True))
    clock.mark("ray_start")
    up = time.perf_counter()
    return RayTimes(clock.began, up, up - start)


def check_while_ray_starts(check: Callable[[], Any], address: str | None, clock: StartupClock,
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
    if raycluster.ray_initialised():  # this process's own Ray (tests, Ray jobs): no start to overlap
        result = check()
        logger.info(raycluster.init_ray(address))
        return result, RayTimes(clock.began, clock.began, 0.0), None
    checks = _ChecksThread(check, then)
    if then is not None:  # the head start: Ray only when its packing actors would help
        checks.done.wait()
        if checks.error is not None:
            raise checks.error
        if not checks.head.wants_ray():
            if checks.head.error is not None:  # its first window failed: nothing is written
                checks.head.abandon()
                raise checks.head.error
            return checks.result, RayTimes(clock.began, None, 0.0), checks.head
    ray_began = time.perf_counter()
    up = _start_ray(address, checks)
    checks.done.wait()
    if checks.error is not None:
        raycluster.shutdown_ray()
        raise checks.error
    clock.mark("ray_start")
    return checks.result, RayTimes(clock.began, up, up - ray_began), checks.head


def _start_ray(address: str | None, checks: _ChecksThread) -> float:
    """Start the embedded Ray (this thread) while ``checks`` run: when it was up. Ray's error
    comes after the checks' (the user's to fix first), and leaves no head start packing."""
    try:
        line = raycluster.init_ray(address, quiet_driver_stderr=True)
    except Exception:
        checks.done.wait()
        if checks.head is not None:
            checks.head.abandon()
        if checks.error is not None:
            raise checks.error from None  # the user's to fix first
        raise
    up = time.perf_counter()
    logger.info(line)
    return up


class _ChecksThread:
    """``check()``, then ``then(result)`` (the head start), in a thread of their own, started
    at once; the head start's ``run`` goes on in it. ``done`` is set once both returned or one
    raised (``error``, raised in the main thread)."""

    def __init__(self, check: Callable[[], Any], then: Callable[[Any], Any] | None) -> None:
        self.check, self.then = check, then
        self.result: Any = None
        self.head: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, name="packfeed-checks", daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self.check()
            self.head = self.then(self.result) if self.then is not None else None
        except BaseException as exc:  # raised in the main thread
            self.error = exc
        finally:
            self.done.set()
        if self.head is not None:
            self.head.run()
