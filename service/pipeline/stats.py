"""Accounting of a packing run: every sample is delivered exactly once or reported.

Each window produces a ``WindowStats``: ``Counts`` per source (samples read, packed, skipped by
reason, truncated/split/dropped, tokens, formats seen) and the first few skips. They travel
with the window's rows (a JSON cell of the Arrow block, see pipeline.py), so no actor holds
them and a lost actor cannot lose them. The driver folds them into ``RunStats``, by (epoch,
source). ``samples_read == samples_packed + skipped + dropped`` holds for every window, source
and epoch (``check_accounting``): a sample neither packed nor reported is a bug.

Epochs are numbered from 0 inside (the plan, ``WindowStats.epoch``) and from 1 wherever a user
reads them: stats.json, the printed report, accounting errors. ``upgrade_stats`` renumbers a
stats.json written before that (its epochs start at 0).

What people read of it (the printed report, an older stats.json upgraded, a run's verdict) is
summary.py, from the stats.json dict alone.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from packfeed.service.inputs.records import Skip
from packfeed.service.pipeline.summary import format_summary, run_failure, upgrade_stats  # noqa: F401  (moved)
from packfeed.service.storage import StorageCounts, is_remote
from packfeed.service.tokenize.fast.backend import log_choices

MAX_SKIP_EXAMPLES = 5
_INT_FIELDS = ("samples_read", "samples_packed", "truncated", "split", "dropped", "tokens", "trained_tokens")
PAIR_COUNTS = ("read", "packed", "truncated", "dropped")  # Counts.pairs: preference pairs, as the samples


@dataclass
class Counts:
    """Samples of one source (in one window, epoch or run) and what became of them."""

    samples_read: int = 0  # rows covered, bad ones included; a repeated sample counts each time
    samples_packed: int = 0  # delivered (a truncated or split sample counts once)
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    truncated: int = 0
    split: int = 0
    dropped: int = 0
    tokens: int = 0  # real (non-padding) tokens in rows
    trained_tokens: int = 0  # labels != IGNORE_INDEX
    formats: Counter = field(default_factory=Counter)  # detected format -> good records read
    # Preference pairs among the above: "read" (good records), "packed", "truncated", "dropped".
    # Empty without pairs, and then left out of to_dict (stats.json stays as it was).
    pairs: Counter = field(default_factory=Counter)

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def merge(self, other: "Counts") -> None:
        for name in _INT_FIELDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.skipped.update(other.skipped)
        self.formats.update(other.formats)
        self.pairs.update(other.pairs)

    def check(self, label: str) -> None:
        accounted = self.samples_packed + self.skipped_total + self.dropped
        if accounted != self.samples_read:
            raise RuntimeError(
                f"accounting error ({label}): read {self.samples_read} samples but packed {self.samples_packed}, "
                f"skipped {self.skipped_total}, dropped {self.dropped}"
            )

    def to_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in _INT_FIELDS}
        d["skipped"] = dict(sorted(self.skipped.items()))
        d["skipped_total"] = self.skipped_total
        d["formats"] = dict(sorted(self.formats.items()))
        if self.pairs:
            d["pairs"] = {k: self.pairs[k] for k in PAIR_COUNTS}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Counts":
        return cls(**{n: int(d[n]) for n in _INT_FIELDS}, skipped=Counter(d["skipped"]), formats=Counter(d["formats"]),
                   pairs=Counter(d.get("pairs", {})))


@dataclass
class WindowStats:
    """One window's accounting: its rows and ``Counts`` per source index."""

    window: int
    epoch: int
    rows: int = 0
    sources: dict[int, Counts] = field(default_factory=dict)
    skip_examples: list[Skip] = field(default_factory=list)  # the first few, by sample id
    tokenizer_backends: Counter = field(default_factory=Counter)  # back-end ("hf", "fast") -> windows
    tokenizer_checks: list[dict[str, Any]] = field(default_factory=list)  # an actor's choice and its proof
    storage: StorageCounts = field(default_factory=StorageCounts)  # its reads' requests to object stores

    def source(self, index: int) -> Counts:
        counts = self.sources.get(index)
        if counts is None:
            counts = self.sources[index] = Counts()
        return counts

    def note_tokenizer(self, tokenizer: Any) -> None:
        """Count this window under the back-end that tokenized it (``SampleTokenizer.backend``);
        the first window of each actor also carries the actor's choice and its checks."""
        self.tokenizer_backends[tokenizer.backend] += 1
        report = tokenizer.take_backend_report()
        if report is not None:
            self.tokenizer_checks.append(report)

    def check_accounting(self) -> None:
        for index, counts in self.sources.items():
            counts.check(f"window {self.window}, source {index}")

    def to_json(self) -> str:
        return json.dumps({
            "window": self.window, "epoch": self.epoch, "rows": self.rows,
            "sources": {str(i): c.to_dict() for i, c in self.sources.items()},
            "skip_examples": [dataclasses.asdict(s) for s in self.skip_examples],
            "tokenizer_backends": self.tokenizer_backends, "tokenizer_checks": self.tokenizer_checks,
            "storage": self.storage.as_dict(),
        })  # fmt: skip

    @classmethod
    def from_json(cls, text: str | bytes) -> "WindowStats":
        d = json.loads(text)
        return cls(
            window=d["window"], epoch=d["epoch"], rows=d["rows"],
            sources={int(i): Counts.from_dict(c) for i, c in d["sources"].items()},
            skip_examples=[Skip(**s) for s in d["skip_examples"]],
            tokenizer_backends=Counter(d["tokenizer_backends"]), tokenizer_checks=d["tokenizer_checks"],
            storage=StorageCounts(**d.get("storage", {})),
        )  # fmt: skip


