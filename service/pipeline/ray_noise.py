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

Both come out of Ray's C++ logging: the driver's own core worker writes straight to file
descriptor 2, and the other processes' lines reach it through Ray's log forwarding. So the
filter sits on the descriptor: while this command's Ray is up, fd 2 is a pipe and a thread
copies every line to the real stderr except those above (matched on their whole message, so
any other line of the same files still shows). ``init_ray`` installs it once its Ray is up
(the processes ``ray.init`` started keep the real stderr), ``shutdown_ray`` takes it away
after the shutdown; a traceback that ends the command is printed after that, on the real
stderr.
"""

from __future__ import annotations

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
