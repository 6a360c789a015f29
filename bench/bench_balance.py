"""Step balance of ``balance = "off"`` and ``"compute"`` on a long-tailed document corpus.

Run from the repository root::

    .venv/bin/python bench/bench_balance.py            # 40 steps per layout, ~1-2 minutes
    .venv/bin/python bench/bench_balance.py --quick    # 10 steps per layout

The corpus: document lengths from a lognormal (median 2,000 tokens, sigma 1.2) clipped to
[200, L]: a few hundred tokens to a whole row, as long-context SFT data. Packed by packfeed's
own packer (``pack``, exactfit, the default) in windows of 8,192 documents, rows in the order
the packer emits them, as the pipeline streams them. For each seq_len (32,768 and 65,536),
world size N (8, 64), micro-batch rows M (1, 2) and grad_accum G (1, 4), the stream's first
steps of N x M x G rows are given out by each rule (service/delivery/assign.py "off": rank k
the rows k mod N; service/delivery/balance.py "compute"), and each step's balance is computed
with the cost model (client/cost.py: L + ratio x sum of squared segment lengths, padding tail
included; ratio of a 7B model, Qwen2.5-7B's 1.32e-5): the step's time (sum over micro-batches
of the slowest rank) over the ideal (the sum of the means). 1.00 is perfect; 1.25 means the
step takes 25% longer than with perfectly even ranks.

Columns: mean and worst step balance with off and with compute; the step time the cost model
implies with compute, relative to off's (mean over steps); the mean time of one assignment
(``balanced_cells``, computed once per step and shared by the ranks).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from packfeed.client.cost import DEFAULT_RATIO, balance_of
from packfeed.service.delivery.balance import balanced_cells
from packfeed.service.packing import pack

SEQ_LENS = (32_768, 65_536)
WORLDS = (8, 64)
MICRO_ROWS = (1, 2)
GRAD_ACCUMS = (1, 4)
WINDOW = 8_192


def corpus_rows(seq_len: int, rows_needed: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(attention work [R], cost [R]) of the first ``rows_needed`` packed rows of the corpus."""
    rng = np.random.default_rng(seed)
    work: list[np.ndarray] = []
    total = 0
    while total < rows_needed:
        lengths = np.clip(rng.lognormal(np.log(2000), 1.2, size=WINDOW), 200, seq_len).astype(np.int64)
        packing = pack(lengths, seq_len)
        seg = packing.segment_len.astype(np.float64)
        splits = packing.row_splits
        sums = np.concatenate([[0.0], np.cumsum(seg ** 2)])
        tokens = np.concatenate([[0.0], np.cumsum(seg)])
        real = tokens[splits[1:]] - tokens[splits[:-1]]
        pad = seq_len - real  # the padding tail: a segment of its own
        work.append(sums[splits[1:]] - sums[splits[:-1]] + pad ** 2)
        total += packing.num_rows
    w = np.concatenate(work)[:rows_needed]
    return w, seq_len + DEFAULT_RATIO * w


def off_cells(n: int, g: int, m: int) -> np.ndarray:
    """[N, G, M]: rank k's micro-batch g under "off": rows (g*M + i)*N + k of the step."""
    k, gg, i = np.meshgrid(np.arange(n), np.arange(g), np.arange(m), indexing="ij")
    return (gg * m + i) * n + k


def layout_figures(work: np.ndarray, cost: np.ndarray, n: int, g: int, m: int, steps: int) -> dict:
    per_step = n * g * m
    off, on, times, ratio = [], [], [], []
    cells_off = off_cells(n, g, m)
    for s in range(steps):
        w, c = work[s * per_step:(s + 1) * per_step], cost[s * per_step:(s + 1) * per_step]
        start = time.perf_counter()
        cells = balanced_cells(w, n, g)
        times.append(time.perf_counter() - start)
        b_off, b_on = balance_of(c[cells_off].sum(axis=2)), balance_of(c[cells].sum(axis=2))
        off.append(b_off)
        on.append(b_on)
        ratio.append(b_on / b_off)  # the same ideal: the step's time with compute over off's
    return {"off_mean": np.mean(off), "off_worst": np.max(off), "on_mean": np.mean(on), "on_worst": np.max(on),
            "time": np.mean(ratio), "ms": 1000 * np.mean(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per layout")
    parser.add_argument("--quick", action="store_true", help="10 steps per layout")
    args = parser.parse_args()
    steps = 10 if args.quick else args.steps
    print(f"cost ratio {DEFAULT_RATIO:.3g} (Qwen2.5-7B); {steps} steps per layout; balance = step time / ideal")
    print("| seq_len | ranks | M | G | off mean | off worst | compute mean | compute worst | step time vs off "
          "| assign ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for seq_len in SEQ_LENS:
        need = steps * max(WORLDS) * max(MICRO_ROWS) * max(GRAD_ACCUMS)
        work, cost = corpus_rows(seq_len, need)
        for n in WORLDS:
            for m in MICRO_ROWS:
                for g in GRAD_ACCUMS:
                    f = layout_figures(work, cost, n, g, m, steps)
                    print(f"| {seq_len:,} | {n} | {m} | {g} | {f['off_mean']:.3f} | {f['off_worst']:.3f} | "
                          f"{f['on_mean']:.3f} | {f['on_worst']:.3f} | {f['time']:.3f} | {f['ms']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
