"""Ray Train end to end on a real local Ray (2 CPUs): checkpoints, exact resume, a worker
dying mid-run, another world size, data running out, too many skipped samples.

One uninterrupted 6-step run is the reference. Against it, per (step, rank), the global row
indices trained and the loss (fp32 CPU, to 1e-5):

* a run stopped after 3 steps and resumed with ``resume=True``;
* the stopped run resumed with ONE worker (another world size) and more steps than the data
  holds: every row of the stream is trained exactly once over both runs, and the summary says
  ``stopped_early``.

And a run whose train worker dies after step 12 (``$PACKFEED_FAULTS=train-step:12@0``): Ray
Train restarts the worker group by itself (``[train] max_failures``), and the restarted ranks
need rows the feeder's buffer no longer holds (its reader goes back for them): each (step, rank)
trains the rows the assignment gives it. A packed directory under Ray Train (rank k of step s
gets its rows k mod N) is tested beside torchrun in test_torchrun.py.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from support.compare import assert_same_training, rank_steps
from support.train import corpus_head

from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.data.config import DataConfig
from packfeed.service.faults import FAULTS_DIR_ENV, FAULTS_ENV
from packfeed.service.cluster.scaling import PackingScaling
from packfeed.trainer.state.checkpoint import latest_checkpoint, read_state
from packfeed.trainer.run_config import ModelConfig, RunConfig, TrainConfig, TrainScaling
from packfeed.trainer.loop.interval import read_jsonl

pytestmark = pytest.mark.integration

STEPS, INTERRUPT = 6, 3


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> list[str]:
    """The first 100 lines of each bundled file: ~100 rows of 256 tokens, so data can run out."""
    return corpus_head(tmp_path_factory.mktemp("corpus"), 100)


@pytest.fixture(scope="module")
def run_config(small_corpus) -> RunConfig:
    # Windows of 64 samples: a resume point falls inside a window.
    return RunConfig(
        data=DataConfig.from_inputs(tuple(small_corpus), tokenizer=demo_tokenizer_path(), seq_len=256, window_samples=64),
        model=ModelConfig(name="tiny-llama", attn="sdpa"),
        train=TrainConfig(max_steps=STEPS, micro_batch_rows=2, grad_accum=2, log_every=2, checkpoint_every=INTERRUPT,
                          lr=3e-3, warmup_steps=2, record_rows=True, max_failures=1),
        scaling=TrainScaling(num_workers=2, cpus_per_worker=0.5, packing=PackingScaling(num_workers=1, cpus_per_worker=0.5)),
    )


@pytest.fixture(scope="module")
def straight(ray_cluster, run_config, tmp_path_factory):
    from packfeed.trainer.launch.ray_driver import train

    output = tmp_path_factory.mktemp("straight")
    summary = train(run_config, output=output)
    assert summary["steps"] == STEPS and "stopped_early" not in summary
    return output


@pytest.fixture(scope="module")
def interrupted(ray_cluster, run_config, tmp_path_factory):
    """A run stopped after INTERRUPT steps (a planned interruption); tests resume copies of it."""
    from packfeed.trainer.launch.ray_driver import train

    output = tmp_path_factory.mktemp("interrupted")
    train(dataclasses.replace(run_config, train=dataclasses.replace(run_config.train, stop_at_step=INTERRUPT)),
          output=output)
    return output


def copy_run(src, dst):
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


def test_a_resumed_run_trains_on_the_rows_of_an_uninterrupted_one(straight, interrupted, run_config, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from packfeed.trainer.launch.ray_driver import train

    copy_run(interrupted, tmp_path)
    # A checkpoint whose upload was cut short (its state landed, Ray never registered it): the
    # workers of a resumed fit start from Ray's latest registered one, so --resume must too.
    partial = tmp_path / "ray" / "checkpoint_000005"
    partial.mkdir()
    (partial / "trainer_state.json").write_text(json.dumps({**read_state(latest_checkpoint(tmp_path)), "step": 5}))
    state = read_state(latest_checkpoint(tmp_path))
    assert state["step"] == INTERRUPT
    impossible = dataclasses.replace(run_config, scaling=dataclasses.replace(run_config.scaling, num_workers=64))
    with pytest.raises(ValueError, match="train workers: 64 x"):
        train(impossible, output=tmp_path, overwrite=True)  # a placement refused: the run is not lost
    assert read_state(latest_checkpoint(tmp_path))["step"] == INTERRUPT
    assert set(state["stream"]) == {"version", "cursor", "step", "config_hash", "seq_len"}, "the client's format"
    assert state["stream"]["cursor"] == INTERRUPT * 2 * 4 and state["manifest"]["first_row"]
    with pytest.raises(ValueError, match="--resume"):
        train(run_config, output=tmp_path)
    train(run_config, output=tmp_path, resume=True)
    assert_same_training(straight, tmp_path, steps=STEPS, rel=1e-5, ranks=2)
    checkpoints = sorted(p.name for p in (tmp_path / "ray").glob("checkpoint_*"))
    again = train(run_config, output=tmp_path, resume=True)  # a finished run applied again (`--resume auto` jobs)
    assert again["steps"] == STEPS and sorted(p.name for p in (tmp_path / "ray").glob("checkpoint_*")) == checkpoints
    all_rows = [i for rows, _ in rank_steps(straight).values() for i in rows]
    assert len(all_rows) == len(set(all_rows)) > 0, "no row is trained twice"

    for output in (straight, tmp_path):  # outputs of a run: metrics, curve, summary, a model that loads
        assert (output / "loss.png").stat().st_size > 0
        assert {"loss", "lr", "tokens_per_s", "fill", "data_wait", "mfu"} <= set(read_jsonl(output / "metrics.jsonl")[-1])
        assert json.loads((output / "summary.json").read_text())["steps"] == STEPS
    model = AutoModelForCausalLM.from_pretrained(straight / "final")
    assert model.get_input_embeddings().num_embeddings == len(AutoTokenizer.from_pretrained(straight / "final"))


def test_a_restarted_group_gets_rows_the_feeder_no_longer_holds(ray_cluster, tmp_path_factory, tmp_path, monkeypatch):
    """Issue: train survives a worker crash. Rank 0 dies once it has finished step 12 (fault
    injection: the process ends at that step, not when a polling thread gets to it) of a run with
    no checkpoint before its end: Ray Train restarts the group from scratch by itself
    (``[train] max_failures``), and the rows of steps 1.. are long gone from the feeder's 128-row
    buffer (16 rows a step). The feeder starts its reader again at the window holding them; every
    (step, rank) trains the rows the assignment gives it, a step trained twice the same rows to
    the same loss, and the curve has each step once."""
    from packfeed.trainer.launch.ray_driver import train

    paths = corpus_head(tmp_path_factory.mktemp("corpus300"), 300)  # ~300 rows: 14 steps and a buffer
    steps, crash, per_step = 14, 12, 16
    run = RunConfig(
        data=DataConfig.from_inputs(tuple(paths), tokenizer=demo_tokenizer_path(), seq_len=256, window_samples=64),
        model=ModelConfig(name="tiny-llama", attn="sdpa"),
        train=TrainConfig(max_steps=steps, micro_batch_rows=4, grad_accum=2, log_every=7, checkpoint_every=0,
                          lr=3e-3, warmup_steps=2, record_rows=True, max_failures=1, feeder_buffer_rows=128),
        scaling=TrainScaling(num_workers=2, cpus_per_worker=0.5, packing=PackingScaling(num_workers=1, cpus_per_worker=0.5)),
    )
    monkeypatch.setenv(FAULTS_ENV, f"train-step:{crash}@0")
    monkeypatch.setenv(FAULTS_DIR_ENV, str(tmp_path / "drill"))
    summary = train(run, output=tmp_path / "run")
    assert (tmp_path / "drill" / f"train-step-{crash}-0.fired").exists(), "rank 0 did die after step 12"
    records = read_jsonl(tmp_path / "run" / "rows" / "rank0.jsonl")
    pids = [rec["pid"] for rec in records]
    assert len(set(pids)) == 2, "rank 0 ran in a second process after its death (the group was restarted)"
    assert [rec["step"] for rec in records if rec["pid"] == pids[0]][-1] == crash
    assert [rec["step"] for rec in records if rec["pid"] == pids[-1]][0] == 1, "no checkpoint: from the start"
    assert summary["steps"] == steps and summary["reader_restarts"] >= 1, summary  # the reader went back for them
    seen = rank_steps(tmp_path / "run")  # a step trained twice: the same rows, the same loss
    assert sorted(seen) == [(s, r) for s in range(1, steps + 1) for r in range(2)]
    for (step, rank), (indices, _) in seen.items():  # rank k of 2 gets the rows k mod 2 of its step
        assert indices == [per_step * (step - 1) + rank + 2 * j for j in range(per_step // 2)], (step, rank)
    curve = [rec["step"] for rec in read_jsonl(tmp_path / "run" / "metrics.jsonl")]
    assert curve == sorted(set(curve)) and curve[-1] == steps, "each step once in the curve, after the restart too"


def test_another_world_size_trains_every_row_once_and_says_when_data_runs_out(interrupted, run_config, tmp_path):
    from packfeed.trainer.launch.ray_driver import train

    copy_run(interrupted, tmp_path)
    before = [i for rows, _ in rank_steps(tmp_path).values() for i in rows]
    one_worker = dataclasses.replace(
        run_config, train=dataclasses.replace(run_config.train, max_steps=200),
        scaling=dataclasses.replace(run_config.scaling, num_workers=1, cpus_per_worker=1.0),
    )
    summary = train(one_worker, output=tmp_path, resume=True)
    assert "data exhausted at step" in summary["stopped_early"] and "of 200" in summary["stopped_early"]
    records = [rec for rec in read_jsonl(tmp_path / "rows" / "rank0.jsonl") if rec["step"] > INTERRUPT]
    after = [i for rec in records for i in rec["row_index"]]
    total = json.loads((tmp_path / "summary.json").read_text())["stream_rows"]
    real = sorted(i for i in before + after if i < total)
    assert real == list(range(total)), "every row of the stream exactly once across both world sizes"
    per_step = one_worker.train.grad_accum * one_worker.train.micro_batch_rows
    padding = len(before + after) - total
    assert 0 <= padding < per_step, "only the last step is filled with padding rows"


def test_train_fails_as_pack_does_when_more_samples_are_skipped_than_allowed(ray_cluster, run_config, small_corpus,
                                                                               tmp_path):
    """--max-skip-fraction was accepted by train and never applied: a mostly bad input trained, exit 0."""
    from packfeed.trainer.launch.ray_driver import train

    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("".join(open(small_corpus[0]).readlines()[:30]))
    bad.write_text("{oops\n" * 10)  # 10 malformed rows next to 30 good ones: 25% skipped (a few steps of data)
    data = DataConfig.from_inputs((str(good), str(bad)), tokenizer=demo_tokenizer_path(), seq_len=256,
                                  window_samples=64, max_skip_fraction=0.1)
    run = dataclasses.replace(run_config, data=data, train=dataclasses.replace(
        run_config.train, max_steps=200, checkpoint_every=0, record_rows=False))  # to the end of the data: every window read
    with pytest.raises(ValueError, match=r"10 of 40 samples were skipped \(25.0%\), more than --max-skip-fraction 0.1"):
        train(run, output=tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "more than --max-skip-fraction" in summary["failed"] and "stopped_early" in summary
