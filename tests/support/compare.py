"""The comparisons the tests share: two sets of tensors by relative error (gradients, weights),
and two training runs by what they trained (losses, the rows of every step and rank, the final
weights), read from their output directories.

A run's directory holds ``metrics.jsonl`` (a record per logged step), ``rows/rank<k>.jsonl``
(``[train] record_rows``: each rank's rows and loss of every step) and ``final/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from packfeed.trainer.loop.interval import read_jsonl


def relative_errors(a: dict, b: dict, *, noise_floor: float = 0.0) -> dict[str, float]:
    """name -> |a - b| / |b| (Frobenius norms) over the same names, |b| floored at ``noise_floor``
    times the largest |b| (and at 1e-12): a tensor that is rounding noise around a true 0 has no
    relative precision (a key projection's bias: softmax ignores a shift shared by all keys)."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    floor = max(noise_floor * max((float(t.norm()) for t in b.values()), default=0.0), 1e-12)
    return {n: float((a[n] - b[n]).norm()) / max(float(b[n].norm()), floor) for n in b}


def relative_error(a: dict, b: dict, *, noise_floor: float = 0.0) -> float:
    """The largest of ``relative_errors``: ``a`` measured against ``b``."""
    return max(relative_errors(a, b, noise_floor=noise_floor).values())


def losses(output: Path) -> dict[int, float]:
    """step -> the loss logged for it (metrics.jsonl)."""
    return {r["step"]: r["loss"] for r in read_jsonl(output / "metrics.jsonl")}


def rank_steps(output: Path) -> dict[tuple[int, int], tuple[list[int], float]]:
    """(step, rank) -> (global row indices, loss) from rows/; a step trained twice (before and
    after a restart) must have trained the same rows to the same loss both times."""
    seen: dict[tuple[int, int], tuple[list[int], float]] = {}
    for path in sorted((output / "rows").glob("rank*.jsonl")):
        for rec in read_jsonl(path):
            key, value = (rec["step"], rec["rank"]), (rec["row_index"], rec["loss"])
            if key in seen:
                assert seen[key][0] == value[0] and seen[key][1] == pytest.approx(value[1], rel=1e-5), key
            seen[key] = value
    return seen


def trained_rows(output: Path) -> dict[tuple[int, int], list[int]]:
    """(step, rank) -> the global row indices it trained (rows/)."""
    return {key: rows for key, (rows, _) in rank_steps(output).items()}


def final_weights(output: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(output / "final" / "model.safetensors"))


def assert_same_training(a: Path, b: Path, *, steps: int, rel: float, ranks: int | None = None,
                         rows: bool = False, weights: bool = False) -> None:
    """Run ``b`` trained what run ``a`` trained, steps 1 to ``steps`` each once:

    * the loss of every step to ``rel``: the logged one (metrics.jsonl, a record every step), or,
      with ``ranks``, each rank's own (rows/) for exactly that many ranks a step;
    * with ``rows`` (implied by ``ranks``): the same global rows for every (step, rank) (rows/);
    * with ``weights``: the same final weights, each tensor to ``rel`` of ``a``'s.
    """
    if ranks is None:
        la, lb = losses(a), losses(b)
        keys: list = list(range(1, steps + 1))
    else:
        la, lb = ({key: loss for key, (_, loss) in rank_steps(run).items()} for run in (a, b))
        keys = [(s, r) for s in range(1, steps + 1) for r in range(ranks)]
    assert sorted(la) == sorted(lb) == keys
    for key in la:
        assert lb[key] == pytest.approx(la[key], rel=rel), f"step {key}: another loss"
    if rows or ranks is not None:
        ra, rb = trained_rows(a), trained_rows(b)
        assert ra.keys() == rb.keys()
        for key in ra:
            assert ra[key] == rb[key], f"step/rank {key} trained on other rows"
    if weights:
        errors = relative_errors(final_weights(b), final_weights(a))
        assert max(errors.values()) < rel, {n: e for n, e in errors.items() if e >= rel}
