"""The training loop's mixture hook (trainer/loop/mixture_hook.py): how ``[train] mixture_hook`` is
named, loaded and refused, what a hook sees of its step's sources, and that its weights become
the feeder's change of that step (one per step whichever rank asks, rank 0 says it)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from packfeed.trainer.run_config import TrainConfig
from packfeed.trainer.loop.mixture_hook import MixtureStep, call_hook, load_hook


@pytest.fixture
def hooks_module(monkeypatch):
    module = types.ModuleType("my_hooks")
    module.pause_web = lambda info: {"web": 0.0, "code": 1.0} if info.step % 2 == 0 else None
    module.not_a_function = 3
    monkeypatch.setitem(sys.modules, "my_hooks", module)
    return module


@pytest.mark.parametrize("spec,match", [
    ("my_hooks", "must be 'module:function'"),
    (":pause_web", "must be 'module:function'"),
    ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
    ("my_hooks:missing", "has no function 'missing'"),
    ("my_hooks:not_a_function", "has no function 'not_a_function'"),
])
def test_a_hook_that_names_no_function_is_refused_saying_why(hooks_module, spec, match):
    with pytest.raises(ValueError, match=match):
        load_hook(spec)


def test_the_config_takes_module_colon_function_or_nothing(hooks_module):
    assert load_hook(None) is None and load_hook("my_hooks:pause_web") is hooks_module.pause_web
    assert TrainConfig(mixture_hook="my_hooks:pause_web").mixture_hook == "my_hooks:pause_web"
    for bad in ("my_hooks", 3):
        with pytest.raises(ValueError, match="mixture_hook must be 'module:function'"):
            TrainConfig(mixture_hook=bad)


def step(n: int, rank: int = 0) -> MixtureStep:
    return MixtureStep(step=n, rank=rank, world_size=2, loss=1.0, rows=[], inputs=[], model=None,
                       sources=("web", "code"), first_ids=(0, 60))


def test_the_hook_sees_each_segment_source():
    got = step(1).source_of(np.array([0, 59, 60, 119, -1]))
    assert got.tolist() == [0, 0, 1, 1, -1]


class Runtime:
    """The part of a rank's runtime (trainer/launch/ray_runtime.py) a hook's weights reach."""

    def __init__(self) -> None:
        self.asked = []

    def set_mixture(self, n: int, weights: dict):
        self.asked.append((n, weights))
        return {"step": n, "from_sample": 60, "window": 6, "weights": weights, "schedule_index": 0}


def test_weights_ask_the_feeder_for_the_steps_change_and_none_asks_nothing(hooks_module):
    feeder = Runtime()
    assert call_hook(hooks_module.pause_web, feeder, step(1)) is None and feeder.asked == []
    for rank in (0, 1):
        assert call_hook(hooks_module.pause_web, feeder, step(2, rank))["from_sample"] == 60
    assert feeder.asked == [(2, {"web": 0.0, "code": 1.0})] * 2, "every rank asks; the feeder makes one change"


def test_weights_that_come_too_late_are_not_applied_and_the_run_goes_on(hooks_module, caplog):
    from packfeed.service.delivery.mixture_changes import MixtureRefused

    def planned_to_the_end(n, weights):
        raise MixtureRefused("every window of the stream is planned already")

    feeder = types.SimpleNamespace(set_mixture=planned_to_the_end)
    with caplog.at_level("WARNING", logger="packfeed.trainer.loop.mixture_hook"):
        assert call_hook(hooks_module.pause_web, feeder, step(2)) is None
    assert "step 2: the mixture hook's weights were not applied: every window" in caplog.text


def _ray_refusal(monkeypatch):
    """A RayRuntime whose feeder refuses as a Ray actor does: ``ray.get`` raises Ray's wrapper
    of the actor's MixtureRefused, the actor's traceback in its message."""
    import ray
    from ray.exceptions import RayTaskError

    from packfeed.service.delivery.mixture_changes import MixtureRefused
    from packfeed.trainer.launch.ray_runtime import RayRuntime

    cause = MixtureRefused("every window of the stream is planned already")
    wrapped = RayTaskError("RowFeeder.set_mixture", "Traceback (most recent call last):\n  File ...\n" * 20,
                           cause).as_instanceof_cause()

    def get(_):
        raise wrapped

    monkeypatch.setattr(ray, "get", get)
    runtime = object.__new__(RayRuntime)
    runtime._feeder = types.SimpleNamespace(set_mixture=types.SimpleNamespace(remote=lambda *a: None))
    return runtime


def _server_refusal():
    """A torchrun rank reading ``packfeed serve``: the server answers FAILED_PRECONDITION."""
    import grpc

    from packfeed.client.stream import StreamError
    from packfeed.trainer.launch.torchrun import ServerRows

    def refuse(weights, step):
        raise StreamError(grpc.StatusCode.FAILED_PRECONDITION, "every window of the stream is planned already")

    rows = object.__new__(ServerRows)
    rows.stream = types.SimpleNamespace(set_mixture=refuse)
    return rows


@pytest.mark.parametrize("runtime", ["ray", "server"])
def test_a_refusal_through_either_runtime_is_the_one_line_warning(hooks_module, caplog, monkeypatch, runtime):
    """Under Ray the refusal came back as Ray's wrapper with the actor's traceback in its
    message (a screenful where the README promises one line); under torchrun + serve as a
    StreamError the hook did not catch (the run died). Both are the warning, one line."""
    source = _ray_refusal(monkeypatch) if runtime == "ray" else _server_refusal()
    with caplog.at_level("WARNING", logger="packfeed.trainer.loop.mixture_hook"):
        assert call_hook(hooks_module.pause_web, source, step(2)) is None
    (record,) = [r for r in caplog.records if "not applied" in r.getMessage()]
    assert record.getMessage() == ("step 2: the mixture hook's weights were not applied: every window of the stream "
                                   "is planned already")
