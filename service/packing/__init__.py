"""Packing algorithms: pure functions of sample lengths (numpy, the standard library and the
numpy-only row convention of ``packfeed.client``: rows.py, offsets.py).

    pack(lengths, seq_len, strategy="exactfit", overlong="truncate") -> Packing   # where tokens go
    assemble_rows(packing, tokens, labels, ...) -> packfeed.client.rows.PackedRows
    check_packing(packing, lengths, seq_len, ...)   # raises unless the packing is correct

Modules: api (pack), types (Packing), overlong (policies), pairs (overlong preference pairs
truncated before packing), registry (STRATEGIES), exactfit, bfd and concat (one strategy each),
bounds (lower bounds on rows), assemble (rows), check (invariants), synthetic (length
distributions for tests and the benchmark). Index runs and
offsets come from ``packfeed.client.offsets`` (``concat_ranges``, ``offsets_of``).

The Ray Data stage, the CLI and the benchmark call these; they hold no packing logic.
"""

from .api import pack
from .assemble import assemble_rows
from .check import check_packing
from .overlong import OVERLONG_POLICIES
from .registry import STRATEGIES, Strategy, get_strategy
from .types import Layout, Packing

__all__ = [
    "OVERLONG_POLICIES",
    "STRATEGIES",
    "Layout",
    "Packing",
    "Strategy",
    "assemble_rows",
    "check_packing",
    "get_strategy",
    "pack",
]
