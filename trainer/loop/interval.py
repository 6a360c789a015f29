"""Training metrics: interval aggregation, progress line, metrics.jsonl, loss curve, summary
(``summarize``, and ``format_summary``, the lines the driver prints at the end).

``MetricsWindow`` accumulates per-step figures on every rank; ``close(...)`` turns an interval
into one record (rank 0 writes it). Figures, each over the interval since the last record:

- ``loss``: mean of the steps' losses (each a token mean over its whole step, all ranks);
- ``lr``: the learning rate of the interval's last step;
- ``tokens_per_s``: real tokens (padding excluded) of all ranks per second of wall time;
- ``fill``: real tokens / (rows * seq_len) of all ranks;
- ``data_wait``: fraction of rank 0's wall time spent waiting for rows;
- ``memory``: ``{"ranks": [...]}``, per rank ``peak_bytes`` (CUDA's max allocated since the
  model was built; on CPU the process's peak RSS) and the bytes it holds of the parameters,
  gradients and optimizer states (a shard of each under fsdp), at the interval's end;
- ``mfu``: model FLOPs utilisation on GPU (6N + attention FLOPs per token, PaLM's estimate,
  against the GPU's dense bf16 peak), None on CPU or an unknown GPU;
- objective "dpo" only (trainer/objective/dpo.py): ``pairs`` (preference pairs of all ranks),
  ``reward_chosen``, ``reward_rejected``, ``reward_margin`` and ``reward_accuracy`` (means of
  the steps' pair means; a reward is beta times the policy/reference log-ratio).

Cost: one all_reduce of 2 numbers per interval, O(1) per step otherwise. The files may be on an
object store (``--output s3://...``): run_dir.py says what that costs.
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from packfeed.service.face import is_remote, read_text, write_bytes_atomic

# Dense bf16 peak FLOP/s by device-name substring.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "L4": 121e12}


def peak_flops(device_name: str) -> float | None:
    for key, flops in PEAK_BF16_FLOPS.items():
        if key in device_name:
            return flops
    return None


@dataclass
class MetricsWindow:
    started: float = field(default_factory=time.perf_counter)
    steps: int = 0
    loss_sum: float = 0.0
    real_tokens: int = 0
    slots: int = 0
    data_wait: float = 0.0
    pairs: int = 0
    reward_sums: dict[str, float] = field(default_factory=dict)
    grad_norms: list[float] = field(default_factory=list)
    source_sums: list[float] = field(default_factory=list)
    source_tokens: list[int] = field(default_factory=list)

    def add(self, *, loss: float, real_tokens: int, slots: int, data_wait: float, pairs: int = 0,
            rewards: Mapping[str, float] | None = None, grad_norm: float = float("nan"),
            source_sums: Sequence[float] = (), source_tokens: Sequence[int] = ()) -> None:
        """One step's figures; ``pairs`` and ``rewards`` (chosen, rejected, margin, accuracy: the
        step's pair means) come with the DPO objective only; ``grad_norm``: the whole model's
        gradient norm before clipping (NaN for a step that trained no token: not counted);
        ``source_sums`` / ``source_tokens``: the step's summed token losses and trained tokens
        per source (all ranks; SFT with a source table: ``StepResult``)."""
        self.steps += 1
        if source_tokens:
            if not self.source_tokens:
                self.source_sums, self.source_tokens = [0.0] * len(source_sums), [0] * len(source_tokens)
            self.source_sums = [a + b for a, b in zip(self.source_sums, source_sums)]
            self.source_tokens = [a + b for a, b in zip(self.source_tokens, source_tokens)]
        if math.isfinite(grad_norm):
            self.grad_norms.append(grad_norm)
        self.loss_sum += loss
        self.real_tokens += real_tokens
        self.slots += slots
        self.data_wait += data_wait
        self.pairs += pairs
        for name, value in (rewards or {}).items():
            self.reward_sums[name] = self.reward_sums.get(name, 0.0) + value

    def close(self, *, step: int, lr: float, world_totals: tuple[int, int], flops_per_token: float,
              peak_flops_total: float | None, sources: Sequence[str] = ()) -> dict[str, Any]:
        """The interval's record; ``world_totals``: (real tokens, slots) summed over ranks;
        ``sources``: the names of the stream's sources (the per-source figures' order)."""
        seconds = max(time.perf_counter() - self.started, 1e-9)
        tokens, slots = world_totals
        tokens_per_s = tokens / seconds
        dpo = {f"reward_{name}": total / max(self.steps, 1) for name, total in self.reward_sums.items()}
        return {
            "step": step,
            "loss": self.loss_sum / max(self.steps, 1),
            "lr": lr,
            "grad_norm": sum(self.grad_norms) / len(self.grad_norms) if self.grad_norms else None,
            "tokens_per_s": tokens_per_s,
            "fill": tokens / max(slots, 1),
            "data_wait": self.data_wait / seconds,
            "mfu": (flops_per_token * tokens_per_s / peak_flops_total) if peak_flops_total else None,
            "seconds": seconds,
            "time": time.time(),
            **({"pairs": self.pairs, **dpo} if dpo else {}),
            **(per_source(sources, self.source_sums, self.source_tokens) if self.source_tokens else {}),
        }


def per_source(names: Sequence[str], sums: Sequence[float], tokens: Sequence[int]) -> dict[str, Any]:
    """``source_loss`` (the token mean of every source with a trained token) and ``source_tokens``
    (every source's trained tokens) of summed token losses and token counts per source."""
    return {"source_loss": {name: total / count for name, total, count in zip(names, sums, tokens) if count},
            "source_tokens": {name: int(count) for name, count in zip(names, tokens)}}


def progress_line(record: dict[str, Any], max_steps: int) -> str:
    """The line rank 0 prints for a record: the interval's figures, then its eval loss."""
    evaluated = record.get("eval")
    ev = f"  eval loss {evaluated['loss']:.4f}" if evaluated else ""
    if evaluated and "reward_margin" in evaluated:
        ev += f" (margin {evaluated['reward_margin']:+.4f}, accuracy {evaluated['reward_accuracy']:.0%})"
    if "loss" not in record:  # an evaluation alone (``train_records``)
        return f"step {record['step']:>5}/{max_steps}{ev}"
    mfu = f" mfu {record['mfu']:.1%}" if record.get("mfu") is not None else ""
    dpo = (f"  margin {record['reward_margin']:+.4f}  accuracy {record['reward_accuracy']:.0%}"
           if "reward_margin" in record else "")
    ranks = (record.get("memory") or {}).get("ranks")
    peak = f"  peak {max(r['peak_bytes'] for r in ranks) / 2**30:.2f} GiB" if ranks else ""
    norm = f"  grad norm {record['grad_norm']:.3g}" if record.get("grad_norm") is not None else ""
    return (
        f"step {record['step']:>5}/{max_steps}  loss {record['loss']:.4f}{dpo}{ev}  lr {record['lr']:.2e}{norm}  "
        f"{record['tokens_per_s']:,.0f} tok/s  fill {record['fill']:.1%}  "
        f"data wait {record['data_wait']:.0%}{mfu}{peak}"
    )


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """One record more in ``path``: a line appended on disk; on an object store (a URI), which
    cannot append, the object written whole again (a GET and a PUT: records are small and a
    few per minute)."""
    if is_remote(os.fspath(path)):
        _write_jsonl(path, [*read_jsonl(path), record])
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def keep_records_until(path: str | Path, step: int) -> None:
    """Drop the records of steps after ``step`` (a run resumed or restarted from the checkpoint
    of ``step`` trains them again: the curve and the summary count each step once)."""
    records = read_jsonl(path)
    kept = [r for r in records if r["step"] <= step]
    if len(kept) < len(records):
        _write_jsonl(path, kept)


def _write_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    write_bytes_atomic(os.fspath(path), "".join(json.dumps(r) + "\n" for r in records).encode())


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    text = read_text(os.fspath(path))
    return [] if text is None else [json.loads(line) for line in text.splitlines() if line.strip()]


def train_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of training intervals: not those of an evaluation alone (a step evaluated
    right after its interval closed, when the stream ended: they hold ``step``, ``time``, ``eval``)."""
    return [r for r in records if "loss" in r]


def eval_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary's ``eval``: the last evaluation's loss and step, and the best one's (the
    lowest loss); {} for a run without ``[eval]``."""
    evaluated = [(r["step"], r["eval"]) for r in records if r.get("eval") and math.isfinite(r["eval"]["loss"])]
    if not evaluated:
        return {}
    best = min(evaluated, key=lambda e: e[1]["loss"])
    return {"eval": {"last_step": evaluated[-1][0], "last_loss": evaluated[-1][1]["loss"],
                     "best_step": best[0], "best_loss": best[1]["loss"],
                     "last_source_loss": evaluated[-1][1].get("source_loss", {}),
                     **{f"last_{key}": evaluated[-1][1][key] for key in ("reward_margin", "reward_accuracy")
                        if key in evaluated[-1][1]}}}


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """First/last loss, mean throughput and fill over the run's metric records; the eval
    losses (``eval_summary``)."""
    evaluated = eval_summary(records)
    records = train_records(records)
    if not records:
        return {"steps": 0, **evaluated}
    seconds = sum(r["seconds"] for r in records)
    tokens = sum(r["tokens_per_s"] * r["seconds"] for r in records)
    return {
        "steps": records[-1]["step"],
        "first_loss": records[0]["loss"],
        "last_loss": records[-1]["loss"],
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "mean_fill": sum(r["fill"] for r in records) / len(records),
        "mean_data_wait": sum(r["data_wait"] * r["seconds"] for r in records) / seconds if seconds else 0.0,
        "train_seconds": seconds,
        **{f"last_{key}": records[-1][key] for key in ("reward_margin", "reward_accuracy") if key in records[-1]},
        **({"memory": records[-1]["memory"]} if "memory" in records[-1] else {}),
        **evaluated,
    }


PACKING_KEYS = ("rows", "tokens", "efficiency", "samples_packed", "windows")
PACKED_OUTPUT = "packed output"  # ``packing["from"]``: the packed directory's stats.json, packed before
READER = "reader"  # ``packing["from"]``: the windows this run's reader packed


def packing_figures(stats: Mapping[str, Any] | None, *, origin: str) -> dict[str, Any] | None:
    """The summary's ``packing``: ``PACKING_KEYS`` of ``stats`` and where they come from
    (``origin``: ``PACKED_OUTPUT`` for a packed directory's stats.json, ``READER`` for the
    RunStats of the windows this run packed). None when they say nothing: no row counted (a
    packed directory's run, whose reader packs no window; a finished run resumed) or no
    efficiency. The summary then has no packing line rather than a 0.0% of rows the reader
    never packed."""
    stats = stats or {}
    if not stats.get("rows") or stats.get("efficiency") is None:
        return None
    return {**{k: stats.get(k) for k in PACKING_KEYS}, "from": origin}


def _packing_lines(packing: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The packing line of the summary, or none when its figures are unknown (``packing_figures``)."""
    if not packing or not packing.get("rows") or packing.get("efficiency") is None:
        return []
    where = ", from the packed output's stats.json" if packing.get("from") == PACKED_OUTPUT else ""
    return [("packing efficiency", f"{packing['efficiency']:.1%} ({packing['rows']:,} rows packed{where})")]


def format_summary(summary: dict[str, Any]) -> str:
    """The closing summary ``packfeed train`` prints: one aligned line per figure of
    ``summary`` (``summarize``'s, with the packing figures, wall time and outcome)."""
    lines = [
        ("steps", f"{summary.get('steps', 0)}" + (" (stopped early: data exhausted)" if summary.get("stopped_early") else "")),
        ("loss first -> last", f"{summary.get('first_loss', float('nan')):.4f} -> {summary.get('last_loss', float('nan')):.4f}"),
        *([("DPO reward (last)", f"margin {summary['last_reward_margin']:+.4f}, accuracy "
                                 f"{summary['last_reward_accuracy']:.0%}")] if "last_reward_margin" in summary else []),
        *_eval_lines(summary.get("eval")),
        ("real tokens/s", f"{summary.get('tokens_per_s', 0):,.0f}"),
        ("row fill (trained rows)", f"{summary.get('mean_fill', 0):.1%}"),
        ("data wait", f"{summary.get('mean_data_wait', 0):.1%}"),
        *_packing_lines(summary.get("packing")),
        ("wall time", f"{summary.get('wall_seconds', 0):.1f} s"),
        _outcome(summary),
    ]
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def _eval_lines(evaluated: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The eval line of the summary: the last eval loss and the best one, with their steps."""
    if not evaluated:
        return []
    return [("eval loss last (best)", f"{evaluated['last_loss']:.4f} at step {evaluated['last_step']} "
                                      f"({evaluated['best_loss']:.4f} at step {evaluated['best_step']})")]


def _outcome(summary: dict[str, Any]) -> tuple[str, str]:
    """The summary's last line: the final model, or where a stopped run can continue from."""
    stopped = summary.get("stopped")
    if stopped is None:
        return "final model", summary.get("final_model", "")
    return "stopped", f"by {stopped['signal']} at step {stopped['step']}: resume from {stopped['checkpoint']}"


def plot_loss(records: list[dict[str, Any]], path: str | Path) -> None:
    """Loss against step as a PNG (matplotlib, Agg back-end), at a path or a URI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    trained = train_records(records)
    ax.plot([r["step"] for r in trained], [r["loss"] for r in trained], marker="o", markersize=3, label="train")
    evaluated = [r for r in records if r.get("eval")]
    if evaluated:
        ax.plot([r["step"] for r in evaluated], [r["eval"]["loss"] for r in evaluated], marker="s", markersize=3,
                label="eval")
        ax.legend()
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (token mean)")
    ax.set_title("packfeed train")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=100)
    plt.close(fig)
    write_bytes_atomic(os.fspath(path), image.getvalue())
