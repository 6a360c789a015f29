"""The training loop's mixture hook (trainer/mixture_hook.py): how ``[train] mixture_hook`` is
named, loaded and refused, what a hook sees of its step's sources, and that its weights become
the feeder's change of that step (one per step whichever rank asks, rank 0 says it)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from packfeed.trainer.config import TrainConfig
from packfeed.trainer.mixture_hook import MixtureStep, call_hook, load_hook


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
    """The part of a rank's runtime (trainer/runtime.py) a hook's weights reach."""

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
    with caplog.at_level("WARNING", logger="packfeed.trainer.mixture_hook"):
        assert call_hook(hooks_module.pause_web, feeder, step(2)) is None
    assert "step 2: the mixture hook's weights were not applied: every window" in caplog.text
