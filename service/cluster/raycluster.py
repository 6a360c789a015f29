"""Ray start-up for every packfeed command: which Ray, how quiet, and what it can hold.

* ``prepare_ray_env()`` runs before ``import ray`` (Ray reads these at import): token
  authentication stays on for an embedded Ray (set explicitly, so Ray does not warn about its
  default on every start), no usage stats.
* ``init_ray(address)`` joins ``address`` / $RAY_ADDRESS (checking first that the head answers,
  so a wrong address is one clear line, not a minute of retries) or starts an embedded Ray.
  ``$PACKFEED_AUTH_TOKEN`` is removed from the environment first: Ray's worker processes inherit
  the driver's environment, and the serve token must not travel with them.
* ``quiet_ray()`` (ray_noise.py) turns down what Ray prints on every run that says nothing to a packfeed user
  (Ray Data's execution plan lines and its progress-bar notice); ray_noise.py keeps Ray's
  error lines that are untrue of a packfeed run off stderr.
* Shutdown in order. ``ray.init`` makes SIGTERM call ``sys.exit`` and leaves the teardown to
  Ray's atexit hook, while Ray Data's executor and prefetch threads may still be running; a
  thread that touches Ray after its core worker is gone aborts the process ("The core worker
  has already been shutdown", exit 1) and leaves Ray's processes behind. So ``init_ray``
  replaces that handler with one that raises ``Terminated`` in the main thread, and
  ``shutdown_ray()`` first waits for Ray Data's threads to end, then shuts Ray down. Ray's own
  shutdown stops the embedded Ray's processes one by one, raylet then GCS first, each waited
  for. Signalled all at once instead (measured) they took as long, and the raylet's workers
  were still alive 10 s later: the order stays Ray's. Only the autoscaler monitor, which cannot
  stop once the GCS is gone, is killed first (``_kill_autoscaler_monitor``), and what Ray leaves
  running below its processes (workers, dashboard modules) is stopped after (``_stop_and_wait``).

An embedded Ray (embedded_ray.py) listens on loopback only. Ray takes the machine's address as
the node's (``ray.init`` maps 127.0.0.1 to it), and its servers (gcs_server, raylet, workers,
agents) then listen on every interface. In Ray's single-node mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
the default on macOS and Windows) the node's address is 127.0.0.1 and every one of them binds
127.0.0.1 (measured with Ray 2.60: ``ss -ltnp`` lists no Ray socket elsewhere). ``init_ray``
turns that mode on while the Ray it starts comes up, never for one it joins (a cluster's nodes
must reach each other), and leaves the process's environment as it was. Token
authentication, kept on above, still guards a cluster's ports. A start whose node misses
Ray's fixed start-up limits on a busy machine is made again (``embedded_ray.start_embedded``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Iterator

from packfeed.client.transport import TOKEN_ENV
from packfeed.service.cluster.embedded_ray import free_port, start_embedded
from packfeed.service.cluster.ray_noise import quiet_ray, stop_filtering

DEFAULT_OBJECT_STORE_BYTES = 1 << 30  # Ray's default (30% of RAM) is more than a small machine can spare
# What a packing actor imports, imported by every worker of an embedded Ray as it starts (Ray's
# preload_python_modules): the workers Ray starts with itself do it while the driver's checks
# run, not after the pipeline asks for its actors. Measured: a Ray Data actor's __init__ began
# 0.5-1.0 s after the pipeline asked for it, 1.7-2.4 s without.
WORKER_PRELOAD_MODULES = ("ray.data", "pyarrow", "packfeed.service.pipeline.ray_pipeline",
                          "packfeed.service.tokenize.samples")
RAY_DATA_THREADS = ("StreamingExecutor", "iter_threaded", "Prefetcher")  # how the threads shutdown_ray waits for begin


class Terminated(BaseException):
    """SIGTERM arrived (raised in the main thread; the CLI exits 143 after shutting Ray down)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated(signal.Signals(signum).name)


