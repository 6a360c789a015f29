"""Packing strategies by name: ``STRATEGIES["bfd"]``, ``get_strategy("concat")``.

A strategy is a pure function ``(piece lengths int64, seq_len) -> Layout``. It also says
whether it cuts pieces at row ends itself (concat does), in which case the ``split``
overlong policy hands it whole samples instead of pre-cut pieces, and it takes the mask of
pieces it must not cut (preference pairs). Adding a strategy is one
module and one line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .bfd import pack_bfd
from .concat import pack_concat
from .exactfit import pack_exactfit
from .types import Layout


@dataclass(frozen=True)
class Strategy:
    """A named packing function; calling it runs ``place``."""

    name: str
    place: Callable[..., Layout]
    cuts_at_row_ends: bool
    summary: str

    def __call__(self, lengths: np.ndarray, seq_len: int, whole: np.ndarray | None = None) -> Layout:
        """``whole``: bool [n], pieces never to cut; only a strategy that cuts needs to know."""
        if self.cuts_at_row_ends:
            return self.place(lengths, seq_len, whole)
        return self.place(lengths, seq_len)


STRATEGIES: dict[str, Strategy] = {
    "bfd": Strategy(
        "bfd", pack_bfd, False, "whole samples, best-fit decreasing (SFT); never splits a sample"
    ),
    "exactfit": Strategy(
        "exactfit", pack_exactfit, False,
        "whole samples, rows closed exactly where the lengths allow (default); never more rows than bfd",
    ),
    "concat": Strategy(
        "concat", pack_concat, True, "concatenate and cut at row ends (pretraining); full rows"
    ),
}


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"unknown packing strategy {name!r}: use one of {', '.join(sorted(STRATEGIES))}"
        ) from None
