"""``shutdown_ray``'s quick and complete end of an embedded Ray (issue 25: the seconds after the
work). Ray's processes are stood in for by real ones (``sleep``, a Python that ignores SIGTERM
as Ray's autoscaler monitor does once its GCS is gone) in a node record shaped as Ray's; Ray
itself never starts here."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import types

import psutil
import pytest
import ray._private.worker

from packfeed.service.cluster import raycluster

IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"


def started(*argv: str) -> subprocess.Popen:
    return subprocess.Popen(list(argv), stdout=subprocess.PIPE, text=True)


def stubborn() -> subprocess.Popen:
    """A process that outlives SIGTERM (ready once it says so: the handler is set)."""
    process = started(sys.executable, "-c", IGNORES_SIGTERM)
    assert process.stdout.readline() == "up\n"
    return process


@pytest.fixture
def processes():
    """Processes a test starts, killed and reaped after it."""
    mine: list[subprocess.Popen] = []
    yield mine
    for process in mine:
        process.kill()
        process.wait()


def node_with(monkeypatch, **by_type: list[subprocess.Popen]) -> dict:
    """Ray's record of the processes it started (``_global_node.all_processes``)."""
    record = {kind: [types.SimpleNamespace(process=p) for p in ps] for kind, ps in by_type.items()}
    monkeypatch.setattr(ray._private.worker, "_global_node", types.SimpleNamespace(all_processes=record))
    return record


def test_the_monitor_is_killed_at_once_and_forgotten_and_nothing_else_is_touched(monkeypatch, processes):
    monitor, raylet, gcs = stubborn(), started("sleep", "60"), started("sleep", "60")
    processes += [monitor, raylet, gcs]
    record = node_with(monkeypatch, monitor=[monitor], raylet=[raylet], gcs_server=[gcs])
    start = time.monotonic()
    raycluster._kill_autoscaler_monitor()
    assert time.monotonic() - start < 0.5, "no SIGTERM grace: Ray's own stop waited 1 s for it"
    assert monitor.returncode == -signal.SIGKILL, "killed and reaped"
    assert set(record) == {"raylet", "gcs_server"}, "Ray's own shutdown no longer stops it"
    assert raylet.poll() is None and gcs.poll() is None, "Ray's order for the others"


@pytest.mark.parametrize("node", [None, types.SimpleNamespace(all_processes={})], ids=["ray-client", "joined-cluster"])
def test_a_ray_this_process_did_not_start_has_no_process_killed_or_waited_for(monkeypatch, node):
    monkeypatch.setattr(ray._private.worker, "_global_node", node)
    raycluster._kill_autoscaler_monitor()  # nothing to kill, no error
    assert raycluster._below_embedded_ray() == []


def test_the_processes_below_the_started_ones_are_found_whatever_their_depth(monkeypatch, processes):
    # a raylet stand-in with two workers, one of which started a process of its own
    raylet = started("sh", "-c", "sleep 60 & sh -c 'sleep 60 & wait' & wait")
    processes.append(raylet)
    node_with(monkeypatch, raylet=[raylet], gcs_server=[])
    expected, deadline = ["sh", "sleep", "sleep"], time.monotonic() + 10
    below = raycluster._below_embedded_ray()
    while sorted(p.name() for p in below) != expected:  # until every one has started
        assert time.monotonic() < deadline, [p.name() for p in below]
        time.sleep(0.05)
        below = raycluster._below_embedded_ray()
    assert raylet.pid not in {p.pid for p in below}, "Ray reaps the processes it started itself"
    for p in below:
        p.kill()


def exiting_on_sigterm_after(seconds: float) -> subprocess.Popen:
    """A process that exits ``seconds`` after its SIGTERM (a worker's own exit), not before."""
    code = (f"import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: (time.sleep({seconds}), sys.exit(0))); "
            "print('up', flush=True); time.sleep(60)")
    process = started(sys.executable, "-c", code)
    assert process.stdout.readline() == "up\n"
    return process


@pytest.mark.parametrize("delays", [(0.0,), (0.3,), (0.0, 0.6), (0.2, 0.4, 0.8)], ids=str)
def test_what_is_left_below_is_told_to_stop_and_waited_for_to_its_last_exit(processes, delays):
    """Without the SIGTERM none would end for 60 s; with it, the wait ends with the last exit."""
    processes += [exiting_on_sigterm_after(d) for d in delays]
    start = time.monotonic()
    raycluster._stop_and_wait([psutil.Process(p.pid) for p in processes], timeout=10)
    took = time.monotonic() - start
    assert [p.wait(5) for p in processes] == [0] * len(delays), "each exited on its own, none killed"
    assert max(delays) <= took < max(delays) + 2.0, took  # not the 10 s timeout (2 s: a loaded CI machine)


def test_a_process_still_alive_at_the_timeout_is_killed(processes):
    process = stubborn()
    processes.append(process)
    start = time.monotonic()
    raycluster._stop_and_wait([psutil.Process(process.pid)], timeout=0.3)
    assert 0.3 <= time.monotonic() - start < 5.0  # killed at the timeout, not after its 60 s
    assert process.wait(5) == -signal.SIGKILL


@pytest.mark.parametrize("ray_data_thread", [None, "iter_threaded", "Prefetcher", "StreamingExecutor-1"])
def test_shutdown_order_and_ray_data_threads_waited_for_only_when_there_are_some(monkeypatch, ray_data_thread):
    events: list[str] = []
    fake_ray = types.SimpleNamespace(is_initialized=lambda: True, shutdown=lambda: events.append("ray.shutdown"))
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    monkeypatch.setattr(raycluster, "_stop_ray_data_threads", lambda timeout: events.append("Ray Data threads"))
    monkeypatch.setattr(raycluster, "_below_embedded_ray", lambda: events.append("what is below") or ["worker"])
    monkeypatch.setattr(raycluster, "_kill_autoscaler_monitor", lambda: events.append("monitor killed"))
    monkeypatch.setattr(raycluster, "_stop_and_wait", lambda below: events.append(f"stop and wait for {below}"))
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name=ray_data_thread or "some-other-thread", daemon=True)
    thread.start()
    try:
        raycluster.shutdown_ray()
    finally:
        release.set()
    expected = ["what is below", "monitor killed", "ray.shutdown", "stop and wait for ['worker']"]
    assert events == (["Ray Data threads"] if ray_data_thread else []) + expected
