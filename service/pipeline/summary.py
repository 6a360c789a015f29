"""A run's stats.json as people read it: the printed report, an older file upgraded, the verdict.

``format_summary`` is the end-of-run table of ``packfeed pack`` (and of ``packfeed inspect``
and the serve/train reports): totals, the rows of each epoch, time and rates, the start-up by
phase, then the sources table (``format_sources``) and the first skips. ``upgrade_stats``
reads a stats.json an older packfeed wrote as this one writes it; ``run_failure`` says why a
finished run must not count as a success. They read the dict only (``RunStats.to_dict`` plus
the driver's figures, pack_report.py), never the accounting objects of stats.py.
"""

from __future__ import annotations

from typing import Any

from packfeed.service.inputs.records import Skip


def format_summary(stats: dict[str, Any]) -> str:
    """The end-of-run table printed by ``packfeed pack``, ``packfeed inspect`` and the
    serve/train reports: totals, the rows of each epoch, time and rate, then the sources table
    (see ``format_sources``) and the first skips."""
    lines = [
        ("samples read", f"{stats['samples_read']:,}"),
        ("samples packed", f"{stats['samples_packed']:,}"),
        ("skipped", f"{stats['skipped_total']:,}"),
    ]
    lines += [(f"  {reason}", f"{n:,}") for reason, n in stats["skipped"].items()]
    lines += [
        ("truncated / split / dropped", f"{stats['truncated']:,} / {stats['split']:,} / {stats['dropped']:,}"),
    ]
    if stats.get("pairs"):  # counted among the samples above too
        p = stats["pairs"]
        lines.append(("preference pairs read / packed", f"{p['read']:,} / {p['packed']:,}"))
        lines.append(("  pairs truncated / dropped", f"{p['truncated']:,} / {p['dropped']:,}"))
    lines += [
        ("rows (bound)", f"{stats['rows']:,} ({stats['bound_rows']:,})"),
    ]
    epoch_rows = stats.get("epoch_rows") or []
    if len(epoch_rows) > 1:
        lines.append(("rows per epoch", ", ".join(f"{n:,} (epoch {e})" for e, n in enumerate(epoch_rows, 1))))
    lines += [
        ("tokens (trained)", f"{stats['tokens']:,} ({stats['trained_tokens']:,})"),
        ("efficiency", f"{100 * stats['efficiency']:.2f}%"),
    ]
    if "seconds" in stats:  # a stream's report has no meaningful time
        lines += _time_lines(stats)
    if stats.get("startup_seconds"):  # pipeline/startup.py: the phases that add up to first_row_seconds
        lines.append(("start-up by phase", ", ".join(f"{name.removesuffix('_s').replace('_', ' ')} {s:.2f}"
                                                     for name, s in stats["startup_seconds"].items() if s >= 0.005)))
    windows = stats.get("tokenizer_backend", {}).get("windows")
    if windows:
        lines.append(("tokenizer back-end", ", ".join(f"{name} ({n:,} windows)" for name, n in windows.items())))
    io = stats.get("storage") or {}
    if io.get("requests"):  # inputs on an object store
        ratio = f" ({io['read_ratio']:.2f} x the inputs)" if io.get("input_bytes") else ""
        slowed = (f"; {io['throttled']:,} throttled, {io.get('backoff_ms', 0) / 1000:,.1f} s backing off"
                  if io.get("throttled") else "")
        lines.append(("object storage", f"{io['requests']:,} requests ({io['retries']:,} retried, {io['failures']:,} "
                                        f"failed{slowed}), {io['bytes_read'] / 2**20:,.1f} MiB read{ratio}"))
    width = max(len(k) for k, _ in lines)
    out = [f"{k:<{width}}  {v}" for k, v in lines]
    sources = stats.get("sources", [])
    if len(sources) > 1 or any(len(s["epochs"]) > 1 or s.get("stages") for s in sources):
        out.append(format_sources(sources))
    for ex in stats["skip_examples"]:
        out.append(f"skipped: {Skip(**ex).describe()}")
    return "\n".join(out)


def _time_lines(stats: dict[str, Any]) -> list[tuple[str, str]]:
    """Time and rate, the steady rate first: a short run is mostly start-up (2.8M tokens in 11 s,
    the first row at 10.5 s: the overall rate says little about packing)."""
    seconds, overall = stats["seconds"], stats["tokens_per_second"]
    if "first_row_seconds" not in stats:  # a stats.json without the start-up (an older packfeed)
        return [("seconds", f"{seconds:.2f}"), ("tokens/s", f"{overall:,.0f}")]
    ray = ""
    if "ray_init_seconds" in stats:  # None: no Ray started (the driver packed every window)
        ray = ", no Ray" if stats["ray_init_seconds"] is None else f", Ray start {stats['ray_init_seconds']:.2f}"
    steady = stats.get("steady_tokens_per_second")
    why = ("the driver packed every window: no actors' steady rate" if stats.get("driver_windows") == stats.get("windows")
           else "the actors packed one window: no steady rate")
    rate = (f"{steady:,.0f} steady, after the actors' first window ({overall:,.0f} overall, start-up included)"
            if steady else f"{overall:,.0f} overall, start-up included ({why})")
    lines = [("seconds", f"{seconds:.2f} (start-up: first row at {stats['first_row_seconds']:.2f}{ray})"),
             ("tokens/s", rate)]
    if stats.get("core_tokens_per_second"):
        cpu = stats.get("cpu_tokens_per_second")
        cpu = f"; {cpu:,.0f} per CPU-second used" if cpu else ""
        lines.append(("per packing core", f"{stats['core_tokens_per_second']:,.0f} tokens/s while packing{cpu} "
                      "(the actors' windows after their first, read to written)"))
    return lines


