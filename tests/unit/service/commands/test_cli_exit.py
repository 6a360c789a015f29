"""The ``packfeed`` process ends as soon as its command is done (issue 25): the exit hooks run
and the output is flushed, then the process exits with the command's status, without the
interpreter's teardown (1.0 s after ``packfeed pack``, measured). Each case runs in a Python
of its own: an exit that happens ends that process, not the test's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from packfeed.service import cli

PROBE = """
import atexit, sys, threading, types
from packfeed.service.cli import exit_without_teardown

class Teardown:
    def __del__(self):  # runs in the interpreter's teardown only (a module global)
        sys.stderr.write("teardown ran\\n")

kept = Teardown()
atexit.register(lambda: sys.stdout.write(" exit hook ran"))
sys.stdout.write("buffered output")  # stdout is a pipe: block-buffered, not yet written
{setup}
exit_without_teardown({code})
sys.stdout.write(" returned")
"""

EXIT_STATUSES = [0, 1, 2, 130, 143]  # success, a bug, a user error, Ctrl-C, SIGTERM (cli.run_command)


def probe(code: int, setup: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE.format(code=code, setup=setup)], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("code", EXIT_STATUSES)
@pytest.mark.parametrize("setup", ["", "threading.Thread(target=threading.Event().wait, daemon=True).start()"],
                         ids=["main-thread-only", "a-daemon-thread-running"])
def test_the_process_exits_with_the_status_after_its_hooks_and_output_without_the_teardown(code, setup):
    out = probe(code, setup)
    assert out.returncode == code, out.stderr
    assert out.stdout == "buffered output exit hook ran", "hooks run and output flushed, once"
    assert "teardown ran" not in out.stderr


@pytest.mark.parametrize("setup", [
    "threading.Thread(target=__import__('time').sleep, args=(0.5,)).start()",  # the interpreter waits for it
    "sys.modules['ray'] = types.SimpleNamespace(is_initialized=lambda: True)",  # a caller's Ray, still up
], ids=["a-thread-still-running", "a-ray-still-up"])
def test_the_usual_exit_where_the_teardown_still_has_work(setup):
    out = probe(143, setup)
    assert out.returncode == 0, "it returned: the script went on to its own end"
    assert out.stdout == "buffered output returned exit hook ran"
    assert "teardown ran" in out.stderr, "the probe sees a teardown when there is one"


def test_main_ends_the_process_only_for_its_own_command_line(monkeypatch):
    ran, ended = [], []
    monkeypatch.setattr(cli, "run_command", lambda argv: ran.append(argv) or 7)
    monkeypatch.setattr(cli, "exit_without_teardown", ended.append)
    assert cli.main(["pack", "x"]) == 7 and ended == [], "a caller's argv: the status is returned"
    monkeypatch.setattr(sys, "argv", ["packfeed", "inspect", "y"])
    cli.main()
    assert ended == [7] and ran == [["pack", "x"], ["inspect", "y"]]


@pytest.mark.parametrize("entry", ["python -m", "packfeed executable"])
def test_a_real_command_exits_with_its_status_and_message(tmp_path, entry):
    command = ([sys.executable, "-m", "packfeed.service.cli"] if entry == "python -m"
               else [str(Path(sys.executable).parent / "packfeed")])
    out = subprocess.run([*command, "inspect", str(tmp_path / "missing")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("packfeed inspect: error: ") and "Traceback" not in out.stderr, out.stderr
