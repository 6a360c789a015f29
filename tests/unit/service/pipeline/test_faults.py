"""``$PACKFEED_FAULTS``: what it parses to, where a fault fires, and that it fires once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from packfeed.service import faults
from packfeed.service.faults import FAULT_EXIT, FAULTS_DIR_ENV, FAULTS_ENV, FaultInjected


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    monkeypatch.delenv(FAULTS_DIR_ENV, raising=False)
    faults._fired.clear()
    yield
    faults._fired.clear()


@pytest.mark.parametrize("text, parsed", [
    pytest.param("", [], id="empty"),
    pytest.param("serve-row:1200", [("serve-row", 1200, None, "kill")], id="default-action"),
    pytest.param("train-step:4@1", [("train-step", 4, 1, "exit")], id="rank"),
    pytest.param("packer-window:3:exit, reader-window:0",
                 [("packer-window", 3, None, "exit"), ("reader-window", 0, None, "raise")], id="two-with-action"),
    pytest.param("train-step:2@0:raise", [("train-step", 2, 0, "raise")], id="rank-and-action"),
    pytest.param("serve-row:7:stop", [("serve-row", 7, None, "stop")], id="stop"),
])
def test_parse(text, parsed):
    assert faults.parse(text) == parsed


@pytest.mark.parametrize("text, message", [
    pytest.param("serve-rows:3", "POINT:N", id="unknown-point"),
    pytest.param("serve-row", "POINT:N", id="no-number"),
    pytest.param("serve-row:-1", "POINT:N", id="negative"),
    pytest.param("serve-row:3:explode", "action 'explode'", id="unknown-action"),
])
def test_malformed_entries_are_named(text, message):
    with pytest.raises(ValueError, match=message) as err:
        faults.parse(text)
    assert text.split(",")[0] in str(err.value)


def test_off_by_default_and_silent_elsewhere(monkeypatch):
    faults.point("packer-window", 3)  # nothing set: returns
    monkeypatch.setenv(FAULTS_ENV, "packer-window:3")
    faults.point("packer-window", 2)
    faults.point("reader-window", 3)
    assert faults.armed("packer-window") == [3] and faults.armed("serve-row") == []


def test_fires_at_its_point_once_per_process(monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, "reader-window:2")
    with pytest.raises(FaultInjected, match="reader-window:2"):
        faults.point("reader-window", 2)
    faults.point("reader-window", 2)  # passed again: no second failure


def test_a_rank_fault_fires_on_that_rank_only(monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, "train-step:4@1:raise")
    faults.point("train-step", 4, rank=0)
    with pytest.raises(FaultInjected, match=r"train-step:4 \(rank 1\)"):
        faults.point("train-step", 4, rank=1)


def test_the_directory_makes_it_once_across_processes(monkeypatch, tmp_path):
    """A second process with the same settings (a restarted train worker) passes the point."""
    env = {**os.environ, FAULTS_ENV: "train-step:4", FAULTS_DIR_ENV: str(tmp_path / "drill")}
    code = "from packfeed.service import faults; faults.point('train-step', 4, rank=0); print('passed')"
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == FAULT_EXIT and "fault injected at train-step:4" in first.stdout, first
    assert second.returncode == 0 and second.stdout.strip() == "passed", second
    assert os.listdir(tmp_path / "drill") == ["train-step-4-any.fired"]


def test_environment_travels_to_processes_ray_starts(monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, "packer-window:1")
    carried = faults.environment()
    monkeypatch.delenv(FAULTS_ENV)
    faults.adopt(carried)  # what a packing actor does with its constructor argument
    assert os.environ[FAULTS_ENV] == "packer-window:1"
    faults.adopt({})
    assert FAULTS_ENV not in os.environ


def test_a_malformed_setting_is_a_one_line_error_before_anything_runs(monkeypatch, capsys):
    from packfeed.service.cli import main

    monkeypatch.setenv(FAULTS_ENV, "serve-row:12,train-stp:3")
    assert main(["inspect", "no-such-dir"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["packfeed inspect: error: $PACKFEED_FAULTS: 'train-stp:3' is not POINT:N[@RANK][:ACTION] with "
                   "POINT one of packer-window, reader-window, serve-row, train-step"], err


def test_a_drill_is_announced(monkeypatch, capsys):
    from packfeed.service.cli import main

    monkeypatch.setenv(FAULTS_ENV, "train-step:3@1")
    main(["inspect", "no-such-dir"])  # fails on its input: the announcement came first
    assert capsys.readouterr().err.splitlines()[0] == \
        "packfeed inspect: warning: fault injection on ($PACKFEED_FAULTS): train-step:3@1:exit"


def test_stop_sends_this_process_sigterm_and_goes_on(monkeypatch, capsys):
    """``stop``: the process's SIGTERM handler runs (a server drains); the call returns."""
    import signal

    got = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        monkeypatch.setenv(FAULTS_ENV, "serve-row:7:stop")
        faults.point("serve-row", 6)
        assert got == []
        faults.point("serve-row", 7)  # returns: the handler ran in this (the main) thread
        faults.point("serve-row", 7)  # once per process
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert got == [signal.SIGTERM]
    assert "fault injected at serve-row:7: stop" in capsys.readouterr().out
