"""Requests to a store show in the stats and the metrics: every window's, retries included.

A window of inputs on S3 (moto through the fault proxy) is packed by ``process_window`` while
the proxy throttles; its ``WindowStats.storage`` must say what the proxy saw, the run's totals
(stats.json, the summary) must add the plan's scan to them, and the serve metrics must export
them.
"""

from __future__ import annotations

import json

import pytest
from prometheus_client.core import CounterMetricFamily

from packfeed.service import storage
from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.inputs.read_cache import reset_shared_caches
from packfeed.service.metrics import _storage_families, storage_counts
from packfeed.service.pipeline.stats import new_run_stats
from packfeed.service.pipeline.stats import RunStats, WindowStats
from packfeed.service.pipeline.summary import format_summary
from packfeed.service.pipeline.window import process_window
from packfeed.service.tokenize.samples import load_tokenizer

pytestmark = pytest.mark.integration


@pytest.fixture
def corpus_uri(s3_faulty):
    bucket = s3_faulty.bucket("stats")
    for f in range(3):
        rows = [json.dumps({"text": f"file {f} row {i} " + "word " * (i % 13)}) for i in range(120)]
        s3_faulty.put(bucket, f"web/part-{f}.jsonl", ("\n".join(rows) + "\n").encode())
    return f"s3://{bucket}/web/*.jsonl"


@pytest.mark.parametrize("failures", [0, 1, 4])
def test_a_windows_requests_and_retries_are_its_stats(corpus_uri, s3_proxy, failures):
    config = DataConfig.from_inputs([corpus_uri], tokenizer=demo_tokenizer_path(), seq_len=256, window_samples=100)
    s3_proxy.reset()
    plan = build_plan(config)
    assert plan.scan_storage.requests == s3_proxy.count() and plan.scan_storage.retries == 0
    tokenizer = load_tokenizer(demo_tokenizer_path())
    stats = new_run_stats(plan)
    window_requests = 0
    for k in range(plan.num_windows):
        reset_shared_caches(clear_disk=True)  # each window reads the store, not the bytes the scan kept
        s3_proxy.reset()
        s3_proxy.fail_next(failures, "503", method="GET")
        _, ws = process_window(plan.window(k), {plan.sources[0].loss: tokenizer}, config, plan)
        assert ws.storage.requests == s3_proxy.count() > 0
        assert ws.storage.retries == failures and ws.storage.failures == 0
        assert 0 < ws.storage.bytes_read <= s3_proxy.bytes_out("GET")
        assert WindowStats.from_json(ws.to_json()).storage == ws.storage  # it travels to the driver intact
        window_requests += ws.storage.requests
        stats.add(ws)
    totals = stats.to_dict(seq_len=config.seq_len, seconds=1.0)["storage"]
    assert totals["retries"] == failures * plan.num_windows
    assert totals["requests"] == plan.scan_storage.requests + window_requests
    summary = format_summary(stats.to_dict(seq_len=config.seq_len, seconds=1.0))
    assert f"{totals['requests']:,} requests ({totals['retries']:,} retried, 0 failed" in summary
    assert totals["throttled"] == failures * plan.num_windows  # each of the 503s


def test_the_metrics_export_the_streams_storage_counts():
    class Stream:  # a pipeline stream's RunStats, as metrics.storage_counts reads it
        stats = RunStats(["web"], [1], storage=storage.StorageCounts(requests=7, retries=2, failures=1,
                                                                     bytes_read=1234, throttled=2, backoff_ms=1500))

    families = {f.name: f for f in _storage_families(storage_counts(Stream()))}
    assert all(isinstance(f, CounterMetricFamily) for f in families.values())
    got = {name: f.samples[0].value for name, f in families.items()}
    expected = {"packfeed_storage_requests": 7, "packfeed_storage_retries": 2, "packfeed_storage_failures": 1,
                "packfeed_storage_read_bytes": 1234, "packfeed_storage_throttled": 2,
                "packfeed_storage_backoff_seconds": 1.5}
    assert got == expected
