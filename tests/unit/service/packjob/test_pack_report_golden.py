"""Golden cases of ``packfeed pack``'s report, so a refactor of the driver proves itself: the
printed table of a fixed stats.json (``format_summary``, summary.py), the figures ``PackReport``
adds from stand-in window outputs on a stand-in clock, and the keys, in order, of the
stats.json a real small pack writes (the driver alone: no Ray). Expected values are written
out; a change to any of them is a change of what users read."""

from __future__ import annotations

import copy
import json
import types

import numpy as np
import pytest

from packfeed.service.assets import demo_corpus_paths, demo_tokenizer_path
from packfeed.service.data.config import DataConfig
from packfeed.service.cluster import raycluster
from packfeed.service.packjob import head_start, pack_report
from packfeed.service.packjob.head_start import DriverWindow
from packfeed.service.packjob.pack_report import PackReport
from packfeed.service.packjob.pack_run import run_pack
from packfeed.service.packjob.ray_beside import RayTimes
from packfeed.service.pipeline.startup import StartupClock
from packfeed.service.pipeline.stats import Counts, RunStats, WindowStats, new_run_stats
from packfeed.service.pipeline.summary import format_summary
from packfeed.service.storage import StorageCounts


def _source(name, read, packed, skipped, tokens, planned, share, token_share, epochs):
    return {"name": name, "planned_samples_per_epoch": read // 2, "samples_read": read, "samples_packed": packed,
            "truncated": 1, "split": 0, "dropped": 0, "tokens": tokens, "trained_tokens": tokens // 2,
            "skipped": {"malformed_json": skipped} if skipped else {}, "skipped_total": skipped, "formats": {"chat": packed},
            "usable": read - skipped, "planned_share": planned, "realised_share": share,
            "realised_token_share": token_share, "epochs": epochs}

def _epoch(e, read, packed, skipped, tokens, planned, share, token_share):
    return {"epoch": e, "samples_read": read, "samples_packed": packed, "skipped": skipped, "dropped": 0,
            "tokens": tokens, "planned_share": planned, "share_samples": share, "share_tokens": token_share}

STATS = {
    "samples_read": 1200, "samples_packed": 1197, "truncated": 2, "split": 0, "dropped": 0, "tokens": 301_234,
    "trained_tokens": 150_100, "pairs": {"read": 10, "packed": 9, "truncated": 1, "dropped": 1}, "skipped": {"malformed_json": 2, "too_long": 1}, "skipped_total": 3,
    "formats": {"chat": 700, "text": 497},
    "skip_examples": [{"sample_id": 17, "source": "data/chat.jsonl", "row": 17, "reason": "malformed_json",
                       "detail": "Expecting value", "line": 18}],
    "rows": 150, "bound_rows": 148, "efficiency": 0.98058, "windows": 6, "seq_len": 2048, "seconds": 12.345,
    "tokens_per_second": 24_401.3,
    "sources": [
        _source("chat", 800, 798, 2, 200_000, 0.6667, 0.6667, 0.664, [
            _epoch(1, 400, 399, 1, 100_000, 0.6667, 0.6667, 0.664), _epoch(2, 400, 399, 1, 100_000, 0.6667, 0.6667, 0.664)]),
        _source("stories", 400, 399, 1, 101_234, 0.3333, 0.3333, 0.336, [
            _epoch(1, 200, 200, 0, 50_617, 0.3333, 0.3339, 0.336), _epoch(2, 200, 199, 1, 50_617, 0.3333, 0.3328, 0.336)]),
    ],
    "tokenizer_backend": {"windows": {"fast": 5, "hf": 1}, "checks": []},
    "storage": {"requests": 12, "retries": 1, "failures": 0, "bytes_read": 3 * 2**20},
    "first_row_seconds": 3.21, "ray_to_first_row_seconds": 1.5,
    "startup_seconds": {"plan_s": 0.3, "tokenizer_load_s": 0.9, "probe_s": 0.2, "ray_start_s": 1.0, "pipeline_s": 0.004,
                        "actors_and_first_window_s": 0.806},
    "steady_tokens_per_second": 40_000.0, "core_tokens_per_second": 21_000.5, "cpu_tokens_per_second": 25_000.0,
    "ray_init_seconds": 1.0, "num_workers": 2, "driver_windows": 1, "epoch_rows": [75, 75],
}

