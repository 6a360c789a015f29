"""A look at the first rows of every input before Ray starts: formats, and sources that are bad.

``probe(plan)`` reads the first ``rows_per_file`` rows of each file of each source (at most
``max_files`` files per source) with the same readers and validation as a packing window, and
returns what it saw per file: the formats detected (``messages``, ``prompt_completion``,
``text``) and the skip reasons. A source none of whose probed rows is a valid sample is a
``ValueError`` naming the source, the reasons and what the rows hold (e.g. ``--format
messages`` on a file of ``text`` rows), so a run that would pack nothing fails in a second, not
after the whole corpus. ``probe(plan, tokenizer)`` also renders the conversations among those
rows with the tokenizer's chat template, as the packing actors would: a tokenizer without one,
or one whose assistant turns cannot be located, is one line naming the source and the row
before Ray starts, not an actor's traceback. Cost: a few rows per file.

``check_inputs(plan, tokenizer)`` is what pack, serve and train run before Ray: the probe, its
description logged, and the tokenizer's back-end choice said.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from packfeed.service.data.plan import SourcePlan, StreamPlan, file_pieces
from packfeed.service.inputs.records import record_format
from packfeed.service.inputs.read import WindowSpec, read_window

logger = logging.getLogger("packfeed")


@dataclass
class FileProbe:
    path: str
    rows: int  # rows of the file
    probed: int
    formats: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    example: str = ""  # the first skip, described

    def describe(self) -> str:
        seen = ", ".join(f"{k} {v}" for k, v in self.formats.most_common()) or "no valid sample"
        bad = f"; bad: {', '.join(f'{k} {v}' for k, v in self.skipped.most_common())}" if self.skipped else ""
        return f"{self.path}: {self.rows:,} rows; first {self.probed}: {seen}{bad}"


def check_inputs(plan: StreamPlan, tokenizer: Any) -> None:
    """Before Ray starts: probe the first rows of every input with ``tokenizer`` (the driver's
    ``SampleTokenizer``: the chat template is checked on the conversations among them), log
    what each source holds, and say now a fast back-end that ``auto`` refused at load. Raises
    the probe's ValueError for a source that would pack nothing."""
    for line in describe(probe(plan, tokenizer), plan):
        logger.info(line)
    tokenizer.check_backend()


def probe(plan: StreamPlan, tokenizer: Any = None, *, rows_per_file: int = 20,
          max_files: int = 32) -> dict[str, list[FileProbe]]:
    """Source name -> what the first rows of its files hold. Raises ValueError for a source
    with no valid sample among its probed rows; with ``tokenizer`` (the driver's
    ``SampleTokenizer``), also for conversational rows its chat template cannot render as
    packing would (none, or one that cannot locate assistant turns), naming the source and row."""
    out: dict[str, list[FileProbe]] = {}
    for s in plan.sources:
        reports = []
        for f, scan in enumerate(s.files[:max_files]):
            start = int(s.file_starts[f])
            n = min(rows_per_file, scan.num_rows)
            raw = read_window(WindowSpec(index=-1, epoch=0, pieces=tuple(file_pieces(s, start, start + n))))
            report = FileProbe(scan.path, scan.num_rows, n)
            report.formats.update(record_format(r) for r in raw.records)
            report.skipped.update(skip.reason for skip in raw.skips)
            if raw.skips:
                report.example = raw.skips[0].describe()
            if tokenizer is not None:
                try:
                    tokenizer.check_chat_template(raw, loss=s.loss)
                except ValueError as e:  # ChatTemplateError
                    raise ValueError(f"source {s.name!r}: {e}") from None
            reports.append(report)
        out[s.name] = reports
        if not any(r.formats for r in reports):
            raise ValueError(_bad_source_message(s, reports))
    return out


def _bad_source_message(s, reports: list[FileProbe]) -> str:
    reasons = Counter()
    for r in reports:
        reasons.update(r.skipped)
    probed = sum(r.probed for r in reports)
    hint = ""
    if s.format != "auto":
        auto = _auto_formats(s, reports)
        if auto:
            hint = f"; read with format auto these rows are {', '.join(sorted(auto))}: drop --format (or the source's format)"
    elif any(r.path.endswith(".json") for r in reports) and reasons.get("malformed_json"):
        hint = "; a .json input must hold JSON Lines (one object per line), not one JSON document"
    example = next((r.example for r in reports if r.example), "")
    return (
        f"source {s.name!r}: none of the first {probed} rows of its files is a valid "
        f"{s.format if s.format != 'auto' else 'sample'} ({', '.join(f'{k} {v}' for k, v in reasons.most_common())}; "
        f"e.g. {example}){hint}"
    )


def _auto_formats(s, reports: list[FileProbe]) -> set[str]:
    """Formats the probed rows would have with format auto (for the hint)."""
    auto: SourcePlan = replace(s, format="auto")
    found: set[str] = set()
    for f, report in enumerate(reports):
        start = int(auto.file_starts[f])
        pieces = file_pieces(auto, start, start + report.probed)
        raw = read_window(WindowSpec(index=-1, epoch=0, pieces=tuple(pieces)))
        found.update(record_format(r) for r in raw.records)
    return found


def describe(reports: dict[str, list[FileProbe]], plan: StreamPlan, *, max_lines: int = 12) -> list[str]:
    """Lines for the user: every source, its share, and what its files hold; then each
    schedule entry and the window it takes effect at."""
    lines = []
    total = max(plan.samples_per_epoch, 1)
    for s in plan.sources:
        lines.append(
            f"source {s.name!r}: {len(s.files)} file(s), {s.num_rows:,} rows, {s.samples_per_epoch:,} samples per epoch "
            f"({100 * s.samples_per_epoch / total:.1f}% of the mixture)"
        )
        files = reports.get(s.name, [])
        lines += [f"  {r.describe()}" for r in files[:max_lines]]
        if len(s.files) > max_lines:
            lines.append(f"  ... and {len(s.files) - max_lines} more file(s)")
    for stage in plan.stage_summary()[1:]:  # a schedule: where each entry takes effect
        weights = ", ".join(f"{name} {w:g}" for name, w in stage["weights"].items())
        where = (f"window {stage['window']:,} (sample {stage['start_sample']:,})" if stage["window"] < plan.num_windows
                 else "never (past the end of the stream)")
        lines.append(f"schedule from sample {stage['from_sample']:,}: weights {weights}; takes effect at {where}")
    return lines
