"""The gradient norm of every step (before clipping) reaches the interval's record and the
progress line: the mean over the interval's steps that trained a token."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packfeed.trainer.loop.interval import MetricsWindow, progress_line


def close(window: MetricsWindow) -> dict:
    return window.close(step=window.steps, lr=1e-3, world_totals=(10, 16), flops_per_token=1.0,
                        peak_flops_total=None)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(0.0, 1e4), st.just(float("nan"))), min_size=1, max_size=12))
def test_the_record_holds_the_mean_norm_of_the_steps_that_trained(norms):
    window = MetricsWindow()
    for norm in norms:
        window.add(loss=1.0, real_tokens=10, slots=16, data_wait=0.0, grad_norm=norm)
    record = close(window)
    finite = [n for n in norms if math.isfinite(n)]
    if not finite:  # no step trained a token: no norm, and the line says none
        assert record["grad_norm"] is None and "grad norm" not in progress_line(record, 10)
        return
    assert record["grad_norm"] == pytest.approx(sum(finite) / len(finite))
    assert f"grad norm {record['grad_norm']:.3g}" in progress_line(record, 10)


def test_a_window_without_norms_says_none():
    window = MetricsWindow()
    window.add(loss=1.0, real_tokens=10, slots=16, data_wait=0.0)
    assert close(window)["grad_norm"] is None