# a run the driver packed alone: no Ray, no actors' rates, one source, one epoch's rows, no skip
ALONE = {**STATS, "ray_init_seconds": None, "ray_to_first_row_seconds": None, "steady_tokens_per_second": None,
         "core_tokens_per_second": None, "cpu_tokens_per_second": None, "num_workers": 0, "driver_windows": 6,
         "epoch_rows": [150], "storage": {"requests": 0, "retries": 0, "failures": 0, "bytes_read": 0},
         "sources": STATS["sources"][:1], "skip_examples": [], "skipped": {}, "skipped_total": 0, "pairs": {},
         "startup_seconds": {"plan_s": 0.3, "tokenizer_load_s": 0.9, "probe_s": 0.2, "driver_window_pack_s": 1.8,
                             "pipeline_s": 0.004, "first_window_write_s": 0.006}}

WITH_RAY = """\
samples read                    1,200
samples packed                  1,197
skipped                         3
  malformed_json                2
  too_long                      1
truncated / split / dropped     2 / 0 / 0
preference pairs read / packed  10 / 9
  pairs truncated / dropped     1 / 1
rows (bound)                    150 (148)
rows per epoch                  75 (epoch 1), 75 (epoch 2)
tokens (trained)                301,234 (150,100)
efficiency                      98.06%
seconds                         12.35 (start-up: first row at 3.21, Ray start 1.00)
tokens/s                        40,000 steady, after the actors' first window (24,401 overall, start-up included)
per packing core                21,000 tokens/s while packing; 25,000 per CPU-second used (the actors' windows after their first, read to written)
start-up by phase               plan 0.30, tokenizer load 0.90, probe 0.20, ray start 1.00, actors and first window 0.81
tokenizer back-end              fast (5 windows), hf (1 windows)
object storage                  12 requests (1 retried, 0 failed), 3.0 MiB read
source   epoch  read  packed  skipped  dropped   tokens  planned share  sample share  token share
chat     all     800     798        2        0  200,000         66.67%        66.67%       66.40%
chat     1       400     399        1        0  100,000         66.67%        66.67%       66.40%
chat     2       400     399        1        0  100,000         66.67%        66.67%       66.40%
stories  all     400     399        1        0  101,234         33.33%        33.33%       33.60%
stories  1       200     200        0        0   50,617         33.33%        33.39%       33.60%
stories  2       200     199        1        0   50,617         33.33%        33.28%       33.60%
skipped: data/chat.jsonl: row 17 (line 18), sample 17: malformed_json: Expecting value"""

ALONE_PRINTED = """\
samples read                 1,200
samples packed               1,197
skipped                      0
truncated / split / dropped  2 / 0 / 0
rows (bound)                 150 (148)
tokens (trained)             301,234 (150,100)
efficiency                   98.06%
seconds                      12.35 (start-up: first row at 3.21, no Ray)
tokens/s                     24,401 overall, start-up included (the driver packed every window: no actors' steady rate)
start-up by phase            plan 0.30, tokenizer load 0.90, probe 0.20, driver window pack 1.80, first window write 0.01
tokenizer back-end           fast (5 windows), hf (1 windows)
source  epoch  read  packed  skipped  dropped   tokens  planned share  sample share  token share
chat    all     800     798        2        0  200,000         66.67%        66.67%       66.40%
chat    1       400     399        1        0  100,000         66.67%        66.67%       66.40%
chat    2       400     399        1        0  100,000         66.67%        66.67%       66.40%"""


