"""``balance = "compute"``: the rows of a step given to ranks, and within a rank to its
micro-batch slots, so that every micro-batch's slowest rank is as close as it can be to the mean.

Why: rows are filled to the token, so every rank of a step gets the same tokens, but not the
same work: causal attention grows with the square of a document's length (client/cost.py).
Under FSDP2 and DDP every micro-batch waits for its slowest rank, so a step takes
sum over micro-batches g of max over ranks of the cost of rank n's rows of g.

The rule (``balanced_cells``), a deterministic function of the step's rows (their attention
work: client/cost.py ``attention_work``) and (N ranks, G = grad_accum slots, M rows a slot):

1. order the step's N*G*M rows by work, largest first, ties by position in the step;
2. slot g gets the g-th run of N*M rows of that order (rows of similar work share a micro-batch,
   which is what makes one balanceable), and within a slot, longest-processing-time first:
   each row, largest first, to the rank with the least work that holds fewer than M rows (ties:
   the lowest rank). With M > 1, more starts: the N*G cells filled at once (rows dealt forth
   and back; with G > 1 also by LPT), then the N cells of most work made slot 0, the next N
   slot 1...;
3. from each start, hill climbing on the step's time (sum over slots of the slowest rank's
   work): the best swap of a row of a slot's slowest cell with a lighter row of any other cell,
   while one lowers it by at least 0.01% of a mean cell (or, where two cells tie for a slot's
   slowest, spreads them); where no such swap is left, two rows for two within a slot;
4. the start that ends with the least step time (then the least worst slot; then the first).

Measured against the optimum (brute force over every assignment of up to 8 rows, thousands of
cases, tests/unit/service/delivery/test_balance.py): the step time within 3.4% of the least
possible; with one slot (or one row a slot) the slowest rank within 5% of the mean whenever
any assignment is.
With G > 1 the least step time can leave a slot of small rows uneven (rows 5254, 4642 | 396,
247, 82, 71, 40, 29 over 2 ranks x 2 slots x 2 rows: its best step has a slot at 1.29 x its
mean, while an assignment 0.8% slower has every slot within 4.4%): the step time is what a
rank waits for, so it wins.

Worked example, N=2, G=1, M=2, rows of work [9, 1, 8, 2] (positions 0..3): order 0 2 3 1;
LPT gives rank 0 rows 0 (9) then 1 (1) = 10, rank 1 rows 2 (8) then 3 (2) = 10. Each rank's
rows are returned in increasing position: rank 0 [0, 1], rank 1 [2, 3].

Cost: LPT O(R x N) for R = N*B rows; a swap round is O(G*M x R) in numpy, and the climb takes
tens of rounds at 64 ranks (bench/bench_balance.py times it). Answers are cached, so the ranks
of a step (the feeder's or the server's, in one process) compute it once.
"""

from __future__ import annotations

import functools

import numpy as np
from packfeed.service.delivery.assign import StepRows

BALANCE_MODES = ("off", "compute")


def check_balance(balance: str) -> str:
    """``balance`` when it is a known mode, else ValueError."""
    if balance not in BALANCE_MODES:
        raise ValueError(f"balance must be one of {', '.join(BALANCE_MODES)}, got {balance!r}")
    return balance


def balanced_cells(work: np.ndarray, world_size: int, grad_accum: int) -> np.ndarray:
    """int64 [N, G, M], read-only: positions (into ``work``, the step's R = N*G*M rows in stream
    order) of the rows of rank n's micro-batch g, increasing within each (rank, slot). See the
    module docstring for the rule. The last answers are kept: every rank of a step asks."""
    work = np.ascontiguousarray(work, dtype=np.float64)
    if world_size < 1 or grad_accum < 1 or len(work) % (world_size * grad_accum):
        raise ValueError(f"{len(work)} rows do not split into {world_size} ranks x {grad_accum} micro-batches")
    return _cells(work.tobytes(), world_size, grad_accum)


@functools.lru_cache(maxsize=64)
def _cells(work_bytes: bytes, n: int, g: int) -> np.ndarray:
    work = np.frombuffer(work_bytes, dtype=np.float64)
    m = len(work) // (n * g)
    order = np.lexsort((np.arange(len(work)), -work))  # largest first, ties by position
    by_slot = np.empty((n, g, m), dtype=np.int64)
    for slot in range(g):
        by_slot[:, slot, :] = _lpt(order[slot * n * m:(slot + 1) * n * m], work, n, m)
    candidates = [by_slot]
    if m > 1:  # also the N*G cells filled at once (dealt forth and back; LPT), then grouped in slots
        starts = [_snake(order, n * g, m)] + ([_lpt(order, work, n * g, m)] if g > 1 else [])
        candidates += [_grouped(cells, work, n, g) for cells in starts]
    if g > 1 or m > 1:
        for cells in candidates:
            _Swaps(cells, work).run()
    best = min(range(len(candidates)), key=lambda i: (_figures(candidates[i], work), i))
    cells = np.sort(candidates[best], axis=2)
    cells.flags.writeable = False
    return cells


