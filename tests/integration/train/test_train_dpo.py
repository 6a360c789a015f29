"""`packfeed train` with ``[train] objective = "dpo"`` end to end: the bundled preference example
(examples/preference.jsonl: standard, conversational and implicit-prompt pairs) read, tokenized
and packed by the real pipeline, 2 DDP workers with gradient accumulation on a real local Ray (CPU).

The reference is the initial weights, so at step 1 the policy equals it and every pair's loss
is exactly ln 2 (the sigmoid of a zero margin): the first record must say 0.6931 with zero
margin and accuracy. The run sees the same 48 pairs several times, so a few steps later the
loss has fallen below ln 2 and most chosen answers are preferred. ``[eval]`` on the same pairs
packed apart says so too, every 5 steps: the pair-mean loss, margin and accuracy of all 48.
"""

from __future__ import annotations

import itertools
import math

import pytest

from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.cli import main
from packfeed.service.data.config import DataConfig
from packfeed.service.cluster.scaling import PackingScaling
from packfeed.trainer.loop.evaluate import EvalConfig
from packfeed.trainer.run_config import ModelConfig, RunConfig, TrainConfig, TrainScaling
from packfeed.trainer.loop.interval import read_jsonl
from support.serve import REPO

pytestmark = pytest.mark.integration

STEPS, PAIRS = 10, 48


def bundled_pairs(path) -> str:
    """The first PAIRS lines of examples/preference.jsonl (every form appears among them)."""
    with open(REPO / "examples" / "preference.jsonl") as f:
        path.write_text("".join(itertools.islice(f, PAIRS)))
    return str(path)


def test_dpo_run_starts_at_ln2_and_learns_the_preference(ray_cluster, tmp_path):
    from packfeed.trainer.launch.ray_driver import train

    pairs = bundled_pairs(tmp_path / "pairs.jsonl")
    eval_dir = tmp_path / "eval_rows"  # [eval]: the same pairs packed apart, evaluated every 5 steps
    assert main(["pack", pairs, "--tokenizer", demo_tokenizer_path(), "--seq-len", "256", "--output",
                 str(eval_dir)]) == 0
    run = RunConfig(
        eval=EvalConfig(packed=str(eval_dir), every_steps=5),
        data=DataConfig.from_inputs((pairs,), tokenizer=demo_tokenizer_path(),
                                    seq_len=256, window_samples=64, epochs=8),
        model=ModelConfig(name="tiny-llama", attn="sdpa"),
        train=TrainConfig(objective="dpo", dpo_beta=0.1, max_steps=STEPS, micro_batch_rows=2, grad_accum=2,
                          log_every=1, lr=3e-3, warmup_steps=0, min_lr_ratio=1.0),
        scaling=TrainScaling(num_workers=2, cpus_per_worker=0.5,
                             packing=PackingScaling(num_workers=1, cpus_per_worker=0.5)),
    )
    summary = train(run, output=tmp_path / "run")

    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    first, last = records[0], records[-1]
    # 2 workers x 2 micro-batches x 2 rows of 256: rows hold several pairs each.
    assert first["pairs"] > 8
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert first["reward_margin"] == pytest.approx(0, abs=1e-5) and first["reward_accuracy"] == 0
    # Measured: 0.256, accuracy 93% at step 10.
    assert last["loss"] < 0.5 and last["reward_accuracy"] > 0.75 and last["reward_margin"] > 0
    assert summary["last_reward_accuracy"] == last["reward_accuracy"]
    assert (tmp_path / "run" / "final" / "config.json").exists()
    # [eval] under DPO: the pair-mean loss, margin and accuracy of every pair of the eval set
    evaluated = {r["step"]: r["eval"] for r in records if "eval" in r}
    assert sorted(evaluated) == [5, 10] and all(e["pairs"] == PAIRS for e in evaluated.values())
    assert evaluated[10]["loss"] < evaluated[5]["loss"] < math.log(2) and evaluated[10]["reward_accuracy"] > 0.5
    assert summary["eval"]["last_step"] == 10 and summary["eval"]["last_reward_margin"] == evaluated[10]["reward_margin"]