# inputs on a store whose size the plan knows: the bytes read against them
FROM_A_STORE = {**STATS, "storage": {**STATS["storage"], "input_bytes": 2 * 2**20, "read_ratio": 1.5}}
FROM_A_STORE_PRINTED = WITH_RAY.replace("3.0 MiB read\n", "3.0 MiB read (1.50 x the inputs)\n")


@pytest.mark.parametrize("stats, printed", [
    pytest.param(STATS, WITH_RAY, id="ray-actors-two-sources-two-epochs-skips-pairs-store"),
    pytest.param(ALONE, ALONE_PRINTED, id="the-driver-alone-no-ray"),
    pytest.param(FROM_A_STORE, FROM_A_STORE_PRINTED, id="inputs-on-a-store-bytes-read-over-input-bytes"),
])
def test_the_printed_report_of_a_fixed_stats_json(stats, printed):
    assert format_summary(copy.deepcopy(stats)) == printed


def test_stats_json_says_the_bytes_read_over_the_input_bytes_only_for_inputs_on_a_store():
    plan = types.SimpleNamespace(sources=[types.SimpleNamespace(name="a", files=[
        types.SimpleNamespace(path="s3://b/a.jsonl", size=600), types.SimpleNamespace(path="s3://b/b.parquet", size=200),
        types.SimpleNamespace(path="/local/c.jsonl", size=5_000)])], counts=[20], schedule=())
    total = new_run_stats(plan)
    total.add(WindowStats(window=0, epoch=0, storage=StorageCounts(requests=3, bytes_read=1_000)))
    assert total.to_dict(seq_len=8, seconds=1.0)["storage"] == {
        "requests": 3, "retries": 0, "failures": 0, "bytes_read": 1_000, "throttled": 0, "backoff_ms": 0,
        "input_bytes": 800, "read_ratio": 1.25}
    local = RunStats(["a"], [20])
    assert list(local.to_dict(seq_len=8, seconds=1.0)["storage"]) == [
        "requests", "retries", "failures", "bytes_read", "throttled", "backoff_ms"]


def window_stats(k: int, rows: int, tokens: int) -> WindowStats:
    return WindowStats(window=k, epoch=k // 2, rows=rows,
                       sources={0: Counts(samples_read=10, samples_packed=10, tokens=tokens, trained_tokens=tokens)})


def test_the_report_adds_the_drivers_and_the_actors_windows(monkeypatch):
    """4 windows of 10 samples, 2 epochs: the driver packed 0 and 1 (head start), two actors 2
    and 3 (the second's seconds are its second window's: a rate per core). Every instant is
    scripted: perf_counter 10.0 at the command's start, wall clock 1000.0."""
    perf, wall = iter([10.5, 11.0]), iter([1000.5])
    monkeypatch.setattr(pack_report, "time", types.SimpleNamespace(perf_counter=lambda: next(perf),
                                                                   time=lambda: next(wall)))
    clock = StartupClock()
    clock.start, clock.began, clock.marks = 1000.0, 10.0, [("plan", 1000.1), ("probe", 1000.2)]
    plan = types.SimpleNamespace(num_windows=4, windows_per_epoch=2, epochs=2, window_counts=lambda k: np.array([10]))
    total = RunStats(["a"], [20])
    report = PackReport(plan, total, clock, RayTimes(10.0, 10.2, 0.8), parts=True)
    report.add(DriverWindow(0, 3, 300, "part-0", window_stats(0, 3, 300), written_at=1000.4))
    report.add(DriverWindow(1, 2, 200, "part-1", window_stats(1, 2, 200), written_at=1000.45))
    for k, rows, tokens, spent in ((2, 4, 400, (None, None)), (3, 1, 100, (0.5, 0.25))):
        total.add(window_stats(k, rows, tokens))  # the pipeline folds the actors' windows
        report.add(types.SimpleNamespace(window=k, num_rows=rows, tokens=tokens, file=f"part-{k}", timings=None,
                                         stats=window_stats(k, rows, tokens), core_seconds=spent[0],
                                         cpu_seconds=spent[1]))
    assert (report.rows, report.tokens, report.samples_started, report.driver_windows) == (10, 1000, 20, 2)
    assert report.files == ["part-0", "part-1", "part-2", "part-3"]
    stats = report.to_stats(seq_len=128, num_workers=2, end=12.0)
    added = {key: stats[key] for key in list(stats)[list(stats).index("storage") + 1:]}
    assert added == {
        "first_row_seconds": 0.4,  # the driver's first row, written at 1000.4: seen 0.1 s later
        "ray_to_first_row_seconds": 0.2,
        "startup_seconds": {"plan_s": 0.1, "probe_s": 0.1, "first_window_write_s": 0.2},
        "steady_tokens_per_second": 100.0,  # the tokens after the actors' first window (100) over 11.0 -> 12.0
        "core_tokens_per_second": 200.0,
        "cpu_tokens_per_second": 400.0,
        "ray_init_seconds": 0.8,
        "num_workers": 2,
        "driver_windows": 2,
        "epoch_rows": [5, 5],
    }
    assert (stats["seconds"], stats["rows"], stats["tokens"], stats["windows"]) == (2.0, 10, 1000, 4)


