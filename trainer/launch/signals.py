"""SIGTERM and SIGINT during ``packfeed train``: the first stops the run in order, a second at once.

``ray job stop`` and Kubernetes send SIGTERM (Ray's job supervisor SIGKILLs the driver
``RAY_JOB_STOP_WAIT_TIME_S`` later), a terminal's Ctrl-C sends SIGINT. The driver's main thread
must see them at once, but it cannot act inside Ray: an exception raised by a handler while the
thread is inside Ray's Cython ``ray.get`` comes out as ``SystemError: ... returned a result with
an exception set``. So ``StopSignals`` handlers raise only while the driver runs plain Python
(before Ray starts); from ``defer()`` on they record the signal, and the driver acts on it where
it can: ``check()`` between its steps, and its wait for ``trainer.fit()`` (run in another thread)
asks the feeder for an orderly stop on the first signal and gives up on the second (``urgent``).

The stop ends the run with the exception the CLI maps to the signal's exit status:
``Terminated`` (SIGTERM, 143) or ``KeyboardInterrupt`` (SIGINT, 130).

Under torchrun (``StopSignals(forwarded=True)``) each rank's handlers only record: the launcher
forwards the signal the process group got to every rank, so a later signal is the same request,
never an urgent one; the ranks agree on the stop step themselves (launch/torchrun.py).
"""

from __future__ import annotations

import logging
import signal
import threading

from packfeed.service.face import Terminated

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_exception(name: str) -> BaseException:
    """What ends a run stopped by the signal ``name``: ``KeyboardInterrupt`` for SIGINT (the CLI
    exits 130), ``Terminated`` for any other (143)."""
    return KeyboardInterrupt() if name == "SIGINT" else Terminated(name)


class StopSignals:
    """Context manager: SIGTERM/SIGINT handlers of the main thread for its duration (the previous
    ones come back on exit). In another thread it installs nothing (Python allows handlers in
    the main thread only) and no signal is ever seen. ``forwarded``: torchrun's mode (see the
    module docstring): recorded from the start, the first signal only."""

    def __init__(self, *, forwarded: bool = False) -> None:
        self.received: list[int] = []
        self.forwarded = forwarded
        self._deferred = forwarded
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.forwarded:
            if not self.received:
                self.received.append(signum)
                logger.info("%s: every rank stops after the step it is in, with a checkpoint", self.name)
            return
        self.received.append(signum)
        if not self._deferred:
            raise self.exception()

    def defer(self) -> None:
        """From now on the main thread may be inside Ray: signals are recorded, never raised."""
        self._deferred = True

    @property
    def requested(self) -> bool:
        """A signal arrived: stop in order."""
        return bool(self.received)

    @property
    def urgent(self) -> bool:
        """A second signal arrived: stop at once."""
        return len(self.received) > 1

    @property
    def name(self) -> str:
        """The first signal's name (SIGTERM, SIGINT)."""
        return signal.Signals(self.received[0]).name

    def exception(self) -> BaseException:
        """What ends the run after the first signal: the CLI exits 143 (SIGTERM) or 130 (SIGINT)."""
        return stop_exception(self.name)

    def check(self) -> None:
        """Raise ``exception()`` when a signal has arrived (between the driver's steps)."""
        if self.received:
            raise self.exception()
