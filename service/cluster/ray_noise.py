"""Lines Ray prints on healthy runs that are not true of a packfeed run, kept off stderr.

A healthy ``packfeed train`` printed, at error level, Ray's

    core_worker.cc:2465: Actor with class name: 'MapWorker(MapBatches(WindowActor))' ... has
    constructor arguments in the object store and max_restarts > 0. If the arguments in the
    object store go out of scope or are lost, the actor restart will fail.

and the same for Ray Train's ``PreemptionWatcher``; ``packfeed serve`` added the GCS's
``gcs_actor_scheduler.cc: Failed to kill actor`` when it let an actor that had already exited
go. None of them can come true here:

* Ray Data prints the first for every actor pool, whatever its arguments (its own
  ``ActorLocationTracker`` handle is one: ray-project/ray#57733; measured on Ray 2.60 with
  ``map_batches`` of a class that takes none). The restart it warns about needs an argument
  lost while the actor's owner lives; packfeed's packing actors' arguments are owned by the
  driver, which holds them until its run ends, and the tracker is a detached actor. The
  ``PreemptionWatcher``'s arguments are actor handles, which the GCS keeps.
* The GCS's kill of an actor whose process is gone "fails" with nothing left to do.

And one warning that is true but transient: Ray Train's controller asks Ray Data's autoscaling
coordinator (an actor it starts) for the run's resources with a 5 s timeout, and on a loaded
machine the actor's process can take longer to start: "Failed to send resource request for
train-... If this only happens transiently ... it's safe to ignore this error", with the
traceback of the timeout. The controller asks again every 20 s, and a fixed cluster has nothing
to scale. Its first one in a process goes, traceback and all (``Transient``); a second (the
coordinator still not answering) is shown as the one line Ray wrote.

Both come out of Ray's C++ logging, by two roads. The other processes' lines reach the driver
through Ray's log forwarding, printed by its log thread: ``filter_forwarded_lines`` drops them
there, in Python, at no cost to any other line. The driver's own core worker writes straight to
file descriptor 2, which only a filter on the descriptor reaches: ``StderrFilter`` (fd 2 a pipe,
a thread copying every line but those above to the real stderr). That one is used by ``packfeed
pack`` alone (its driver runs the packing actors' pool; matched on the whole message, so any
other line of the same files still shows): a copy through a thread of the busy process lags
behind under load, and a SIGKILL loses what the pipe holds, which a server's log (read by its
operator and its tests while it runs) must not. ``packfeed serve`` of raw inputs, whose driver
runs the pool too, still shows Ray's line once at its start.
"""

from __future__ import annotations

import logging
import os
import re
import select
import sys
import threading

NOISE = (
    re.compile(rb"core_worker\.cc:\d+: Actor with class name: .* has constructor arguments in the object store and "
               rb"max_restarts > 0"),
    re.compile(rb"gcs_actor_scheduler\.cc:\d+: Failed to kill actor"),
)
PARTIAL_LINE_SECONDS = 0.2  # a line without its newline yet (a prompt) is copied after this long


TRANSIENT = re.compile(r"Failed to send resource request for train-\S+\. If this only happens transiently")


