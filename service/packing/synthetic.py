"""Synthetic sample-length distributions, for tests and the packing benchmark.

Each returns ``n`` token counts (int64, >= 1) from a seeded generator, so a test or a
benchmark row is reproducible from (name, n, seed). The shapes mimic common training data:

=========  =====================================================================  ===========
name       shape                                                                  median/mean
=========  =====================================================================  ===========
chat       short chat turns: lognormal, median 80 tokens                          80 / 110
sft        SFT prompt+answer: lognormal, median 400, wide (sigma 1)               400 / 660
flan       FLAN-like task mixture: 50% short (~40), 35% medium (~350),            ~130 / ~650
           15% long (~2500) lognormal modes
code       source files: heavy-tailed (Pareto/Lomax, alpha 1.1), from 1 token,    ~90 / ~1000
           tail past 100k tokens
=========  =====================================================================  ===========

``code_min100`` (every file >= 100 tokens, classic Pareto) is a stress case: with no short
items, best-fit decreasing cannot fill the last few slots of a row, see bfd.py.
"""

from __future__ import annotations

import numpy as np

_MAX_LENGTH = 1 << 20  # cap for the heavy tail; far beyond any seq_len


def _chat(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.lognormal(np.log(80), 0.8, n)


def _sft(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.lognormal(np.log(400), 1.0, n)


def _flan(rng: np.random.Generator, n: int) -> np.ndarray:
    mode = rng.choice(3, size=n, p=[0.5, 0.35, 0.15])
    medians = np.array([40.0, 350.0, 2500.0])[mode]
    sigmas = np.array([0.6, 0.8, 0.7])[mode]
    return medians * np.exp(sigmas * rng.standard_normal(n))


def _code(rng: np.random.Generator, n: int) -> np.ndarray:
    return 1 + 100 * rng.pareto(1.1, n)


def _code_min100(rng: np.random.Generator, n: int) -> np.ndarray:
    return 100 * (1 + rng.pareto(1.1, n))


DISTRIBUTIONS = {
    "chat": _chat,
    "sft": _sft,
    "flan": _flan,
    "code": _code,
    "code_min100": _code_min100,
}


def synthetic_lengths(name: str, n: int, seed: int = 0) -> np.ndarray:
    """``n`` sample lengths (int64, 1 .. 2**20) drawn from distribution ``name``."""
    try:
        draw = DISTRIBUTIONS[name]
    except KeyError:
        raise ValueError(f"unknown distribution {name!r}: use one of {', '.join(DISTRIBUTIONS)}") from None
    values = draw(np.random.default_rng(seed), n)
    return np.clip(values, 1, _MAX_LENGTH).astype(np.int64)
