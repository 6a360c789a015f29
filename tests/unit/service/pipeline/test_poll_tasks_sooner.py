"""The driver's Ray Data executor looks at finished packing calls every 0.01 s, not 0.1 s
(ray_pipeline.poll_tasks_sooner): a canary for the Ray version in use, and no change where the
constant it lowers is missing or already lower."""

from __future__ import annotations

import pytest

from packfeed.service.pipeline import ray_pipeline


@pytest.fixture
def state(monkeypatch):
    """Ray Data's module with its own default wait (0.1 s in Ray 2.60; a pipeline built earlier
    in this process has lowered it already), restored after the test."""
    from ray.data._internal.execution import streaming_executor_state as state

    assert isinstance(state.WAIT_FOR_TASK_COMPLETION_TIMEOUT_S, float), "this Ray names the constant otherwise"
    monkeypatch.setattr(state, "WAIT_FOR_TASK_COMPLETION_TIMEOUT_S", 0.1)
    return state


def test_the_installed_ray_data_waits_at_most_the_poll_interval(state):
    assert ray_pipeline.poll_tasks_sooner()
    assert state.WAIT_FOR_TASK_COMPLETION_TIMEOUT_S == ray_pipeline.RAY_DATA_TASK_POLL_S


def test_a_lower_wait_is_kept(state, monkeypatch):
    monkeypatch.setattr(state, "WAIT_FOR_TASK_COMPLETION_TIMEOUT_S", 0.001)
    assert ray_pipeline.poll_tasks_sooner()
    assert state.WAIT_FOR_TASK_COMPLETION_TIMEOUT_S == 0.001


def test_another_ray_without_the_constant_is_left_alone(state, monkeypatch):
    monkeypatch.delattr(state, "WAIT_FOR_TASK_COMPLETION_TIMEOUT_S")
    assert not ray_pipeline.poll_tasks_sooner()
    assert not hasattr(state, "WAIT_FOR_TASK_COMPLETION_TIMEOUT_S")
