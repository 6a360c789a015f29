"""Ray Train end to end on a real local Ray (2 CPUs): training, checkpoints, exact resume.

A run interrupted after 3 steps (``stop_at_step``) and resumed with ``resume=True`` must train
on exactly the rows an uninterrupted 6-step run trains on (same sample ids, same step, same
rank) and reach the same losses; the final model loads with ``from_pretrained``.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.config import DataConfig
from packfeed.trainer.checkpoint import latest_checkpoint, read_state
from packfeed.trainer.config import ModelConfig, RunConfig, TrainConfig, TrainScaling
from packfeed.trainer.metrics import read_jsonl

pytestmark = pytest.mark.integration

STEPS, INTERRUPT = 6, 3
RUN = RunConfig(
    # Windows of 400 samples: the interruption falls inside a window, so resuming must skip
    # whole windows and then rows inside one.
    data=DataConfig(inputs=tuple(demo_corpus_paths()), tokenizer=demo_tokenizer_path(), seq_len=256,
                    window_samples=400),
    model=ModelConfig(name="tiny-llama", attn="sdpa"),
    train=TrainConfig(max_steps=STEPS, micro_batch_rows=2, grad_accum=2, log_every=2, checkpoint_every=INTERRUPT,
                      lr=3e-3, warmup_steps=2, record_rows=True),
    scaling=TrainScaling(num_workers=2, cpus_per_worker=0.5, packing_workers=1, packing_cpus_per_worker=0.5),
)


def rows_seen(output) -> dict[tuple[int, int], tuple[list[int], float]]:
    seen = {}
    for path in sorted((output / "rows").glob("rank*.jsonl")):
        for rec in read_jsonl(path):
            seen[(rec["step"], rec["rank"])] = (rec["sample_ids"], rec["loss"])
    return seen


def test_resumed_run_sees_the_same_rows_as_an_uninterrupted_one(ray_cluster, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from packfeed.trainer.run import train

    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    summary = train(RUN, output=straight)
    assert summary["steps"] == STEPS

    stopped = dataclasses.replace(RUN, train=dataclasses.replace(RUN.train, stop_at_step=INTERRUPT))
    train(stopped, output=interrupted)
    checkpoint = latest_checkpoint(interrupted)
    state = read_state(checkpoint)
    assert state["step"] == INTERRUPT
    assert state["data_position"]["rows"] > 0, "the interruption should fall inside a window"
    with pytest.raises(ValueError, match="--resume"):
        train(RUN, output=interrupted)
    train(RUN, output=interrupted, resume=True)

    a, b = rows_seen(straight), rows_seen(interrupted)
    assert sorted(a) == sorted(b) == [(s, r) for s in range(1, STEPS + 1) for r in range(2)]
    for key in a:
        assert a[key][0] == b[key][0], f"step/rank {key} trained on other samples after resume"
        assert a[key][1] == pytest.approx(b[key][1], rel=1e-5), f"step {key}: loss differs after resume"
    all_ids = [i for ids, _ in a.values() for i in ids]
    assert len(all_ids) == len(set(all_ids)) > 0, "no sample may be trained twice"

    # Outputs of a run: metrics, curve, summary, a final model that loads.
    for output in (straight, interrupted):
        assert (output / "loss.png").stat().st_size > 0
        records = read_jsonl(output / "metrics.jsonl")
        assert {"loss", "lr", "tokens_per_s", "fill", "data_wait", "mfu"} <= set(records[-1])
        assert json.loads((output / "summary.json").read_text())["steps"] == STEPS
    model = AutoModelForCausalLM.from_pretrained(straight / "final")
    tokenizer = AutoTokenizer.from_pretrained(straight / "final")
    assert model.get_input_embeddings().num_embeddings == len(tokenizer)
    losses = [r["loss"] for r in read_jsonl(straight / "metrics.jsonl")]
    assert losses[-1] < losses[0]
