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

Long samples (every sample long next to the gaps a row leaves; where bfd is 2-4% above the
bound and exactfit.py is for). Two are relative to the row length and need ``seq_len``:

==============  ==========================================================  =============
name            shape                                                       median/mean
==============  ==========================================================  =============
pareto300       long-context SFT: Pareto, x_min 300, alpha 2.5              397 / 500
docs            documents: lognormal, median 1100, sigma 0.7 (5-95%:        1100 / 1400
                ~350-3,500 tokens)
uniform_l8_l2   uniform integers on [L/8, L/2)                              5L/16
pareto_l10      Pareto, x_min L/10, alpha 2                                 0.14L / 0.2L
==============  ==========================================================  =============
"""

from __future__ import annotations

import numpy as np

_MAX_LENGTH = 1 << 20  # cap for the heavy tail; far beyond any seq_len


def _chat(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    return rng.lognormal(np.log(80), 0.8, n)


def _sft(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    return rng.lognormal(np.log(400), 1.0, n)


def _flan(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    mode = rng.choice(3, size=n, p=[0.5, 0.35, 0.15])
    medians = np.array([40.0, 350.0, 2500.0])[mode]
    sigmas = np.array([0.6, 0.8, 0.7])[mode]
    return medians * np.exp(sigmas * rng.standard_normal(n))


def _code(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    return 1 + 100 * rng.pareto(1.1, n)


def _code_min100(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    return 100 * (1 + rng.pareto(1.1, n))


def _pareto300(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    return 300 * (1 + rng.pareto(2.5, n))


def _docs(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    return rng.lognormal(np.log(1100), 0.7, n)


def _uniform_l8_l2(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    return rng.integers(max(1, seq_len // 8), max(2, seq_len // 2), n)


def _pareto_l10(rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
    return seq_len / 10 * (1 + rng.pareto(2.0, n))


RELATIVE = ("uniform_l8_l2", "pareto_l10")  # need seq_len

DISTRIBUTIONS = {
    "chat": _chat,
    "sft": _sft,
    "flan": _flan,
    "code": _code,
    "code_min100": _code_min100,
    "pareto300": _pareto300,
    "docs": _docs,
    "uniform_l8_l2": _uniform_l8_l2,
    "pareto_l10": _pareto_l10,
}


def synthetic_lengths(name: str, n: int, seed: int = 0, *, seq_len: int | None = None) -> np.ndarray:
    """``n`` sample lengths (int64, 1 .. 2**20) drawn from distribution ``name``; the
    ``RELATIVE`` ones are scaled to ``seq_len`` (required for them, ignored by the rest)."""
    try:
        draw = DISTRIBUTIONS[name]
    except KeyError:
        raise ValueError(f"unknown distribution {name!r}: use one of {', '.join(DISTRIBUTIONS)}") from None
    if name in RELATIVE and seq_len is None:
        raise ValueError(f"distribution {name!r} is relative to the row length: pass seq_len")
    values = draw(np.random.default_rng(seed), n, seq_len or 0)
    return np.clip(values, 1, _MAX_LENGTH).astype(np.int64)
