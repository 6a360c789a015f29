"""Helpers for the tests of inputs/: the windows of a few input files, planned the simple way."""

from __future__ import annotations

import os
from typing import Sequence

from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.inputs.read import WindowSpec


def plan_windows(inputs: Sequence[str] | str, *, window_samples: int, format: str = "auto") -> list[WindowSpec]:
    """The windows of ``inputs`` read in file order: one source, no shuffle, one epoch (runs
    plan mixtures with ``build_plan`` from their whole config)."""
    paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    config = DataConfig.from_inputs(paths, tokenizer="-", seq_len=2, window_samples=window_samples, block_samples=0,
                                    format=format)
    plan = build_plan(config)
    return [plan.window(k) for k in range(plan.num_windows)]
