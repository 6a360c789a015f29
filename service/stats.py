"""Accounting of a packing run: every sample is delivered exactly once or reported.

Per window the worker produces a ``WindowStats``; the driver merges them. The invariant
``samples_read == samples_packed + sum(skipped) + dropped`` holds for every window and so for
the total (``check_accounting``): a sample that is neither packed nor reported is a bug.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

MAX_SKIP_EXAMPLES = 5


@dataclass
class WindowStats:
    samples_read: int = 0  # rows of the inputs covered, skipped ones included
    samples_packed: int = 0  # samples delivered (a truncated or split sample counts once)
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    skip_examples: list[dict[str, Any]] = field(default_factory=list)  # first few, in order
    truncated: int = 0
    split: int = 0
    dropped: int = 0
    rows: int = 0
    tokens: int = 0  # real (non-padding) tokens in rows
    trained_tokens: int = 0  # labels != IGNORE_INDEX
    windows: int = 0
    tokenizer_backends: Counter = field(default_factory=Counter)  # back-end -> windows it tokenized
    tokenizer_checks: list[dict[str, Any]] = field(default_factory=list)  # per actor: its choice, and why

    def merge(self, other: "WindowStats") -> None:
        for f in dataclasses.fields(self):
            if f.name == "skipped":
                self.skipped.update(other.skipped)
            elif f.name == "skip_examples":
                room = MAX_SKIP_EXAMPLES - len(self.skip_examples)
                self.skip_examples.extend(other.skip_examples[: max(room, 0)])
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def note_tokenizer(self, tokenizer: Any) -> None:
        """Count this window under the back-end that tokenized it (``SampleTokenizer.backend``);
        the first window of each actor also carries the actor's choice and its checks."""
        self.tokenizer_backends[tokenizer.backend] += 1
        report = tokenizer.take_backend_report()
        if report is not None:
            self.tokenizer_checks.append(report)

    def check_accounting(self) -> None:
        accounted = self.samples_packed + sum(self.skipped.values()) + self.dropped
        if accounted != self.samples_read:
            raise RuntimeError(
                f"accounting error: read {self.samples_read} samples but packed "
                f"{self.samples_packed}, skipped {sum(self.skipped.values())}, dropped {self.dropped}"
            )

    def to_dict(self, *, seq_len: int, seconds: float) -> dict[str, Any]:
        capacity = self.rows * seq_len
        return {
            "samples_read": self.samples_read,
            "samples_packed": self.samples_packed,
            "skipped": dict(sorted(self.skipped.items())),
            "skipped_total": sum(self.skipped.values()),
            "skip_examples": self.skip_examples,
            "truncated": self.truncated,
            "split": self.split,
            "dropped": self.dropped,
            "rows": self.rows,
            "tokens": self.tokens,
            "trained_tokens": self.trained_tokens,
            "bound_rows": -(-self.tokens // seq_len),
            "efficiency": self.tokens / capacity if capacity else 0.0,
            "windows": self.windows,
            "seq_len": seq_len,
            "seconds": round(seconds, 3),
            "tokens_per_second": self.tokens / seconds if seconds > 0 else 0.0,
            "tokenizer_backend": {"windows": dict(sorted(self.tokenizer_backends.items())),
                                  "checks": self.tokenizer_checks},  # fmt: skip
        }


def format_summary(stats: dict[str, Any]) -> str:
    """The end-of-run table printed by ``packfeed pack``."""
    lines = [
        ("samples read", f"{stats['samples_read']:,}"),
        ("samples packed", f"{stats['samples_packed']:,}"),
        ("skipped", f"{stats['skipped_total']:,}"),
    ]
    lines += [(f"  {reason}", f"{n:,}") for reason, n in stats["skipped"].items()]
    lines += [
        ("truncated / split / dropped", f"{stats['truncated']:,} / {stats['split']:,} / {stats['dropped']:,}"),
        ("rows (bound)", f"{stats['rows']:,} ({stats['bound_rows']:,})"),
        ("tokens (trained)", f"{stats['tokens']:,} ({stats['trained_tokens']:,})"),
        ("efficiency", f"{100 * stats['efficiency']:.2f}%"),
        ("seconds", f"{stats['seconds']:.2f}"),
        ("tokens/s", f"{stats['tokens_per_second']:,.0f}"),
    ]
    windows = stats.get("tokenizer_backend", {}).get("windows")
    if windows:
        lines.append(("tokenizer back-end", ", ".join(f"{name} ({n:,} windows)" for name, n in windows.items())))
    width = max(len(k) for k, _ in lines)
    out = [f"{k:<{width}}  {v}" for k, v in lines]
    for ex in stats["skip_examples"]:
        out.append(f"skipped: {ex['source']} row {ex['row']} (sample {ex['sample_id']}): {ex['reason']}: {ex['detail']}")
    return "\n".join(out)