def _snake(order: np.ndarray, cells: int, m: int) -> np.ndarray:
    """[cells, m]: the rows of ``order`` dealt to the cells forth then back (0 1 2 2 1 0 0 1 ..)."""
    rounds = order.reshape(m, cells).copy()
    rounds[1::2] = rounds[1::2, ::-1]
    return rounds.T.copy()


def _grouped(cells: np.ndarray, work: np.ndarray, n: int, g: int) -> np.ndarray:
    """[n, g, m]: N*G cells [N*G, m] put in slots, the N of most work in slot 0, and so on."""
    loads = work[cells].sum(axis=1)
    ranked = cells[np.lexsort((np.arange(n * g), -loads))]
    return np.ascontiguousarray(ranked.reshape(g, n, -1).transpose(1, 0, 2))


def _figures(cells: np.ndarray, work: np.ndarray) -> tuple[float, float]:
    """(sum over slots of the slowest rank's work, the worst slot's slowest over its mean)."""
    loads = work[cells].sum(axis=2)  # [N, G]
    means = np.maximum(loads.mean(axis=0), 1e-300)
    return float(loads.max(axis=0).sum()), float((loads.max(axis=0) / means).max())


def _lpt(members: np.ndarray, work: np.ndarray, n: int, m: int) -> np.ndarray:
    """[n, m]: ``members`` (positions, largest work first) over n ranks of m rows each: each
    row to the least loaded rank with room, ties to the lowest rank."""
    loads = np.zeros(n)
    held: list[list[int]] = [[] for _ in range(n)]
    for p in members:
        r = min((k for k in range(n) if len(held[k]) < m), key=lambda k: (loads[k], k))
        held[r].append(int(p))
        loads[r] += work[p]
    return np.array(held, dtype=np.int64).reshape(n, m)


