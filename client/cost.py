"""What one packed row costs to train on, and how balanced a step's ranks are: the cost model,
written once (the server's and the feeder's ``balance = "compute"``, the trainer's ``balance``
figure, bench/bench_balance.py).

A row of L tokens holding segments of lengths n_1..n_k (padding tail included, sum = L) costs

    cost = a * L + b * sum_i n_i ** 2        in units of a: L + ratio * sum_i n_i ** 2

* a, per token: the dense layers (projections, MLP, head), forward and backward, ~6 x the
  parameter count of FLOPs. They run over every one of the row's L positions, padding too: the
  row is a dense [L] tensor.
* b, per pair of tokens of one segment: causal attention lets token t of a segment see its t
  earlier tokens, n ** 2 / 2 pairs per segment of n tokens; QK^T and AV are 4 x hidden FLOPs
  per pair per layer forward, 12 x with the backward: 12 x layers x hidden x n ** 2 / 2 =
  6 x layers x hidden x n ** 2. So ratio = b / a = layers x hidden / params
  (``attention_ratio``).
* The padding tail is a segment of its own (cu_seqlens gives the varlen kernels a boundary at
  its start): its p tokens cost a * p + b * p ** 2 like a document of p tokens. An all-padding
  row (the last step's filler) is one segment of L: the most expensive row there is, unless the
  trainer skips it.

Worked example, Qwen2.5-7B (28 layers, hidden 3,584, 7.6e9 parameters): ratio = 28 x 3,584 /
7.6e9 = 1.32e-5. A 65,536-token row holding one document costs 65,536 + 1.32e-5 x 65,536 ** 2
= 122,248; the same tokens as 16 documents of 4,096 cost 65,536 + 16 x 1.32e-5 x 4,096 ** 2 =
69,080: 1.77 x less. At 8,192 tokens, one document against two of 4,096: 1.05 x. Balance
matters at long context.

Imports numpy and client/rows.py only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from packfeed.client.rows import PackedRows


def attention_ratio(num_layers: int, hidden: int, num_params: float) -> float:
    """b / a: causal attention's cost per pair of tokens of one segment over the dense layers'
    cost per token (module docstring): num_layers x hidden / num_params.
    For Qwen2.5-7B, ``attention_ratio(28, 3584, 7.6e9)`` = 1.32e-5."""
    if num_layers < 1 or hidden < 1 or not num_params > 0:
        raise ValueError(f"a model shape needs num_layers >= 1, hidden >= 1 and num_params > 0, got "
                         f"({num_layers}, {hidden}, {num_params})")
    return num_layers * hidden / float(num_params)


DEFAULT_RATIO = attention_ratio(28, 3584, 7.6e9)  # a 7B model (Qwen2.5-7B): ~1.32e-5


def attention_work(rows: PackedRows) -> np.ndarray:
    """float64 [B]: sum over each row's segments (the padding tail one of them) of length ** 2.
    For seq_lens [3, 1] and [4]: [10, 16]."""
    squares = rows.seq_lens.astype(np.float64) ** 2
    sums = np.concatenate([[0.0], np.cumsum(squares)])
    return sums[rows.segment_splits[1:]] - sums[rows.segment_splits[:-1]]


def row_costs(rows: PackedRows, ratio: float = DEFAULT_RATIO) -> np.ndarray:
    """float64 [B]: each row's cost in units of one token of the dense layers,
    L + ratio x sum of squared segment lengths. Rows [3, 1] and [4], ratio 0.5: [9, 12]."""
    return rows.seq_len + ratio * attention_work(rows)


def balance_of(costs: np.ndarray | Sequence[Sequence[float]]) -> float:
    """How long a step runs over how long it would with perfectly balanced ranks: costs
    [N ranks, G micro-batches]; every micro-batch waits for its slowest rank, so the step takes
    sum over micro-batches of the max over ranks, against sum of the means. 1.0 is perfect.
    [[4, 1], [2, 1]] (2 ranks, 2 micro-batches): (4 + 1) / (3 + 1) = 1.25."""
    c = np.asarray(costs, dtype=np.float64)
    if c.ndim == 1:
        c = c[:, None]
    ideal = c.mean(axis=0).sum()
    return float(c.max(axis=0).sum() / ideal) if ideal > 0 else 1.0


def step_balance(rows_per_rank: Sequence[Sequence[PackedRows]], ratio: float = DEFAULT_RATIO) -> float:
    """``balance_of`` a step given each rank's micro-batches (rows_per_rank[n][g]: rank n's
    micro-batch g), by ``row_costs``. A trainer whose ranks each hold only their own rows
    all-gathers ``micro_batch_cost`` of each micro-batch and calls ``balance_of``."""
    return balance_of([[micro_batch_cost(m, ratio) for m in rank] for rank in rows_per_rank])


def micro_batch_cost(rows: PackedRows, ratio: float = DEFAULT_RATIO) -> float:
    """Cost of one micro-batch: the sum of its rows' ``row_costs``."""
    return float(row_costs(rows, ratio).sum())
