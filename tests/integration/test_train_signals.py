"""`packfeed train` stopped by a signal to its driver: SIGTERM and Ctrl-C (SIGINT).

Real `packfeed train` processes (tests/support/train.py: tiny Llama, 2 DDP workers, seq_len
256, 4 rows per step), each with its own embedded Ray. Checked:

* SIGTERM mid-run: exit 143; both ranks stop after the same step, which is checkpointed (the
  only checkpoint: ``checkpoint_every = 0``); the driver says where it stopped and how to go on;
  no final/; none of its processes (its embedded Ray's included) left. ``--resume`` trains the
  rest, step by step on the rows an uninterrupted run trains (the serve contract: step s, rank
  k of 2 gets rows 4(s-1) + k + 2j), each step once, and writes a complete final/. ``--resume``
  again says the run is finished and changes nothing, without starting Ray.
* Ctrl-C twice (SIGINT to the process group, as a terminal sends it): the first starts the
  orderly stop, the second ends the run at once; exit 130, no traceback, nothing left running.

`ray job stop` (SIGTERM from Ray's job supervisor) is tested on a deploy/local cluster in
test_local_cluster.py.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from support.train import (
    STEPS,
    STOPPED,
    SIGNAL_AT,
    Train,
    assert_stopped_at_checkpoint,
    contract_rows,
    last_packfeed_line,
    steps_of_every_rank,
    trained,
    wait_for_line,
    wait_for_step,
    write_config,
)

from packfeed.service.pipeline.raycluster import Terminated
from packfeed.trainer.stopping import StopSignals

pytestmark = pytest.mark.integration

@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    return write_config(tmp_path_factory.mktemp("signals"))


def test_sigterm_stops_at_a_checkpoint_and_resume_finishes_on_the_same_rows(config, tmp_path):
    output = tmp_path / "run"
    run = Train(config, output)
    signalled_at = wait_for_step(output, SIGNAL_AT, run.alive)
    os.kill(run.proc.pid, signal.SIGTERM)
    code, out = run.ended()
    assert code == 143, out[-3000:]
    assert last_packfeed_line(out) == "packfeed train: stopped by SIGTERM", out[-2000:]
    stop = assert_stopped_at_checkpoint(output, out, "SIGTERM", signalled_at)
    summary = json.loads((output / "summary.json").read_text())
    assert summary["stopped"]["step"] == stop and summary["steps"] == stop and "final_model" not in summary
    assert not run.left(), "no process of the run (its embedded Ray included) is left"

    code, out = Train(config, output, "--resume").ended()
    assert code == 0, out[-3000:]
    assert f"at step {stop}," in out
    rows = trained(output)
    assert sorted((s, r) for s, r, _ in rows) == steps_of_every_rank(STEPS), \
        "each step of each rank trained once over the stopped and the resumed run"
    assert all(indices == contract_rows(s, r) for s, r, indices in rows), "the rows of an uninterrupted run"
    assert json.loads((output / "final" / "packfeed_state.json").read_text()) == {"step": STEPS}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= \
        {p.name for p in (output / "final").iterdir()}
    assert not list(output.glob(".final*")), "nothing is left of the final model's writing"
    summary = json.loads((output / "summary.json").read_text())
    assert summary["steps"] == STEPS and "stopped" not in summary

    before = {p: p.read_bytes() for p in (output / "summary.json", output / "metrics.jsonl")}
    names = sorted(str(p.relative_to(output)) for p in output.rglob("*"))
    code, out = Train(config, output, "--resume").ended(timeout=120)
    assert code == 0, out[-3000:]
    assert f"is finished, nothing to do: it trained step {STEPS} of {STEPS}" in out, out[-2000:]
    assert "Ray:" not in out, "a finished run starts no Ray"
    assert {p: p.read_bytes() for p in before} == before, "summary.json and metrics.jsonl untouched"
    assert sorted(str(p.relative_to(output)) for p in output.rglob("*")) == names


def test_ctrl_c_twice_ends_the_run_at_once_without_a_traceback(config, tmp_path):
    output = tmp_path / "run"
    run = Train(config, output)
    wait_for_step(output, SIGNAL_AT, run.alive)
    os.killpg(run.proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    wait_for_line(run, r"SIGINT: stopping after step \d+")
    os.killpg(run.proc.pid, signal.SIGINT)
    code, out = run.ended(timeout=120)
    assert code == 130, out[-3000:]
    assert "SIGINT again: stopping now" in out and last_packfeed_line(out) == "packfeed train: interrupted", out[-2000:]
    assert not STOPPED.search(out), "the second signal cut the orderly stop short"
    assert not (output / "final").exists()
    assert not run.left(), "no process of the run (its embedded Ray included) is left"


def test_a_signal_before_ray_ends_at_once_and_one_inside_ray_is_acted_on_later():
    """Before Ray starts the handler raises (the CLI's exit status comes from the exception);
    from ``defer()`` on the main thread may be inside ray.get, where an exception raised by a
    handler turns into a SystemError: the signal is recorded and ``check()`` raises it."""
    previous = signal.getsignal(signal.SIGINT)
    with pytest.raises(Terminated):
        with StopSignals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode: never reached
    with StopSignals() as signals:
        signals.defer()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        assert signals.requested and not signals.urgent and signals.name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            signals.check()
    assert signal.getsignal(signal.SIGINT) is previous, "the previous handler is back"
