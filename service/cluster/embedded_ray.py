"""Starting an embedded Ray: on loopback, in a process group of its own, its dashboard agent on a
free port, and started again when a busy machine makes its node miss Ray's start-up limits.

Ray's start-up has two fixed limits. The raylet waits 15 s for its dashboard agent (a Python
process with about 2 s of imports on an idle core) to write its ports, then aborts; ``ray.init``
waits 30 s for the raylet to register, then raises "The current node timed out during
startup". Neither can be set (``RAY_agent_register_timeout_ms`` does not reach the first in Ray
2.60: an agent held 25 s still failed the start, measured). On 2 cores that other processes keep
busy (a second training run, a test suite: load 15) the agent's imports took longer than 15 s
and the command ended there with Ray's traceback. ``start_embedded`` kills what that attempt
left (every process of its group) and starts Ray again, up to ``START_ATTEMPTS`` times, saying
so; the last failure is one line (``RayStartTimedOut``, a command's exit 2). A start that fails
for any other reason is not retried.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import signal
import socket
import time
from typing import Callable, Iterator

import psutil

logger = logging.getLogger("packfeed")

START_ATTEMPTS = 3
NODE_TIMED_OUT = "The current node timed out during startup"  # ray._private.node.Node's message


class RayStartTimedOut(OSError):
    """Ray's node missed its start-up limits on every attempt: the machine is too busy."""


def start_embedded(init: Callable[..., object], *, loopback: bool = True, **kwargs) -> None:
    """``init(address="local", **kwargs)`` (``ray.init`` or a wrapper of it) on loopback, in a
    process group of its own, with the agent on a free port; again while the node misses Ray's
    start-up limits (module docstring). ``loopback=False`` keeps Ray's own choice of the node's
    address: for a Ray that drivers in other processes join by its GCS address (a driver that
    joins takes the machine's address for its own, and a node on 127.0.0.1 is not its node)."""
    for attempt in range(1, START_ATTEMPTS + 1):
        on_loopback = _single_node_on_loopback() if loopback else contextlib.nullcontext()
        with on_loopback, _own_process_group() as group, agent_on_a_free_port():
            try:
                init(address="local", **copy.deepcopy(kwargs))  # ray.init fills in its _system_config
                return
            except Exception as error:
                if NODE_TIMED_OUT not in str(error):
                    raise
                _kill_group(group)
                if attempt == START_ATTEMPTS:
                    raise RayStartTimedOut(
                        f"Ray's node did not come up within Ray's start-up limits in {START_ATTEMPTS} "
                        "attempts (its dashboard agent gets 15 s to start, the node 30 s to register): "
                        "this machine is too busy for an embedded Ray; run the command again when it is "
                        "less loaded, or join a running cluster with --address") from None  # the line says it
        logger.warning("Ray's node did not come up within Ray's start-up limits (a busy machine: its "
                       "agent started too slowly); starting it again (attempt %d of %d)",
                       attempt + 1, START_ATTEMPTS)


def _kill_group(group: list[int], timeout: float = 10.0) -> None:
    """SIGKILL every process of a failed start's group; return once none is left running (this
    process reaps those it started: gcs_server, raylet, the monitors)."""
    if not group:
        return
    pgid = group[0]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-pgid, os.WNOHANG)[0]:
                pass
        running = []
        for process in psutil.process_iter(["status"]):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                    running.append(process.pid)
        if not running:
            return
        time.sleep(0.05)
    logger.warning("processes of a failed Ray start (group %d) outlived SIGKILL for %.0f s", pgid, timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _single_node_on_loopback() -> Iterator[None]:
    """Ray's single-node mode while an embedded Ray starts: the node's address is 127.0.0.1, so
    gcs_server, raylet, workers and agents listen on loopback only. Ray reads the mode from its
    module constant (this process) and from the environment (the processes it starts, which
    copy it at their start). Both are restored after: a ``ray start`` this process runs later
    (a worker node joining a cluster) must not inherit a mode that refuses to join."""
    import ray._private.ray_constants as ray_constants

    name = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    saved_env, saved_constant = os.environ.get(name), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[name] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_constant
        if saved_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved_env


@contextlib.contextmanager
def _own_process_group() -> Iterator[list[int]]:
    """Every process an embedded Ray starts joins one process group of its own (the first one,
    gcs_server, leads it; raylet's agents inherit it; raylet gives each worker a group of its own).

    In the caller's group (Ray's default on Linux) a signal to that group, Ctrl-C's SIGINT or
    ``kill -TERM -PGID`` as a container runtime or a user sends it, also reached gcs_server,
    raylet and the agents, killing Ray under the draining command: the driver then waited on
    a dead GCS until Ray's 60 s reconnect limit ended it with exit 1 ("Failed to connect to GCS
    ... The program will terminate"), 2 of 8 SIGTERMs mid-stream. Apart, the signal reaches the
    command alone, and it shuts Ray down in order. A driver that dies still takes its Ray with it:
    Ray's own fate-sharing (the kernel's parent-death signal) does not depend on the group.

    Yields the group, as a list that holds its id once Ray's first process has started."""
    import ray._private.services as services

    if os.name != "posix":  # Ray gives each of its processes a group of its own on Windows already
        yield []
        return
    base = services.ConsolePopen
    group: list[int] = []

    class GroupedPopen(base):
        def __init__(self, *args, **kwargs):
            inner, target = kwargs.get("preexec_fn"), group[0] if group else 0

            def preexec() -> None:
                try:
                    os.setpgid(0, target)
                except OSError:  # the group is gone: stay in the caller's, as Ray would
                    pass
                if inner is not None:
                    inner()

            kwargs["preexec_fn"] = preexec
            super().__init__(*args, **kwargs)
            if not group:
                group.append(self.pid)

    services.ConsolePopen = GroupedPopen
    try:
        yield group
    finally:
        services.ConsolePopen = base


@contextlib.contextmanager
def agent_on_a_free_port() -> Iterator[None]:
    """An embedded Ray's dashboard agent listens on a free port, not Ray's fixed 52365.

    ``ray.init`` has no argument for it. With another Ray on the machine (a second packfeed
    command, a notebook's Ray) the port is taken: the agent retried it for 3.5 s, then raylet
    went on without its HTTP server, every start 4 s slower (2.3 s -> 6.3 s measured). The
    port is recorded with the node, so Ray's own processes find it."""
    import ray._private.parameter as parameter

    base = parameter.RayParams

    class Params(base):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("dashboard_agent_listen_port", free_port())
            super().__init__(*args, **kwargs)

    parameter.RayParams = Params
    try:
        yield
    finally:
        parameter.RayParams = base