STATS_JSON_KEYS = [
    "status", "samples_read", "samples_packed", "truncated", "split", "dropped", "tokens", "trained_tokens", "skipped",
    "skipped_total", "formats", "skip_examples", "rows", "bound_rows", "efficiency", "windows", "seq_len", "seconds",
    "tokens_per_second", "sources", "tokenizer_backend", "storage", "first_row_seconds", "ray_to_first_row_seconds",
    "startup_seconds", "steady_tokens_per_second", "core_tokens_per_second", "cpu_tokens_per_second",
    "ray_init_seconds", "num_workers", "driver_windows", "epoch_rows",
]
SOURCE_KEYS = [
    "name", "planned_samples_per_epoch", "samples_read", "samples_packed", "truncated", "split", "dropped", "tokens",
    "trained_tokens", "skipped", "skipped_total", "formats", "usable", "planned_share", "realised_share",
    "realised_token_share", "epochs",
]
DRIVER_ALONE_PHASES = {"plan_s", "tokenizer_load_s", "probe_s", "driver_window_pack_s", "pipeline_s",
                       "first_window_write_s"}


def test_the_stats_json_of_a_real_small_pack_has_these_keys(tmp_path, monkeypatch, capsys):
    """40 instructions in 2 windows, packed by the driver alone (no Ray: as in a process of
    its own, with Ray's start made too slow to pay off)."""
    monkeypatch.setattr(raycluster, "ray_initialised", lambda: False)
    monkeypatch.setattr(head_start, "RAY_START_S", 1e6)
    monkeypatch.setattr(raycluster, "init_ray", lambda *a, **k: pytest.fail("no Ray for a run the driver packs"))
    source = next(p for p in demo_corpus_paths() if p.endswith("instruct.jsonl"))
    corpus = tmp_path / "instruct.jsonl"
    with open(source, encoding="utf-8") as f:
        corpus.write_text("".join(line for _, line in zip(range(40), f)))
    config = DataConfig.from_inputs([str(corpus)], tokenizer=demo_tokenizer_path(), seq_len=256, window_samples=20)
    stats = run_pack(config, str(tmp_path / "out"), progress_seconds=60)
    written = json.loads((tmp_path / "out" / ".packfeed" / "stats.json").read_text())
    assert list(written) == STATS_JSON_KEYS and written["status"] == "complete"
    assert list(stats) == STATS_JSON_KEYS[1:]
    assert [list(s) for s in written["sources"]] == [SOURCE_KEYS]
    assert set(written["startup_seconds"]) == DRIVER_ALONE_PHASES
    assert (written["windows"], written["driver_windows"], written["num_workers"]) == (2, 2, 0)
    assert written["ray_init_seconds"] is None and written["steady_tokens_per_second"] is None
    out = capsys.readouterr().out
    assert format_summary(stats) in out and out.rstrip().splitlines()[-1].startswith(f"wrote {stats['rows']:,} rows in 2 file(s)")
