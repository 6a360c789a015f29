"""Faults on purpose: make one chosen component fail at one chosen point (tests, operator drills).

Off unless ``$PACKFEED_FAULTS`` is set. It lists faults, comma-separated, each
``POINT:N[@RANK][:ACTION]``::

    PACKFEED_FAULTS="serve-row:1200"            # the server dies (SIGKILL) once it has sent row 1200
    PACKFEED_FAULTS="serve-row:1200:stop"       # ... is stopped (SIGTERM: it drains) once it has sent it
    PACKFEED_FAULTS="train-step:4@1"            # train worker rank 1 dies after completing step 4
    PACKFEED_FAULTS="packer-window:3:exit"      # the packing actor that starts window 3 dies
    PACKFEED_FAULTS="reader-window:2"           # the stream's reader fails between windows 2 and 3
    PACKFEED_FAULTS_DIR=/tmp/drill              # optional: each fault fires once across processes

| point | where it fires | default action |
| --- | --- | --- |
| ``packer-window:K`` | a packing actor (or ``pack``'s driver, head_start.py), as it starts window K | ``raise`` |
| ``reader-window:K`` | the hub's reader (serve, train's feeder), after window K's rows, before K+1's | ``raise`` |
| ``serve-row:R`` | ``packfeed serve``, once a batch holding row R was handed to gRPC | ``kill`` |
| ``train-step:S`` | a train worker (``@RANK``: that rank only), after step S (and its checkpoint) | ``exit`` |

Actions: ``raise`` (``FaultInjected``, an exception the component handles as any other),
``exit`` (``os._exit(FAULT_EXIT)``: the process dies without cleanup, as an OOM kill), ``kill``
(SIGKILL to the process itself: no handler, no drain), ``stop`` (SIGTERM to the process itself,
as an operator's or Kubernetes' stop: its handler runs, a server drains; the component goes on
until then).

A fault fires once per process. With ``$PACKFEED_FAULTS_DIR`` it fires once across every
process that shares that directory (a marker file is created there): a train worker that Ray
Train restarts from a checkpoint before step S, or a server restarted with the same
environment, passes the point again without dying again.

Processes that Ray starts do not see the driver's environment as it is now: the driver hands
``environment()`` to the components it creates (packing actors, train workers), which call
``adopt()`` first thing. The check is one dictionary look-up when no fault is set.
"""

from __future__ import annotations

import os
import re
import signal
import threading

FAULTS_ENV = "PACKFEED_FAULTS"
FAULTS_DIR_ENV = "PACKFEED_FAULTS_DIR"
FAULT_EXIT = 70  # os._exit status of the ``exit`` action (EX_SOFTWARE), told apart from a real crash

POINTS = {"packer-window": "raise", "reader-window": "raise", "serve-row": "kill", "train-step": "exit"}
ACTIONS = ("raise", "exit", "kill", "stop")
_ENTRY = re.compile(r"(?P<point>[a-z-]+):(?P<at>\d+)(?:@(?P<rank>\d+))?(?::(?P<action>[a-z]+))?")


class FaultInjected(RuntimeError):
    """Raised at a fault point whose action is ``raise``."""


def parse(text: str) -> list[tuple[str, int, int | None, str]]:
    """``$PACKFEED_FAULTS`` -> [(point, at, rank or None, action)]; ValueError naming the entry."""
    faults = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        match = _ENTRY.fullmatch(entry)
        if match is None or match["point"] not in POINTS:
            raise ValueError(f"${FAULTS_ENV}: {entry!r} is not POINT:N[@RANK][:ACTION] with POINT one of "
                             f"{', '.join(POINTS)}")
        action = match["action"] or POINTS[match["point"]]
        if action not in ACTIONS:
            raise ValueError(f"${FAULTS_ENV}: {entry!r}: action {action!r} is not one of {', '.join(ACTIONS)}")
        rank = None if match["rank"] is None else int(match["rank"])
        faults.append((match["point"], int(match["at"]), rank, action))
    return faults


def configured() -> list[tuple[str, int, int | None, str]]:
    """The faults of this process's environment (ValueError when malformed)."""
    return parse(os.environ.get(FAULTS_ENV, ""))


def environment() -> dict[str, str]:
    """The fault settings of this process, for the processes it starts through Ray."""
    return {k: os.environ[k] for k in (FAULTS_ENV, FAULTS_DIR_ENV) if os.environ.get(k)}


def adopt(env: dict[str, str] | None) -> None:
    """Take the settings ``environment()`` gave (in a packing actor or a train worker)."""
    for key in (FAULTS_ENV, FAULTS_DIR_ENV):
        if env and env.get(key):
            os.environ[key] = env[key]
        else:
            os.environ.pop(key, None)


_fired: set[tuple[str, int, int | None]] = set()
_lock = threading.Lock()


def armed(name: str) -> list[int]:
    """The N of every fault set at point ``name`` (empty when none: the common case, one look-up)."""
    text = os.environ.get(FAULTS_ENV)
    return [at for point_name, at, _, _ in parse(text) if point_name == name] if text else []


def point(name: str, at: int, *, rank: int | None = None) -> None:
    """Fail here when ``$PACKFEED_FAULTS`` names (``name``, ``at``[, ``rank``]); else return."""
    text = os.environ.get(FAULTS_ENV)
    if not text:
        return
    for fault_name, fault_at, fault_rank, action in parse(text):
        if (fault_name, fault_at) != (name, at) or fault_rank not in (None, rank):
            continue
        if not _first_time((fault_name, fault_at, fault_rank)):
            return
        where = f"{name}:{at}" + ("" if rank is None else f" (rank {rank})")
        if action == "raise":
            raise FaultInjected(f"fault injected at {where} (${FAULTS_ENV})")
        print(f"packfeed: fault injected at {where}: {action} (${FAULTS_ENV})", flush=True)
        if action == "stop":
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(FAULT_EXIT)


def _first_time(key: tuple[str, int, int | None]) -> bool:
    """True once per process, and once across processes when $PACKFEED_FAULTS_DIR is set."""
    with _lock:
        if key in _fired:
            return False
        _fired.add(key)
    directory = os.environ.get(FAULTS_DIR_ENV)
    if not directory:
        return True
    marker = os.path.join(directory, f"{key[0]}-{key[1]}-{'any' if key[2] is None else key[2]}.fired")
    try:
        os.makedirs(directory, exist_ok=True)
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
