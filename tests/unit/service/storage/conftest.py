"""A clock the retry loop reads and sleeps on without waiting: ``fake_time``."""

from __future__ import annotations

import random

import pytest

from packfeed.service.storage import retry


class FakeTime:
    """``now`` moves only when the retry loop sleeps or a request says it took time (``spend``)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    def spend(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_time(monkeypatch) -> FakeTime:
    """``retry.call`` on a fake clock, its jitter seeded: a test of minutes of backoff takes none."""
    fake = FakeTime()
    monkeypatch.setattr(retry, "_clock", fake.clock)
    monkeypatch.setattr(retry, "_sleep", fake.sleep)
    monkeypatch.setattr(retry, "_rng", random.Random(0))
    return fake