def ray_initialised() -> bool:
    """Whether this process has an initialised Ray (never imports Ray to find out)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def shutdown_ray(timeout: float = 60.0) -> None:
    """Shut this process's Ray down in order: Ray Data's executor threads finish first (they
    were told to stop when their iterator closed, and Ray Data waits for them only 2 s), its
    iterator threads end (``iter_threaded``: told to stop when their iterator is collected, they
    drop the block references they hold on their way out), its block prefetchers are stopped and
    joined (a reader stopped mid-stream leaves its prefetcher parked), then ``ray.shutdown()``,
    then the processes left below the embedded Ray's are stopped and waited for. A Ray Data
    thread that touches Ray after the shutdown (a ``ray.wait``, an ObjectRef freed) aborts the
    process with exit 1 ("The core worker has already been shutdown"), after a clean drain.
    Without any of those threads (every read ran to its end, as in ``packfeed pack``) Ray goes
    down at once: the two collections cost 0.2 s each with torch and Ray loaded (measured), and
    no thread is left to touch Ray after it. Last, stderr is the real one again. No-op without Ray."""
    if not ray_initialised():
        stop_filtering()
        return
    ray = sys.modules["ray"]
    if any(t.name.startswith(RAY_DATA_THREADS) for t in threading.enumerate()):
        _stop_ray_data_threads(timeout)
    below = _below_embedded_ray()
    _kill_autoscaler_monitor()
    ray.shutdown()
    _stop_and_wait(below)
    stop_filtering()


def _stop_ray_data_threads(timeout: float) -> None:
    """``shutdown_ray``'s waits for Ray Data's threads, in its order."""
    import gc

    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name.startswith("StreamingExecutor") and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
    gc.collect()  # a closed reader's iterators are collected here: their threads are told to stop
    iterators_deadline = min(deadline, time.monotonic() + 10.0)  # they poll every 0.1 s
    for thread in threading.enumerate():
        if thread.name == "iter_threaded":
            thread.join(max(0.0, iterators_deadline - time.monotonic()))
        prefetcher = getattr(getattr(thread, "_target", None), "__self__", None)  # Ray Data's WaitBlockPrefetcher
        if thread.name == "Prefetcher" and callable(getattr(prefetcher, "stop", None)):
            prefetcher.stop()
            thread.join(max(0.0, deadline - time.monotonic()))
    gc.collect()  # what those threads dropped


def _kill_autoscaler_monitor(timeout: float = 10.0) -> None:
    """SIGKILL the autoscaler monitor of the Ray this process started, before ``ray.shutdown()``.

    Ray stops the monitor after the GCS. Its SIGTERM handler reports "the autoscaler failed" to
    the GCS, which is gone by then: it waits there until Ray's 1 s grace ends in a SIGKILL
    (measured with Ray 2.60: 1.0 s of ``ray.shutdown``'s 1.2-1.4 s; 5 s after a SIGTERM it was
    still alive). Stopped while the GCS is up, it exited in 0.7 s, its report printed as a
    traceback by the driver. Killed first, nothing is reported and ``ray.shutdown`` takes
    0.15-0.4 s. The monitor holds nothing to save (an embedded Ray scales nothing). A joined
    cluster's node lists no process of this one: nothing is killed then."""
    from ray._private import ray_constants, worker

    processes = getattr(worker._global_node, "all_processes", None)  # Ray's record of the processes it started
    if not processes:
        return
    for info in processes.pop(ray_constants.PROCESS_TYPE_MONITOR, []):
        info.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel: Ray's own shutdown abandons it too
            info.process.wait(timeout)


def _below_embedded_ray() -> list:
    """The processes below those of the Ray this process started (its workers and agents, the
    raylet's children; none for a joined cluster), as ``psutil.Process``: ``ray.shutdown()``
    reaps the processes it started, not theirs."""
    import psutil
    from ray._private import worker

    below = []
    for infos in getattr(worker._global_node, "all_processes", {}).values():
        for info in infos:
            with contextlib.suppress(psutil.NoSuchProcess):
                below += psutil.Process(info.process.pid).children(recursive=True)
    return below


