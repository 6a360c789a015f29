"""``packfeed serve --metrics-port``: a real HTTP scrape of ``/metrics`` while a stream runs.

The counters move while a consumer reads, and at the end they match what the consumer
received: rows, tokens, batches, every sample packed, the stream length; the buffer stays
within its bound; a fresh server's reader was never restarted. A packed directory (served
without Ray) exports its stats.json's packing totals and what it served, and its last line
names no Ray shutdown. A metrics port that is taken is refused at start-up, naming the flag.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, PackedRows, check_rows
from packfeed.client.stream import PackedStream
from support.serve import DEMO_SAMPLES, METRICS, REPO, ServerProcess, demo_args, scrape

from packfeed.service.pipeline.stats import Counts, RunStats, WindowStats
from packfeed.service.packed.writer import ParquetRowWriter

pytestmark = pytest.mark.integration

def total(samples: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in samples.items() if k.split("{")[0] == prefix)


def scrape_until(port: int, done, seconds: float = 10.0) -> dict[str, float]:
    """The first scrape for which ``done`` holds, or the last one after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not done(scraped := scrape(port)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return scraped


def test_metrics_move_with_the_stream_and_match_what_the_consumer_got(tmp_path):
    args = demo_args(extra=("--buffer-rows", "256", "--metrics-port", "0"))
    with ServerProcess(args, log=tmp_path / "serve.log", state_dir=tmp_path / "state", env={"RAY_ADDRESS": ""}) as server:
        port = int(METRICS.search(server.log.read_text()).group(1))
        before = scrape(port)
        rows = batches = tokens = 0
        with PackedStream(server.target, batch_rows=8, prefetch=2) as stream:
            it = iter(stream)
            for batch in (next(it) for _ in range(20)):
                rows, batches = rows + int((~batch.padding_rows).sum()), batches + 1
                tokens += batch.rows.num_real_tokens
            # the server counts a batch once gRPC has sent it and asks for the next: the consumer
            # may hold batch 20 a moment before the server's thread gets there
            middle = scrape_until(port, lambda m: m["packfeed_rows_served_total"] >= 160)
            for batch in it:
                rows, batches = rows + int((~batch.padding_rows).sum()), batches + 1
                tokens += batch.rows.num_real_tokens
        after = scrape(port)
    assert before["packfeed_rows_served_total"] == 0 and middle["packfeed_rows_served_total"] >= 160
    assert middle["packfeed_streams"] == 1 and after["packfeed_streams"] == 0
    assert after["packfeed_rows_served_total"] == rows, "rows served = rows the consumer received"
    assert after["packfeed_tokens_served_total"] == tokens == total(after, "packfeed_packed_tokens_total"), \
        "one consumer of the whole stream got every token packed, once"
    assert after["packfeed_batches_sent_total"] == batches and after["packfeed_bytes_sent_total"] > 0
    assert after["packfeed_stream_rows"] == rows
    assert total(after, "packfeed_packed_samples_total") == DEMO_SAMPLES
    # Packing runs ahead of the consumer (a 256-row buffer plus what gRPC's flow-control window
    # holds, which grows with the link): by the middle scrape it may have packed the whole stream
    # (it had on a loaded CI run: 720 rows sent of 873), so the counter is non-decreasing there.
    assert total(after, "packfeed_packed_tokens_total") >= total(middle, "packfeed_packed_tokens_total") > 0
    assert 0.9 < after["packfeed_packing_efficiency"] <= 1.0
    assert 0 <= middle["packfeed_buffer_rows"] <= middle["packfeed_buffer_capacity_rows"] == 256
    assert after["packfeed_reader_restarts_total"] == 0, "one consumer from row 0: the first reader, never restarted"


SEQ, PACKED_ROWS = 16, 300


def packed_directory(out) -> dict:
    """A ``packfeed pack`` output written with pack's own writer and accounting (no Ray): row r
    holds one sample of 10 tokens (source "a" for two rows in three, "b" otherwise) and a
    6-token padding tail; 5 samples of "a" were skipped. Returns its stats.json."""
    lens = np.tile(np.array([10, SEQ - 10], np.int32), PACKED_ROWS)
    ids = np.arange(1, PACKED_ROWS * SEQ + 1, dtype=np.int32).reshape(PACKED_ROWS, SEQ)
    labels = ids.copy()
    labels[:, 0] = labels[:, 10:] = IGNORE_INDEX
    positions = np.tile(np.concatenate([np.arange(10), np.arange(SEQ - 10)]).astype(np.int32), (PACKED_ROWS, 1))
    rows = PackedRows(input_ids=ids, labels=labels, position_ids=positions, seq_lens=lens,
                      sample_ids=np.stack([np.arange(PACKED_ROWS), np.full(PACKED_ROWS, PAD_SAMPLE_ID)], 1).ravel(),
                      segment_splits=np.arange(0, 2 * PACKED_ROWS + 1, 2, dtype=np.int64),
                      row_index=np.arange(PACKED_ROWS, dtype=np.int64))
    check_rows(rows, SEQ)
    window = WindowStats(window=0, epoch=0, rows=PACKED_ROWS)
    a, b = PACKED_ROWS * 2 // 3, PACKED_ROWS // 3
    window.sources = {0: Counts(samples_read=a + 5, samples_packed=a, tokens=10 * a, skipped={"too_long": 5}),
                      1: Counts(samples_read=b, samples_packed=b, tokens=10 * b)}
    stats = RunStats(["a", "b"], planned=[a + 5, b])
    stats.add(window)
    summary = {**stats.to_dict(seq_len=SEQ, seconds=1.0), "epoch_rows": [PACKED_ROWS]}
    writer = ParquetRowWriter(out, seq_len=SEQ, config_hash="c0ffee")
    writer.write(rows)
    writer.close(config={"config_hash": "c0ffee", "data": {"seq_len": SEQ, "tokenizer": "toy"},
                         "plan": {"epochs": 1}}, stats=summary)
    return summary


def test_a_packed_directory_exports_its_packing_totals_and_what_it_served(tmp_path):
    stats = packed_directory(tmp_path / "packed")
    server = ServerProcess([str(tmp_path / "packed"), "--metrics-port", "0"], log=tmp_path / "serve.log",
                           state_dir=tmp_path / "state")
    with server:
        port = int(METRICS.search(server.log.read_text()).group(1))
        before = scrape(port)
        with PackedStream(server.target, batch_rows=16) as stream:
            tokens = sum(batch.rows.num_real_tokens for batch in stream)
        after = scrape(port)
    packing = {f'packfeed_packed_samples_total{{source="{s["name"]}"}}': s["samples_packed"] for s in stats["sources"]}
    packing |= {f'packfeed_packed_tokens_total{{source="{s["name"]}"}}': s["tokens"] for s in stats["sources"]}
    packing['packfeed_skipped_samples_total{reason="too_long",source="a"}'] = 5
    packing["packfeed_packing_efficiency"] = stats["efficiency"]
    for scraped in (before, after):  # packed before the server started: its stats.json, constant
        assert {k: scraped.get(k) for k in packing} == packing
    assert stats["efficiency"] == 10 / SEQ and after["packfeed_stream_rows"] == PACKED_ROWS
    assert before["packfeed_rows_served_total"] == before["packfeed_tokens_served_total"] == 0
    assert after["packfeed_rows_served_total"] == PACKED_ROWS
    assert after["packfeed_tokens_served_total"] == tokens == 10 * PACKED_ROWS
    assert after["packfeed_reader_restarts_total"] == 0
    log = server.log.read_text()
    assert "Ray: " not in log, "a packed directory needs no Ray"
    assert "packfeed serve: stopped (drained in " in log and "Ray shut down" not in log, log[-2000:]


def test_a_taken_metrics_port_is_refused_at_start_up(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "packfeed.service.cli", "serve", *demo_args(), "--port", "0",
                               "--metrics-port", str(port)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and f"--metrics-port {port}: port {port} is in use" in proc.stderr
    assert "Ray: started" not in proc.stderr
