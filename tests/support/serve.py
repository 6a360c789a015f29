"""Real ``packfeed serve`` processes on 127.0.0.1 for the integration tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import psutil

REPO = Path(__file__).resolve().parents[2]
CORPUS = sorted(str(p) for p in (REPO / "service" / "assets" / "corpus").glob("*.jsonl"))
TOKENIZER = str(REPO / "service" / "assets" / "tokenizer")
DEMO_SAMPLES = 7_500  # samples in the bundled corpus; none is skipped at these settings
LISTENING = re.compile(r"packfeed serve: listening on (\S+):(\d+)")
# Tools grep the readiness line: it must be whole, on a line of its own.
READY_LINE = re.compile(r"(?m)^packfeed serve: listening on (\S+):(\d+) [^\n]*\n")


METRICS = re.compile(r"metrics on :(\d+)")  # the readiness line's metrics port


def scrape(port: int) -> dict[str, float]:
    """name{labels} -> value of every packfeed_ sample on a server's metrics endpoint."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("packfeed_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def demo_args(*, seq_len: int = 512, window_samples: int = 1000, extra: tuple[str, ...] = ()) -> list[str]:
    """Serve flags for the bundled corpus: small windows so a stream has several."""
    return [
        *CORPUS,
        "--tokenizer", TOKENIZER,
        "--seq-len", str(seq_len),
        "--window-samples", str(window_samples),
        "--num-workers", "1",
        *extra,
    ]


def process_groups(pid: int) -> set[int]:
    """The process groups of ``pid`` and of every process below it: a command's own, its
    embedded Ray's (gcs_server, raylet, agents: one group apart, see raycluster), and each Ray
    worker's (raylet gives every worker a group of its own). Taken while they run: a process
    that died is no longer anyone's child."""
    groups = set()
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            try:
                groups.add(os.getpgid(p.pid))
            except ProcessLookupError:
                continue
    except psutil.NoSuchProcess:
        pass
    return groups


def alive_in(groups: set[int]) -> list[psutil.Process]:
    """The live (not zombie) processes of these process groups."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) in groups and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return out


def left_after(groups: set[int], timeout: float = 5.0) -> list[str]:
    """"pid:name" of the processes of ``groups`` still alive after up to ``timeout`` s (their
    exit takes a moment after the command's)."""
    deadline = time.monotonic() + timeout
    while alive_in(groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = []
    for p in alive_in(groups):
        try:
            left.append(f"{p.pid}:{p.name()}")
        except psutil.NoSuchProcess:
            continue
    return left


class GroupWatch:
    """The process groups of ``pid``'s tree (``process_groups``), gathered every 0.1 s from now
    until ``pid`` exits, so groups created late (Ray starting as a signal arrives) are known
    too. ``groups`` once the process has exited: every group it ever had below it."""

    def __init__(self, pid: int) -> None:
        import threading

        self.pid, self.groups = pid, {pid}
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while True:
            try:
                if psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE:
                    return
            except psutil.NoSuchProcess:
                return
            self.groups |= process_groups(self.pid)
            time.sleep(0.1)

    def left(self, timeout: float = 5.0) -> list[str]:
        """Processes of the watched groups still alive (the watched process must have exited)."""
        self._thread.join(10)
        return left_after(self.groups, timeout)


def kill_groups(groups: set[int]) -> None:
    """SIGKILL to every group, never to the caller's own."""
    for pgid in groups - {os.getpgid(0)}:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@contextlib.contextmanager
def busy_cpus(count: int = 2) -> Iterator[None]:
    """``count`` processes spinning a core each while the block runs: a shared CI machine."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait(30)


class ServerProcess:
    """``packfeed serve ARGS`` in a child process with its own embedded Ray.

    ``start()`` waits for the "listening on" line; ``port`` stays the same across restarts
    (the first start picks a free one), so clients reconnect to the same target.
    """

    def __init__(self, args: list[str], *, log: Path, state_dir: Path, host: str = "127.0.0.1", env: dict | None = None):
        self.args, self.log, self.host = list(args), Path(log), host
        self.state_dir = Path(state_dir)
        self.env = {**os.environ, **(env or {})}
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "packfeed.service.cli", "serve", *self.args,
            "--host", self.host, "--port", str(self.port), "--state-dir", str(self.state_dir),
        ]

    def start(self, timeout: float = 180.0) -> "ServerProcess":
        self.starts += 1
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            # Own process group: kill() takes the embedded Ray's processes down with the server
            # (Ray's agents outlive a SIGKILLed driver otherwise), as a crashed container would.
            self.proc = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=REPO, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_bytes()[offset:].decode(errors="replace")
            match = LISTENING.search(text)
            if match:
                line = READY_LINE.search(text)
                if line is None and "\n" in text[match.end():]:
                    raise AssertionError(f"the readiness line is not a line of its own:\n{text[-2000:]}")
                if line is not None:
                    self.port = int(line.group(2))
                    return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"packfeed serve exited with {self.proc.returncode}:\n{text[-4000:]}")
            time.sleep(0.2)
        self.kill()
        raise TimeoutError(f"packfeed serve did not start in {timeout}s:\n{self.tail()}")

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL to the server and its embedded Ray: no drain, no goodbye."""
        if self.proc is not None:
            kill_groups(process_groups(self.proc.pid) | {self.proc.pid})
            self.proc.wait(30)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait: the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.terminate(60)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # whatever is left of the process group
