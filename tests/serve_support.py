"""Real ``packfeed serve`` processes on 127.0.0.1 for the integration tests and benchmarks."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = sorted(str(p) for p in (REPO / "service" / "assets" / "corpus").glob("*.jsonl"))
TOKENIZER = str(REPO / "service" / "assets" / "tokenizer")
DEMO_SAMPLES = 7_500  # samples in the bundled corpus; none is skipped at these settings
LISTENING = re.compile(r"packfeed serve: listening on (\S+):(\d+)")
# Tools grep the readiness line: it must be whole, on a line of its own.
READY_LINE = re.compile(r"(?m)^packfeed serve: listening on (\S+):(\d+) [^\n]*\n")


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
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
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