class RunStats:
    """Totals over the windows seen so far, by (epoch, source). A window packed again (a
    restarted reader) counts once: its stats are the same, it is one window of the stream."""

    def __init__(self, source_names: Sequence[str], planned: Sequence[int], *,
                 storage: StorageCounts | None = None, planned_run: Sequence[int] | None = None,
                 stage_of: Callable[[int], int] | None = None, input_bytes: int = 0) -> None:
        self.names, self.planned = list(source_names), [int(p) for p in planned]
        # With a mixture schedule: each source's samples over the run (not planned x epochs), and
        # the schedule stage of a window (plan.stage_of), for the shares of each stage.
        self.planned_run = None if planned_run is None else [int(p) for p in planned_run]
        self.stage_of = stage_of
        self.by_stage: dict[int, dict[int, Counts]] = {}
        # Requests to object stores: the plan's (``storage``: listing and scan), then each window's reads.
        self.storage = storage or StorageCounts()
        self.input_bytes = input_bytes  # the bytes of the inputs on object stores (0: none there)
        self.by_epoch: dict[int, dict[int, Counts]] = {}
        self.rows = 0
        self.seen: set[int] = set()
        self.skip_examples: list[Skip] = []
        self.tokenizer_backends: Counter = Counter()
        self.tokenizer_checks: list[dict[str, Any]] = []
        # The reader, the serve catch-up path and a metrics scrape use one RunStats from
        # their own threads: a window is counted once and read whole.
        self._lock = threading.RLock()

    @property
    def windows(self) -> int:
        return len(self.seen)

    def add(self, ws: WindowStats) -> None:
        with self._lock:
            self._add(ws)

    def _add(self, ws: WindowStats) -> None:
        if ws.window in self.seen:
            return
        self.seen.add(ws.window)
        epoch = self.by_epoch.setdefault(ws.epoch, {})
        for index, counts in ws.sources.items():
            epoch.setdefault(index, Counts()).merge(counts)
        if self.stage_of is not None:
            stage = self.by_stage.setdefault(self.stage_of(ws.window), {})
            for index, counts in ws.sources.items():
                stage.setdefault(index, Counts()).merge(counts)
        self.rows += ws.rows
        self.tokenizer_backends.update(ws.tokenizer_backends)
        self.tokenizer_checks.extend(ws.tokenizer_checks)
        self.storage = self.storage + ws.storage
        examples = sorted(self.skip_examples + ws.skip_examples, key=lambda s: (s.sample_id, s.row))
        self.skip_examples = examples[:MAX_SKIP_EXAMPLES]

    def source_total(self, index: int) -> Counts:
        total = Counts()
        with self._lock:
            for epoch in self.by_epoch.values():
                if index in epoch:
                    total.merge(epoch[index])
        return total

    def stage_counts(self, index: int) -> list[tuple[int, Counts]]:
        """(stage, counts) of source ``index`` per mixture schedule stage seen so far (none without a schedule)."""
        with self._lock:
            return [(stage, sources[index]) for stage, sources in sorted(self.by_stage.items()) if index in sources]

    def total(self) -> Counts:
        total = Counts()
        with self._lock:
            for index in range(len(self.names)):
                total.merge(self.source_total(index))
        return total

    def check_accounting(self) -> None:
        with self._lock:
            for e, sources in self.by_epoch.items():
                for index, counts in sources.items():
                    counts.check(f"epoch {e + 1}, source {self.names[index]!r}")

    def check_complete(self, num_windows: int, epochs: int) -> None:
        """Every window of the run arrived and every planned sample was read: RuntimeError
        otherwise (a window the pipeline lost would otherwise pass unnoticed)."""
        with self._lock:
            if self.windows != num_windows:
                raise RuntimeError(f"accounting error: {self.windows} of {num_windows} windows arrived")
            for index, name in enumerate(self.names):
                read = self.source_total(index).samples_read
                planned = self.planned_run[index] if self.planned_run is not None else self.planned[index] * epochs
                if read != planned:
                    raise RuntimeError(f"accounting error: source {name!r} read {read} samples, planned {planned}")

    def empty_sources(self) -> list[str]:
        """Sources that were read but delivered no sample (all their rows were bad)."""
        return [self.names[i] for i in range(len(self.names))
                if self.source_total(i).samples_read and not self.source_total(i).samples_packed]

    def to_dict(self, *, seq_len: int, seconds: float) -> dict[str, Any]:
        """The stats.json of a run: totals first, then a ``sources`` table (per epoch too)."""
        with self._lock:
            return self._to_dict(seq_len=seq_len, seconds=seconds)

    def _to_dict(self, *, seq_len: int, seconds: float) -> dict[str, Any]:
        total = self.total()
        capacity = self.rows * seq_len
        out = total.to_dict()
        out.update({
            "skip_examples": [dataclasses.asdict(s) for s in self.skip_examples],
            "rows": self.rows,
            "bound_rows": -(-total.tokens // seq_len),
            "efficiency": total.tokens / capacity if capacity else 0.0,
            "windows": self.windows,
            "seq_len": seq_len,
            "seconds": round(seconds, 3),
            "tokens_per_second": total.tokens / seconds if seconds > 0 else 0.0,
            "sources": [self._source_dict(i) for i in range(len(self.names))],
            "tokenizer_backend": {"windows": dict(sorted(self.tokenizer_backends.items())),
                                  "checks": self.tokenizer_checks},
            "storage": self._storage_dict(),
        })  # fmt: skip
        return out

    def _storage_dict(self) -> dict[str, Any]:
        """Requests and bytes of the plan and the windows; with inputs on a store, their bytes
        (``input_bytes``) and ``read_ratio``: bytes read / input bytes (1.0: each byte read once)."""
        out: dict[str, Any] = {k: v for k, v in self.storage.as_dict().items() if k != "bytes_written"}
        if self.input_bytes:
            out["input_bytes"] = self.input_bytes
            out["read_ratio"] = round(self.storage.bytes_read / self.input_bytes, 4)
        return out

    def _source_dict(self, index: int) -> dict[str, Any]:
        total = self.source_total(index)
        d = {"name": self.names[index], "planned_samples_per_epoch": self.planned[index], **total.to_dict()}
        d["usable"] = total.samples_read - total.skipped_total
        epochs = [_share_entry({"epoch": e + 1}, self.by_epoch[e], index) for e in sorted(self.by_epoch)]
        # the plan's share: the config's weights, or under a schedule the run's (its stages' mix)
        planned = self.planned if self.planned_run is None else self.planned_run
        d["planned_share"] = planned[index] / sum(planned) if sum(planned) else 0.0
        packed = sum(self.source_total(i).samples_packed for i in range(len(self.names)))
        tokens = sum(self.source_total(i).tokens for i in range(len(self.names)))
        d["realised_share"] = total.samples_packed / packed if packed else 0.0  # of the samples packed
        d["realised_token_share"] = total.tokens / tokens if tokens else 0.0  # of the tokens in rows
        d["epochs"] = epochs
        if self.by_stage:  # a schedule: each stage's samples and shares (stage 0: the config's weights)
            d["stages"] = [_share_entry({"stage": st}, self.by_stage[st], index) for st in sorted(self.by_stage)]
        return d


def _share_entry(head: dict[str, Any], sources: dict[int, Counts], index: int) -> dict[str, Any]:
    """``head`` with source ``index``'s samples read and packed and tokens in ``sources`` (one
    epoch's or stage's counts), its planned share there, and its share of the samples packed
    and of the tokens there.

    The planned share is its share of the samples read there: every planned sample is read
    once (``check_complete``), and a window holds each source's share of the weights in force
    to within a sample, so a stage whose schedule entry says 0 / 1 / 3 reads 0 / 25 / 75% (not
    the config's weights: ``packfeed inspect`` showed 33.33% on every stage line)."""
    c = sources.get(index, Counts())
    all_read = sum(x.samples_read for x in sources.values())
    all_packed = sum(x.samples_packed for x in sources.values())
    all_tokens = sum(x.tokens for x in sources.values())
    return {**head, "samples_read": c.samples_read, "samples_packed": c.samples_packed, "skipped": c.skipped_total,
            "dropped": c.dropped, "tokens": c.tokens, "planned_share": c.samples_read / all_read if all_read else 0.0,
            "share_samples": c.samples_packed / all_packed if all_packed else 0.0,
            "share_tokens": c.tokens / all_tokens if all_tokens else 0.0}


def fold_window(run: RunStats, stats: WindowStats) -> None:
    """A window's accounting into the run's; the tokenizer back-end choices it brings that
    were not said yet, logged."""
    said = len(run.tokenizer_checks)
    run.add(stats)
    log_choices(run.tokenizer_checks, said)


def new_run_stats(plan: Any) -> RunStats:
    """The run's stats of ``plan`` (a StreamPlan), before any window."""
    scheduled = bool(getattr(plan, "schedule", ()))  # stats per schedule stage, totals over the run
    return RunStats([s.name for s in plan.sources], plan.counts, storage=getattr(plan, "scan_storage", None),
                    planned_run=plan.planned_samples() if scheduled else None,
                    stage_of=plan.stage_of if scheduled else None, input_bytes=remote_input_bytes(plan))


def remote_input_bytes(plan: Any) -> int:
    """The bytes of the plan's input files on object stores, each file once (local files: their
    reads are not counted, so they are left out of the ratio too)."""
    sizes = {f.path: f.size for s in plan.sources for f in s.files if f.size > 0 and is_remote(f.path)}
    return sum(sizes.values())
