"""``packfeed serve --metrics-port``: a real HTTP scrape of ``/metrics`` while a stream runs.

The counters move while a consumer reads, and at the end they match what the consumer
received: rows, batches, every sample packed, the stream length; the buffer stays within its
bound. A metrics port that is taken is refused at start-up, naming the flag.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from packfeed.client.stream import PackedStream
from serve_support import DEMO_SAMPLES, METRICS, REPO, ServerProcess, demo_args, scrape

pytestmark = pytest.mark.integration

def total(samples: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in samples.items() if k.split("{")[0] == prefix)


def test_metrics_move_with_the_stream_and_match_what_the_consumer_got(tmp_path):
    args = demo_args(extra=("--buffer-rows", "256", "--metrics-port", "0"))
    with ServerProcess(args, log=tmp_path / "serve.log", state_dir=tmp_path / "state", env={"RAY_ADDRESS": ""}) as server:
        port = int(METRICS.search(server.log.read_text()).group(1))
        before = scrape(port)
        rows = batches = 0
        with PackedStream(server.target, batch_rows=8, prefetch=2) as stream:
            it = iter(stream)
            for batch in (next(it) for _ in range(20)):
                rows, batches = rows + int((~batch.padding_rows).sum()), batches + 1
            middle = scrape(port)
            for batch in it:
                rows, batches = rows + int((~batch.padding_rows).sum()), batches + 1
        after = scrape(port)
    assert before["packfeed_rows_served_total"] == 0 and middle["packfeed_rows_served_total"] >= 160
    assert middle["packfeed_streams"] == 1 and after["packfeed_streams"] == 0
    assert after["packfeed_rows_served_total"] == rows, "rows served = rows the consumer received"
    assert after["packfeed_batches_sent_total"] == batches and after["packfeed_bytes_sent_total"] > 0
    assert after["packfeed_stream_rows"] == rows
    assert total(after, "packfeed_packed_samples_total") == DEMO_SAMPLES
    assert total(after, "packfeed_packed_tokens_total") > total(middle, "packfeed_packed_tokens_total") > 0
    assert 0.9 < after["packfeed_packing_efficiency"] <= 1.0
    assert 0 <= middle["packfeed_buffer_rows"] <= middle["packfeed_buffer_capacity_rows"] == 256
    assert after["packfeed_reader_restarts_total"] >= 1


def test_a_taken_metrics_port_is_refused_at_start_up(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "packfeed.service.cli", "serve", *demo_args(), "--port", "0",
                               "--metrics-port", str(port)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and f"--metrics-port {port}: port {port} is in use" in proc.stderr
    assert "Ray: started" not in proc.stderr