def format_sources(sources: list[dict[str, Any]]) -> str:
    """Per source: samples read, packed, skipped, dropped, tokens, and its share of the mixture:
    planned, realised in samples packed, realised in tokens. The two realised shares can be far
    apart (the bundled stories, long texts: 20% of the samples, 43% of the tokens); the planned
    share is in samples. With several epochs, each source's total (epoch ``all``) is followed by
    a line per epoch, numbered from 1, and with a mixture schedule by a line per stage
    (``stage 0``: the config's weights; ``stage i``: from schedule entry i on). An epoch's or a
    stage's line has its own planned share: what the weights in force there gave it (a paused
    source: 0%); the ``all`` line, the run's (under a schedule, its stages together)."""
    per_epoch = any(len(s["epochs"]) > 1 for s in sources)
    several = per_epoch or any(s.get("stages") for s in sources)
    all_tokens = sum(s["tokens"] for s in sources)
    header = ("source", "epoch", "read", "packed", "skipped", "dropped", "tokens", "planned share", "sample share",
              "token share")  # fmt: skip
    rows = [header]
    for s in sources:
        token_share = s.get("realised_token_share", s["tokens"] / all_tokens if all_tokens else 0.0)
        rows.append(_source_line(s["name"], "all", s, s["skipped_total"], s["planned_share"], s["realised_share"],
                                 token_share))
        for e in s["epochs"] if per_epoch else ():
            rows.append(_source_line(s["name"], str(e["epoch"]), e, e["skipped"], _planned(e, sources, "epochs", "epoch"),
                                     e["share_samples"], e["share_tokens"]))
        for st in s.get("stages", ()):
            rows.append(_source_line(s["name"], f"stage {st['stage']}", st, st["skipped"],
                                     _planned(st, sources, "stages", "stage"), st["share_samples"], st["share_tokens"]))
    left = 2 if several else 1  # names (and epochs) to the left, numbers to the right
    if not several:
        rows = [r[:1] + r[2:] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def _planned(entry: dict[str, Any], sources: list[dict[str, Any]], scope: str, key: str) -> float:
    """The planned share of one epoch's or stage's line: its own (stats.py ``_share_entry``), or for a
    stats.json written before it had one, the source's share of the samples read there (all
    sources' lines of that epoch or stage)."""
    if "planned_share" in entry:
        return entry["planned_share"]
    read = sum(other["samples_read"] for s in sources for other in s.get(scope) or () if other[key] == entry[key])
    return entry["samples_read"] / read if read else 0.0


def _source_line(name: str, epoch: str, c: dict[str, Any], skipped: int, planned: float, samples: float,
                 tokens: float) -> tuple[str, ...]:
    """One line of the sources table: ``c`` is a source's totals or one of its epochs."""
    return (name, epoch, f"{c['samples_read']:,}", f"{c['samples_packed']:,}", f"{skipped:,}", f"{c['dropped']:,}",
            f"{c['tokens']:,}", f"{100 * planned:.2f}%", f"{100 * samples:.2f}%", f"{100 * tokens:.2f}%")


def upgrade_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """A stats.json as this packfeed writes it: one written before epochs were numbered from 1
    has a first epoch 0 (no epoch is 0 now), and gets every epoch renumbered; one of a schedule
    written before its stage lines had their own planned share gave every source the config's
    share over the run too, and gets the run's (its share of the samples read: every planned
    sample is read once). Its epoch and stage lines are the formatter's (``_planned``)."""
    sources = stats.get("sources") or []
    if any(s.get("stages") and "planned_share" not in s["stages"][0] for s in sources):
        read = sum(s["samples_read"] for s in sources)
        sources = [{**s, "planned_share": s["samples_read"] / read if read else 0.0} for s in sources]
        stats = {**stats, "sources": sources}
    if not any(s.get("epochs") and s["epochs"][0].get("epoch") == 0 for s in sources):
        return stats
    renumbered = [{**s, "epochs": [{**e, "epoch": e["epoch"] + 1} for e in s["epochs"]]} for s in sources]
    return {**stats, "sources": renumbered}


def run_failure(stats: dict, max_skip_fraction: float | None) -> str | None:
    """Why a finished run (``RunStats.to_dict``) must not count as a success, or None."""
    read, packed = stats["samples_read"], stats["samples_packed"]
    reasons = ", ".join(f"{k} {v:,}" for k, v in stats["skipped"].items())
    if packed == 0:
        return f"nothing was packed: {read:,} samples read, all skipped or dropped ({reasons or 'dropped'})"
    empty = [s["name"] for s in stats.get("sources", []) if s["samples_read"] and not s["samples_packed"]]
    if empty:
        return f"source(s) {empty} delivered no sample: every row was bad (see the report): fix or remove them"
    if max_skip_fraction is not None and read and stats["skipped_total"] / read > max_skip_fraction:
        return (f"{stats['skipped_total']:,} of {read:,} samples were skipped ({stats['skipped_total'] / read:.1%}), more than "
                f"--max-skip-fraction {max_skip_fraction:g} ({reasons})")
    return None