def _stop_and_wait(processes: list, timeout: float = 5.0) -> None:
    """SIGTERM ``processes`` (as a raylet stops a worker) and return once they have exited,
    killing those still alive after ``timeout`` s (Ray's grace for a worker it stops,
    ``kill_worker_timeout_milliseconds``).

    A raylet stopped by ``ray.shutdown()`` exits before its workers, and the dashboard before
    its modules; left alone they end on their own, a packing actor through Python's whole exit
    (Ray Data, pyarrow, the tokenizer loaded), a fraction of a second after the raylet on an
    idle machine, seconds on a loaded one, ``train``'s dashboard modules and controller about a
    second: the command's exit would come first and leave them running. Told to stop, they are
    gone in a fraction of a second: when the command exits, its Ray is gone."""
    import psutil

    def running(process) -> bool:
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    deadline = time.monotonic() + timeout
    alive = [p for p in processes if running(p)]
    while alive and time.monotonic() < deadline:  # not psutil.wait_procs: it polls one at a time, up to 1 s late
        time.sleep(0.02)
        alive = [p for p in alive if running(p)]
    for process in alive:  # stuck: its Ray is gone, nothing will ever use it
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


_PREFETCHERS = threading.local()  # the block prefetchers the current thread's Ray Data reads started


@contextlib.contextmanager
def stopping_block_prefetchers(timeout: float = 10.0) -> Iterator[None]:
    """Stop, on the way out, the block prefetchers Ray Data starts in this thread within the block.

    Ray Data stops a reader's prefetcher only when the reader runs to its end: one closed
    mid-stream (a hub reader superseded or drained) leaves its thread parked for good, holding
    references to the last blocks it fetched (one window's rows in the object store, each time).
    Prefetchers are created in the thread that starts the iteration, so the thread knows its own.
    """
    _track_prefetchers()
    previous, owned, owner = getattr(_PREFETCHERS, "owned", None), [], threading.current_thread()
    _PREFETCHERS.owned = owned
    try:
        yield
    finally:
        if threading.current_thread() is owner:  # a generator collected elsewhere leaves that thread's alone
            _PREFETCHERS.owned = previous
        for prefetcher in owned:
            prefetcher.stop()
            thread = getattr(prefetcher, "_thread", None)
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout)


def _track_prefetchers() -> None:
    """Have Ray Data's WaitBlockPrefetcher report itself to the thread that creates it (once)."""
    try:
        from ray.data._internal.block_batching.util import WaitBlockPrefetcher
    except ImportError:  # another Ray: shutdown_ray still stops what it finds at exit
        return
    if getattr(WaitBlockPrefetcher, "_packfeed_tracked", False):
        return
    created = WaitBlockPrefetcher.__init__

    def __init__(self, *args, **kwargs):
        created(self, *args, **kwargs)
        owned = getattr(_PREFETCHERS, "owned", None)
        if owned is not None:
            owned.append(self)

    WaitBlockPrefetcher.__init__ = __init__
    WaitBlockPrefetcher._packfeed_tracked = True


def prepare_ray_env() -> None:
    """Environment for Ray; call before Ray is imported (the CLI does, first thing). Once Ray is
    imported its auth mode is fixed: setting it then would start an embedded Ray whose GCS
    wants a token this driver does not send, so it is left to Ray's default."""
    if "ray" not in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")


def joins_a_cluster(address: str | None) -> bool:
    """``init_ray(address)`` would join a running cluster (not start an embedded Ray, not reuse
    this process's). A command then joins before it plans: the scan runs as Ray tasks on the
    cluster's nodes (inputs/scan_tasks.py), which read a bucket in parallel rather than through
    this one process. An embedded Ray has this machine only: planning first keeps every check
    of the inputs answering before Ray's start-up. Imports no Ray (a run may start none)."""
    address = address or os.environ.get("RAY_ADDRESS")
    return bool(address) and address != "local" and not ray_initialised()


