"""`packfeed train` stopped by Ctrl-C (SIGINT) to its driver.

A real `packfeed train` process (tests/support/train.py: tiny Llama, 2 DDP workers, seq_len
256, 4 rows per step) with its own embedded Ray. Ctrl-C twice (SIGINT to the process group, as
a terminal sends it): the first starts the orderly stop, the second ends the run at once; exit
130, no traceback, nothing left running. And the handler itself: a signal before Ray ends at
once, one inside Ray is acted on later.

SIGTERM to the driver (the orderly stop at a checkpoint, and ``--resume`` at another world
size) is tested in test_train_fsdp.py; `ray job stop` (SIGTERM from Ray's job supervisor) on a
deploy/local cluster in cluster/test_local_cluster.py.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from support.train import STOPPED, SIGNAL_AT, Train, last_packfeed_line, wait_for_line, wait_for_step, write_config

from packfeed.service.cluster.raycluster import Terminated
from packfeed.trainer.launch.signals import StopSignals

pytestmark = pytest.mark.integration

@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    return write_config(tmp_path_factory.mktemp("signals"))


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
