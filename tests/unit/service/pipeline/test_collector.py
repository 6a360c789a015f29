"""The collector around a packing process's windows (pipeline/collector.py): no pass inside a
window, the collector as it was after it (an exception too), the window's cycles freed on the
way out, and a process's tracked objects flat over many windows."""

import gc
import weakref

import pytest

from packfeed.service.pipeline.collector import collector_paused, freeze_setup


class Node:
    def __init__(self) -> None:
        self.other = None


def _cycles(n: int) -> weakref.ref:
    """``n`` two-object cycles, unreachable on return; a weak reference to one of them."""
    first = None
    for _ in range(n):
        a, b = Node(), Node()
        a.other, b.other = b, a
        first = first or weakref.ref(a)
    return first


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    gc.unfreeze()
    (gc.enable if was else gc.disable)()


def test_no_pass_inside_and_the_window_cycles_freed_on_exit(collector_on):
    passes = []
    gc.callbacks.append(lambda phase, info: passes.append(info["generation"]) if phase == "start" else None)
    try:
        with collector_paused():
            assert not gc.isenabled()
            cycle = _cycles(20_000)  # far over the 700 allocations that start a pass
            assert cycle() is not None and passes == []
        assert gc.isenabled() and cycle() is None  # the exit's pass freed them
        assert passes == [0]
    finally:
        gc.callbacks.pop()


def test_an_exception_restores_the_collector(collector_on):
    with pytest.raises(RuntimeError):
        with collector_paused():
            raise RuntimeError("window failed")
    assert gc.isenabled()


def test_a_collector_already_off_stays_off(collector_on):
    gc.disable()
    with collector_paused():
        cycle = _cycles(10)
    assert not gc.isenabled() and cycle() is not None  # nothing collected: its owner turned it off
    gc.collect()
    assert cycle() is None


def test_tracked_objects_stay_flat_over_windows(collector_on):
    freeze_setup()
    assert gc.get_freeze_count() > 0
    kept = []  # what a window keeps: its small result
    counts = []
    for k in range(30):
        with collector_paused():
            _cycles(5_000)
            kept.append(k)
        counts.append(len(gc.get_objects()))
    assert max(counts[10:]) <= counts[9] + 1_000  # no window's 10,000 objects are left behind
