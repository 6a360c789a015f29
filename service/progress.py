"""Progress of a long run: a tqdm bar on a terminal, a line every ``interval_s`` otherwise.

Logs, ``nohup`` and Ray jobs are not terminals, and a bar there prints nothing until the end
(tqdm disables itself), so packfeed writes a line instead::

    packfeed pack: 24,576/60,000 samples (41%), 6,233 rows, 1.2M tokens/s, efficiency 99.8%, ETA 0:00:41

``update`` is cheap (a clock read) and may be called after every block.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO


def format_eta(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def human(n: float) -> str:
    """1234 -> 1.2k, 1_234_567 -> 1.2M."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


class Progress:
    """Samples done out of ``total``, with rows, tokens and row fill so far."""

    def __init__(self, label: str, total: int, *, seq_len: int, interval_s: float = 10.0, stream: TextIO | None = None,
                 tty: bool | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.seq_len, self.interval_s = label, total, seq_len, interval_s
        self.stream = stream or sys.stderr
        self._clock = clock
        self._start = self._last = clock()
        self.samples = self.rows = self.tokens = 0
        tty = self.stream.isatty() if tty is None else tty
        self._bar = None
        if tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="samples", file=self.stream, desc=label)

    def update(self, *, samples: int, rows: int, tokens: int) -> None:
        """The totals so far (not increments)."""
        self.samples, self.rows, self.tokens = samples, rows, tokens
        if self._bar is not None:
            self._bar.update(samples - self._bar.n)
            self._bar.set_postfix(rows=rows, fill=f"{self.fill:.1%}")
            return
        now = self._clock()
        if now - self._last >= self.interval_s:
            self._last = now
            print(self.line(now), file=self.stream, flush=True)

    @property
    def fill(self) -> float:
        return self.tokens / (self.rows * self.seq_len) if self.rows else 0.0

    def line(self, now: float | None = None) -> str:
        elapsed = max((self._clock() if now is None else now) - self._start, 1e-9)
        rate = self.tokens / elapsed
        share = self.samples / self.total if self.total else 1.0
        eta = f", ETA {format_eta(elapsed * (1 - share) / share)}" if 0 < share < 1 else ""
        return (f"{self.label}: {self.samples:,}/{self.total:,} samples ({share:.0%}), {self.rows:,} rows, "
                f"{human(rate)} tokens/s, efficiency {self.fill:.1%}{eta}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.update(self.total - self._bar.n)
            self._bar.close()