class _Swaps:
    """Hill climbing on (sum over slots of the slowest rank's work, sum of squared cell loads):
    each round, the best swap of a row of a slot's slowest cell with a lighter row of any other
    cell (same slot or not), while one lowers the first figure by ``gain`` (0.01% of a mean
    cell: smaller gains are not worth the rounds), or, where two cells tie for a slot's slowest,
    keeps it and lowers the second (spreading the tie so a later swap can lower the first).
    ``cells`` [N, G, M] is changed in place. Each accepted swap lowers the pair of figures, so
    it ends; ``max_rounds`` bounds it anyway."""

    def __init__(self, cells: np.ndarray, work: np.ndarray) -> None:
        self.cells, self.work = cells, work
        self.n, self.g, self.m = cells.shape
        self.eps = 1e-9 * max(float(work.sum()), 1.0)
        self.gain = 1e-4 * max(float(work.sum()) / (self.n * self.g), 1.0)  # the least worth a swap

    def run(self, max_rounds: int | None = None) -> None:
        for _ in range(max_rounds or 4 * self.cells.size):
            best = self._best_swap()
            if best is not None:
                a, b = best[2], best[3]  # (rank, slot, index in the cell)
                self.cells[a], self.cells[b] = self.cells[b], self.cells[a]
            elif not self._pair_swap():
                return

    def _pair_swap(self) -> bool:
        """Where no single swap helps: the best swap of two rows of a slot's slowest cell with
        two of another cell of the slot, if it lowers the slot's slowest by ``gain``. True when
        one was made. (Rows 1352 705 238 92 against 791 720 285 256, 2387 against 2052: no single
        swap lowers 2387; the pair 1352 238 for 791 720 does: 2308 against 2131, the optimum.)"""
        if self.m < 3 or self.n < 2:
            return False
        w, cells = self.work, self.cells
        pairs = np.array([(i, j) for i in range(self.m) for j in range(i + 1, self.m)])
        for ga in range(self.g):
            loads = w[cells[:, ga, :]].sum(axis=1)  # [N]
            ra = int(np.argmax(loads))
            sums = w[cells[:, ga, pairs[:, 0]]] + w[cells[:, ga, pairs[:, 1]]]  # [N, P]
            d = sums[ra][:, None, None] - sums[None, :, :]  # [P (of ra), N, P]
            ranked = np.argsort(-loads, kind="stable")  # ranked[0] == ra
            v = np.concatenate([loads[ranked], [-np.inf, -np.inf]])
            others = np.where(np.arange(self.n) == ranked[1], v[2], v[1])  # the largest but ra's and k's
            new = np.maximum(loads[ra] - d, loads[None, :, None] + d)
            worst = np.maximum(new, others[None, :, None])
            worst[:, ra, :] = np.inf
            i, rb, j = np.unravel_index(int(np.argmin(worst)), worst.shape)
            if worst[i, rb, j] < loads[ra] - self.gain:
                (a1, a2), (b1, b2) = pairs[i], pairs[j]
                top, other = cells[ra, ga, [a1, a2]].copy(), cells[rb, ga, [b1, b2]].copy()
                cells[ra, ga, [a1, a2]], cells[rb, ga, [b1, b2]] = other, top
                return True
        return False

    def _best_swap(self) -> tuple | None:
        """(figure change, squares change, the top cell's row, the other row) of the best swap,
        rows as (rank, slot, index in the cell); None when none helps. Ties: the lowest slot,
        then positions. Every candidate (a row of a slot's slowest cell, any other row) at once."""
        w, cells, g, m = self.work, self.cells, self.g, self.m
        loads = w[cells].sum(axis=2)  # [N, G]
        flat = cells.reshape(-1)
        rank_of = np.repeat(np.arange(self.n), g * m)
        slot_of = np.tile(np.repeat(np.arange(g), m), self.n)
        ranked = np.argsort(-loads, axis=0, kind="stable")  # per slot, slowest rank first
        padded = np.vstack([loads[ranked, np.arange(g)], np.full((2, g), -np.inf)])
        a1, a2 = ranked[0], ranked[1] if self.n > 1 else np.full(g, -1)
        v1, v2, v3 = padded[0], padded[1], padded[2]
        ga = np.repeat(np.arange(g), m)  # the candidates: row ia of slot ga's slowest cell
        ra = a1[ga]
        top = v1[ga][:, None]
        d = w[cells[ra, ga, np.tile(np.arange(m), g)]][:, None] - w[flat][None, :]  # [G*M, R]
        other = loads[rank_of, slot_of][None, :]
        same = slot_of[None, :] == ga[:, None]
        # the slot's largest without its slowest and b's cell (same slot), or without b's cell
        without_both = np.where(rank_of[None, :] == a2[ga][:, None], v3[ga][:, None], v2[ga][:, None])
        without_b = np.where(rank_of == a1[slot_of], v2[slot_of], v1[slot_of])[None, :]
        change = np.where(same, np.maximum(np.maximum(top - d, other + d), without_both) - top,
                          np.maximum(top - d, v2[ga][:, None]) - top
                          + np.maximum(without_b, other + d) - v1[slot_of][None, :])
        squares = 2 * d * (d - (top - other))
        tied = (v2 >= v1 - self.eps)[ga][:, None]  # lower one of the slowest, then the other
        ok = (d > 0) & ~(same & (rank_of[None, :] == ra[:, None]))
        ok &= (change < -self.gain) | (tied & same & (np.abs(change) <= self.eps) & (squares < -self.eps))
        if not ok.any():
            return None
        idx = np.flatnonzero(ok)
        j = int(idx[np.lexsort((idx, squares.ravel()[idx], change.ravel()[idx]))[0]])
        k, b = divmod(j, len(flat))
        return (change.ravel()[j], squares.ravel()[j], (int(ra[k]), int(ga[k]), k % m),
                (int(rank_of[b]), int(slot_of[b]), b % m))


def balanced_step(whole: StepRows, work: np.ndarray, *, rank: int, world_size: int, grad_accum: int,
                  seq_len: int) -> StepRows:
    """Rank ``rank``'s rows of a step with balance "compute". ``whole``: the step's rows as one
    batch (``step_rows(0, 1, N*B, cursor, step, total)``: real rows then padding); ``work``: the
    real rows' ``attention_work``. A padding row is one segment of ``seq_len``: work L ** 2.
    The batch is rank's micro-batch 0 (M rows, increasing index), then 1, ...; real rows are
    those below the step's end, the rest padding, so the step's set of rows is "off"'s."""
    work = np.concatenate([np.asarray(work, dtype=np.float64), np.full(whole.num_padding, float(seq_len) ** 2)])
    cells = balanced_cells(work, world_size, grad_accum)
    order = tuple(int(i) for i in whole.indices[cells[rank].reshape(-1)])
    real = tuple(i for i in order if i < whole.rows.stop)
    return StepRows(step=whole.step, rows=real, num_padding=len(order) - len(real), cursor=whole.cursor, order=order)