class Transient:
    """Forwarded lines less the transient warning above: each process's first one and its
    traceback (which may reach the driver in more than one batch) go; later ones keep their
    line, never their traceback."""

    def __init__(self) -> None:
        self.seen: set = set()  # processes whose first warning went
        self.after: dict = {}  # process -> "warned" (its traceback may follow) or "traceback" (arriving)

    def kept(self, pid, lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            state = self.after.pop(pid, None)
            header = state == "warned" and line.startswith("Traceback (most recent call last)")
            if header or (state == "traceback" and line[:1].isspace()):  # its header, a frame
                self.after[pid] = "traceback"
                continue
            if state == "traceback":  # the exception's own line ends it
                continue
            if TRANSIENT.search(line):
                self.after[pid] = "warned"
                if pid in self.seen:
                    out.append(line)
                self.seen.add(pid)
                continue
            out.append(line)
        return out


def is_noise(line: bytes) -> bool:
    return any(p.search(line) for p in NOISE)


def kept(data: bytes) -> bytes:
    """``data``'s complete lines but the noise (each with its newline)."""
    return b"".join(line for line in data.splitlines(keepends=True) if not is_noise(line))


class StderrFilter:
    """fd 2 through a pipe, the noise taken out (module docstring). ``stop`` puts fd 2 back."""

    def __init__(self) -> None:
        sys.stderr.flush()
        self.real = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        self.read_end = read_end
        self.thread = threading.Thread(target=self._copy, name="packfeed-stderr-filter", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        pending = b""
        while True:
            ready, _, _ = select.select([self.read_end], [], [], PARTIAL_LINE_SECONDS if pending else None)
            if not ready:  # a partial line has waited long enough: out it goes as it is
                self._write(pending if not is_noise(pending) else b"")
                pending = b""
                continue
            chunk = os.read(self.read_end, 1 << 16)
            if not chunk:
                break
            pending += chunk
            cut = pending.rfind(b"\n") + 1
            self._write(kept(pending[:cut]))
            pending = pending[cut:]
        self._write(kept(pending))
        os.close(self.read_end)

    def _write(self, data: bytes) -> None:
        while data:
            data = data[os.write(self.real, data):]

    def stop(self, timeout: float = 2.0) -> None:
        """fd 2 is the real stderr again; what the pipe still holds is copied first. A process
        started while the filter was on may hold the pipe open: the copying thread then goes on
        (a daemon) and the real descriptor's copy stays open for it."""
        sys.stderr.flush()
        os.dup2(self.real, 2)  # closes this process's last write end of the pipe
        self.thread.join(timeout)
        if not self.thread.is_alive():
            os.close(self.real)


_active: StderrFilter | None = None
_HANDLER = "ray_print_logs"  # the name Ray gives its log thread's printer (ray._private.worker)


def filter_forwarded_lines() -> None:
    """Drop the noise from the lines Ray forwards to this driver (its log thread's printer is
    wrapped once; a no-op where Ray prints no worker output here, ``log_to_driver=False``)."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    transient = Transient()
    with dispatcher._lock:
        for i, (name, handle) in enumerate(dispatcher.handlers):
            if name == _HANDLER and not getattr(handle, "_packfeed_quiet", False):
                def quiet(data, handle=handle):
                    lines = [line for line in data.get("lines", ()) if not is_noise(line.encode(errors="replace"))]
                    lines = transient.kept(data.get("pid"), lines)
                    if lines:
                        handle({**data, "lines": lines})
                quiet._packfeed_quiet = True
                dispatcher.handlers[i] = (name, quiet)


def filter_ray_noise() -> None:
    """Start filtering fd 2 (once; ``stop_filtering`` ends it)."""
    global _active
    if _active is None:
        _active = StderrFilter()


def stop_filtering() -> None:
    global _active
    if _active is not None:
        _active, active = None, _active
        active.stop()


def quiet_ray(*, after_init: bool = False, driver_stderr: bool = False) -> None:
    """Ray's loggers that print on every run: keep their warnings about real problems only.
    ``after_init`` (Ray is up): the lines above off the forwarded output, and with
    ``driver_stderr`` off this process's fd 2 too (the module docstring says why pack only)."""
    for name, level in (
        ("ray.data._internal.execution.streaming_executor", logging.WARNING),  # "Starting execution ..."
        ("ray.data._internal.progress", logging.ERROR),  # "Progress bars disabled ..."
        ("ray._private.authentication", logging.ERROR),  # "Token authentication is enabled ..."
        # "An exception was raised from a task of operator ..." and its traceback: the command
        # reports the task's error itself (one line for a user error, errors.py)
        ("ray.data._internal.execution.streaming_executor_state", logging.CRITICAL),
        ("ray.data.exceptions", logging.CRITICAL),  # its "Full stack trace:" of the same error
    ):
        logging.getLogger(name).setLevel(level)
    if after_init:
        filter_forwarded_lines()
        if driver_stderr:
            filter_ray_noise()