def init_ray(address: str | None = None, *, num_cpus: int | None = None, dashboard: bool = False,
             quiet_driver_stderr: bool = False) -> str:
    """Join ``address`` (or ``$RAY_ADDRESS``), else start an embedded single-node Ray.

    Does nothing when Ray is already initialised (tests, Ray jobs). ``address="local"`` always
    starts a fresh embedded Ray, never a stale cluster left by ``ray start``. ``dashboard``
    starts Ray's dashboard on 127.0.0.1 with the embedded Ray (Ray Train needs its State API).
    Returns a line saying which Ray is used, for the user.
    """
    prepare_ray_env()
    os.environ.pop(TOKEN_ENV, None)
    import ray

    quiet_ray()
    if ray.is_initialized():
        return "Ray: already initialised in this process"
    address = address or os.environ.get("RAY_ADDRESS")
    previous = signal.getsignal(signal.SIGTERM)  # ray.init replaces it
    if address and address not in ("local", "auto"):
        check_reachable(address)
        _ray_init(previous, address=address, logging_level=logging.WARNING)
        quiet_ray(after_init=True, driver_stderr=quiet_driver_stderr)
        return f"Ray: joined the cluster at {address} ({ray.cluster_resources().get('CPU', 0):g} CPUs)"
    if address == "auto":
        _ray_init(previous, address="auto", logging_level=logging.WARNING)
        quiet_ray(after_init=True, driver_stderr=quiet_driver_stderr)
        return f"Ray: joined the local cluster ({ray.cluster_resources().get('CPU', 0):g} CPUs)"
    extra = {}
    if dashboard:
        # Ray Train's placement-group cleaner finds "the" cluster through the State API; with a
        # second Ray on this machine it cannot tell which and logs a ConnectionError. Give the
        # dashboard a port of our own and tell every process of this Ray where it is.
        port = free_port()
        os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"
        extra["dashboard_port"] = port
    start_embedded(
        functools.partial(_ray_init, previous),
        num_cpus=num_cpus,  # None: Ray counts the CPUs this process may use (container limits too)
        object_store_memory=DEFAULT_OBJECT_STORE_BYTES,
        include_dashboard=dashboard,
        dashboard_host="127.0.0.1",
        logging_level=logging.WARNING,
        _system_config={"preload_python_modules": list(WORKER_PRELOAD_MODULES)},
        **extra,
    )
    quiet_ray(after_init=True, driver_stderr=quiet_driver_stderr)
    return f"Ray: started an embedded local Ray ({ray.cluster_resources().get('CPU', 0):g} CPUs)"


def _ray_init(previous, **kwargs) -> None:
    """``ray.init(**kwargs)`` with this process's SIGTERM handling kept throughout.

    ray.init installs ``sys.exit`` as the SIGTERM handler first thing, for the whole start-up
    (seconds): a SIGTERM then was a SystemExit(15) out of the middle of ray.init, with no drain.
    Ours stays in place (``serve``: the stop it drains on; else ``Terminated``), then is set again."""
    import ray

    _own_sigterm(previous)
    utils = ray._private.utils
    replace = utils.set_sigterm_handler
    utils.set_sigterm_handler = lambda handler: None
    try:
        ray.init(**kwargs)
    finally:
        utils.set_sigterm_handler = replace
    _own_sigterm(previous)


def _own_sigterm(previous) -> None:
    """Replace ray.init's SIGTERM handler (sys.exit, teardown in atexit): with the handler the
    process had installed before (``serve`` drains on it), else with ours (``Terminated``)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous if callable(previous) else _raise_terminated)


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """ValueError unless something listens at ``address`` ("host:port" or "ray://host:port")."""
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Ray address {address!r} is not host:port (e.g. 127.0.0.1:6379)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise ValueError(
            f"cannot reach the Ray head at {address} ({e.strerror or e}): start it (deploy/local/start.sh, "
            "`ray start --head`) or fix --address / $RAY_ADDRESS"
        ) from None
