"""``pack``'s checks run in a thread while the embedded Ray starts (no Ray here: a stand-in
``init_ray``): the result, a check's error first, and no Ray left behind a refused command.
With the driver's head start Ray starts after the checks, only when the head start wants it."""

from __future__ import annotations

import threading
import time

import pytest

from packfeed.service.cluster import raycluster

from packfeed.service.packjob import ray_beside
from packfeed.service.pipeline.startup import StartupClock


@pytest.mark.parametrize("check_fails, ray_fails, expected", [
    pytest.param(False, False, "result", id="both-pass"),
    pytest.param(True, False, ValueError, id="a-refused-command-shuts-its-ray-down"),
    pytest.param(True, True, ValueError, id="the-check-error-before-rays"),
    pytest.param(False, True, ConnectionError, id="rays-error-when-the-checks-pass"),
])
def test_the_checks_run_beside_rays_start(monkeypatch, check_fails, ray_fails, expected):
    events, overlapped = [], threading.Event()
    monkeypatch.setattr(raycluster, "ray_initialised", lambda: False)
    monkeypatch.setattr(raycluster, "shutdown_ray", lambda: events.append("shutdown"))

    def fake_init(address, **_):
        overlapped.wait(5)  # returns only once the check has begun: they overlap
        time.sleep(0.05)
        if ray_fails:
            raise ConnectionError("no Ray")
        events.append("ray up")
        return "Ray: started"

    def check():
        overlapped.set()
        if check_fails:
            raise ValueError("source 'chat': row 0: bad")
        return "result"

    monkeypatch.setattr(raycluster, "init_ray", fake_init)
    clock = StartupClock()
    if expected == "result":
        result, ray, head = ray_beside.check_while_ray_starts(check, None, clock)
        assert result == "result" and head is None and ray.up >= ray.began and ray.seconds >= 0.05
        assert [name for name, _ in clock.marks] == ["ray_start"] and events == ["ray up"]
        return
    with pytest.raises(expected):
        ray_beside.check_while_ray_starts(check, None, clock)
    assert events == (["ray up", "shutdown"] if not ray_fails else [])


class StandInHead:
    """What ``then`` gives: ``run`` goes on in the checks' thread (here: until abandoned);
    ``wants_ray`` says ``wants``."""

    def __init__(self, checked, wants: bool = True) -> None:
        self.checked, self.abandoned, self.ran = checked, threading.Event(), threading.Event()
        self.wants, self.error = wants, None

    def wants_ray(self) -> bool:
        assert self.ran.wait(5)
        return self.wants

    def run(self) -> None:
        self.ran.set()
        self.abandoned.wait(5)

    def abandon(self) -> None:
        self.abandoned.set()


@pytest.mark.parametrize("ray_fails", [False, True], ids=["ray-up", "ray-fails"])
def test_the_head_start_goes_on_in_the_checks_thread_and_is_abandoned_when_ray_fails(monkeypatch, ray_fails):
    monkeypatch.setattr(raycluster, "ray_initialised", lambda: False)
    monkeypatch.setattr(raycluster, "shutdown_ray", lambda: None)
    heads, made = [], threading.Event()

    def fake_init(address, **_):
        assert made.wait(5) and heads[0].ran.wait(5), "the head start runs while Ray is starting"
        if ray_fails:
            raise ConnectionError("no Ray")
        return "Ray: started"

    def then(checked):
        heads.append(StandInHead(checked))
        made.set()
        return heads[0]

    monkeypatch.setattr(raycluster, "init_ray", fake_init)
    if ray_fails:
        with pytest.raises(ConnectionError):
            ray_beside.check_while_ray_starts(lambda: "result", None, StartupClock(), then)
        assert heads[0].abandoned.is_set(), "a failed start leaves no driver packing"
        return
    result, _, head = ray_beside.check_while_ray_starts(lambda: "result", None, StartupClock(), then)
    assert result == "result" and head is heads[0] and head.checked == "result"
    assert not head.abandoned.is_set(), "Ray up: the head start goes on (the run hands over to the pipeline)"
    head.abandon()


@pytest.mark.parametrize("wants", [False, True], ids=["the-driver-alone", "actors-help"])
def test_with_a_head_start_ray_starts_after_the_checks_only_if_wanted(monkeypatch, wants):
    monkeypatch.setattr(raycluster, "ray_initialised", lambda: False)
    events = []

    def fake_init(address, **_):
        events.append("ray start")
        return "Ray: started"

    def check():
        events.append("checked")
        return "result"

    monkeypatch.setattr(raycluster, "init_ray", fake_init)
    clock = StartupClock()
    result, ray, head = ray_beside.check_while_ray_starts(check, None, clock, lambda checked: StandInHead(checked, wants))
    assert result == "result" and head.checked == "result"
    if wants:
        assert events == ["checked", "ray start"] and ray.up is not None
        assert [name for name, _ in clock.marks] == ["ray_start"]
    else:
        assert events == ["checked"] and ray.up is None and ray.seconds == 0.0 and not clock.marks
    head.abandon()


def test_with_a_head_start_a_refused_command_starts_no_ray(monkeypatch):
    monkeypatch.setattr(raycluster, "ray_initialised", lambda: False)
    monkeypatch.setattr(raycluster, "init_ray", lambda address, **_: pytest.fail("no Ray for a refused command"))

    def check():
        raise ValueError("source 'chat': row 0: bad")

    with pytest.raises(ValueError, match="row 0: bad"):
        ray_beside.check_while_ray_starts(check, None, StartupClock(), StandInHead)
