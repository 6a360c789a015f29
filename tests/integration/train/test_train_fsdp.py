"""`packfeed train --sharding fsdp` end to end: real `packfeed train` processes, each with its
own embedded Ray (2 CPUs), 2 train workers (gloo), a tiny Llama, 4 packed rows of 256 tokens a
step, a metrics record every step.

* FSDP2 with full activation checkpointing and a chunked loss trains the losses (1e-4 relative,
  step by step) and the final weights of DDP with the full logits;
* SIGTERM to the driver mid-run: exit 143, every rank stops after the same step with a sharded
  checkpoint (each rank's shards, no whole model), the driver's line says where and how to go
  on, nothing of the run is left running; ``--resume`` with ONE worker and twice the gradient
  accumulation (the same rows per step: DCP reshards the weights and AdamW's moments) trains the
  uninterrupted run's losses and final weights and writes a complete final/; ``--resume`` of the
  finished run changes nothing and starts no Ray (the test of SIGTERM to `packfeed train`; Ctrl-C
  is in test_train_signals.py, `ray job stop` in cluster/test_local_cluster.py);
* ``summary.json`` says what each rank held: half the parameter and optimizer bytes under fsdp.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from support.compare import assert_same_training, final_weights, losses
from support.train import (
    Train,
    assert_a_finished_run_resumes_to_nothing,
    assert_final_model,
    assert_stopped_at_checkpoint,
    corpus_head,
    last_packfeed_line,
    run_config_text,
    trained,
    wait_for_step,
)


torch = pytest.importorskip("torch")

pytestmark = pytest.mark.integration

STEPS = 10
FSDP = ("--sharding", "fsdp", "--activation-checkpointing", "full", "--loss-chunk-tokens", "96")
DDP_FULL_LOGITS = ("--sharding", "ddp", "--activation-checkpointing", "off", "--loss-chunk-tokens", "0")


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fsdp-train")
    path = root / "run.toml"
    path.write_text(run_config_text(corpus_head(root, 100), steps=STEPS))
    return path


def finished(config: Path, output: Path, *flags: str) -> Path:
    code, out = Train(config, output, *flags).ended()
    assert code == 0, out[-3000:]
    return output


@pytest.fixture(scope="module")
def fsdp_run(config, tmp_path_factory) -> Path:
    return finished(config, tmp_path_factory.mktemp("fsdp") / "run", *FSDP)


def test_fsdp_with_checkpointing_and_a_chunked_loss_trains_what_ddp_trains(config, fsdp_run, tmp_path):
    ddp = finished(config, tmp_path / "ddp", *DDP_FULL_LOGITS)
    assert_same_training(ddp, fsdp_run, steps=STEPS, rel=1e-4, weights=True)
    first, last = losses(ddp)[1], losses(ddp)[STEPS]
    assert last < first - 0.5, "the runs trained: equal losses are not those of an untouched model"


def test_each_fsdp_rank_holds_half_the_parameter_and_optimizer_bytes(fsdp_run):
    summary = json.loads((fsdp_run / "summary.json").read_text())
    ranks = summary["memory"]["ranks"]
    weights = final_weights(fsdp_run)
    whole = sum(t.numel() * 4 for t in weights.values())
    assert len(ranks) == 2
    for rank in ranks:
        assert rank["param_bytes"] == pytest.approx(whole / 2, rel=0.05)
        assert rank["optimizer_bytes"] == pytest.approx(whole, rel=0.05)  # two moments, half each
        assert rank["peak_bytes"] > rank["param_bytes"]
    assert sum(r["param_bytes"] for r in ranks) == whole


def test_sigterm_stops_at_a_sharded_checkpoint_and_resume_on_one_worker_trains_the_uninterrupted_run(
        config, fsdp_run, tmp_path):
    """SIGTERM to the driver mid-run: exit 143, every rank stopped after the same checkpointed
    step, the driver says where and how to go on, no final/, none of the run's processes left
    (its embedded Ray's included). ``--resume`` on one worker trains the uninterrupted run's
    losses and weights, each step once, and writes a complete final/; ``--resume`` again says
    the run is finished and changes nothing, without starting Ray."""
    output = tmp_path / "stopped"
    run = Train(config, output, *FSDP)
    signalled_at = wait_for_step(output, 2, run.alive)
    os.kill(run.proc.pid, signal.SIGTERM)
    code, out = run.ended()
    assert code == 143, out[-3000:]
    assert last_packfeed_line(out) == "packfeed train: stopped by SIGTERM", out[-2000:]
    stop, checkpoint = assert_stopped_at_checkpoint(output, out, "SIGTERM", signalled_at, steps=STEPS)
    files = {p.name for p in (checkpoint / "sharded").iterdir()}
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= files, "every rank's shards, in one checkpoint"
    assert not (checkpoint / "model").exists(), "no rank wrote the whole model"
    summary = json.loads((output / "summary.json").read_text())
    assert summary["stopped"]["step"] == stop and summary["steps"] == stop and "final_model" not in summary
    assert not run.left(), "no process of the run (its embedded Ray included) is left"

    resume = (*FSDP, "--num-workers", "1", "--grad-accum", "2")
    code, out = Train(config, output, *resume, "--resume").ended()
    assert code == 0, out[-3000:]
    assert f"at step {stop}," in out
    assert sorted((s, r) for s, r, _ in trained(output)) == (
        [(s, r) for s in range(1, stop + 1) for r in (0, 1)] + [(s, 0) for s in range(stop + 1, STEPS + 1)]), \
        "each step trained once: by both ranks before the stop, by the one after it"
    assert_same_training(fsdp_run, output, steps=STEPS, rel=1e-4, weights=True)
    assert_final_model(output, STEPS)
    assert_a_finished_run_resumes_to_nothing(config, output, STEPS, *resume)
