"""A restarted ``packfeed serve`` on a fresh node reads from the store about what remains after
its consumer's cursor, nothing before it (issue 41: <= 1.2 x).

JSONL + Parquet inputs and the ``--state-dir`` on S3 (moto on 127.0.0.1, through the counting
proxy). A rank reads part of the stream and keeps its state; the server is stopped (SIGTERM: the
drain writes the stream manifest whole) and started again with an empty node-local read cache
(``$PACKFEED_READ_CACHE_DIR``: another node's would hold what the first run read); the rank
resumes from its state. Every sample arrives once, and the restart's GETs of the inputs are
compared with what remains: the byte ranges (JSONL seek-point stretches, Parquet footers and the
column chunks of the row groups) that the windows from the one holding the cursor on draw
(``inputs/extents.py``, over the plan of the same files on disk); nothing of the scan, whose
manifest is in the state dir, nor of the probe, whose record is there too.

Measured: 572,226 input bytes read for 562,527 remaining (1.02x; the rest: 4 KiB requests for
small gaps between cached extents, storage/reads.py ``MIN_REQUEST``), of 1,443,661 input bytes.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest
from support.serve import TOKENIZER
from support.store_runs import CORPUS, write_corpus
from test_serve_failures import Rank, finish, log_between, packing_starts, run_ranks
from test_serve_s3 import StoreServer, stream_manifest_entries

from packfeed.client.stream import PackedStream
from packfeed.service.data.config import DataConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.inputs.disk_cache import DIR_ENV
from packfeed.service.inputs.extents import num_bytes, union, window_extents
from packfeed.service.inputs.read_cache import reset_shared_caches
from packfeed.service.pipeline.preflight import load_tokenizer_for, probe_once

pytestmark = pytest.mark.integration

# Windows of 1024 samples in blocks of 32 (a JSONL seek point at every block start): 4 windows of
# the 3,500 samples, each of 32 blocks from all over the inputs; what remains after a cursor in
# window 2 is ~40% of the input bytes (a restart reading whole files would read 2.6 x it).
WINDOW, BLOCK, LINES = 1024, 32, 1000
FLAGS = ["--tokenizer", TOKENIZER, "--seq-len", "512", "--window-samples", str(WINDOW), "--block-samples", str(BLOCK),
         "--num-workers", "1", "--buffer-rows", "128"]
FIRST_BATCHES, BATCH_ROWS = 50, 8  # the rank's first run: 400 rows of ~540, in the third of 4 windows
RESTART_BOUND = 1.2  # issue 41: a restarted serve reads <= 1.2 x what remains after its cursor


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, s3_server):
    """(local directory, bucket): 1,000 lines of each bundled JSONL file and 500 stories as
    Parquet (row groups of 200), on disk and under s3://<bucket>/corpus/."""
    directory = write_corpus(tmp_path_factory.mktemp("data"), lines=LINES)
    bucket = s3_server.bucket("restart")
    s3_server.upload_tree(directory, bucket, f"{CORPUS}/")
    return directory, bucket


def remaining_bytes(directory: Path, window: int) -> tuple[int, int, int]:
    """(bytes the windows from ``window`` on draw, the input bytes, windows in the stream), from
    the plan of the same files on disk (the same rows, seek points and windows as on S3)."""
    config = DataConfig.from_dict({"inputs": [f"{directory}/*"], "tokenizer": TOKENIZER, "seq_len": 512,
                                   "window_samples": WINDOW, "block_samples": BLOCK})
    plan = build_plan(config)
    metadata: dict = {}
    drawn = union(window_extents(plan.window(k), metadata=metadata) for k in range(window, plan.num_windows))
    inputs = sum(p.stat().st_size for p in directory.iterdir())
    return num_bytes(drawn), inputs, plan.num_windows


def input_gets(requests) -> int:
    return sum(r.bytes_out for r in requests if r.method == "GET" and r.key.startswith(f"{CORPUS}/"))


@pytest.mark.timeout(300)
def test_a_restarted_serve_on_a_fresh_node_reads_about_what_remains_after_the_cursor(
        s3_server, s3_proxy, corpus, tmp_path):
    directory, bucket = corpus
    env = {**s3_server.env(s3_proxy.endpoint), "RAY_ADDRESS": "", DIR_ENV: str(tmp_path / "node-a")}
    server = StoreServer([f"s3://{bucket}/{CORPUS}/*", *FLAGS], log=tmp_path / "serve.log",
                         state_uri=f"s3://{bucket}/serve-state", env=env)
    s3_proxy.reset()
    try:
        server.start()
        with PackedStream(server.target, batch_rows=BATCH_ROWS) as stream:
            first = Rank(stream, max_batches=FIRST_BATCHES)
            run_ranks([first])
            finish([first])
            state = stream.state_dict()
        assert server.terminate() == 0, server.tail()  # the drain writes the stream manifest whole
        s3_proxy.wait_quiet()
        first_run = input_gets(s3_proxy.requests)
        s3_proxy.reset()
        server.env[DIR_ENV] = str(tmp_path / "node-b")  # another node: nothing of the first run's reads at hand
        before = server.log.stat().st_size
        server.start()
        with PackedStream(server.target, batch_rows=BATCH_ROWS, state=state) as stream:
            rest = Rank(stream)
            run_ranks([rest])
            finish([rest])
        s3_proxy.wait_quiet()
        restart = input_gets(s3_proxy.requests)
        restart_log = log_between(server, before)
    finally:
        server.kill()

    assert state["cursor"] == FIRST_BATCHES * BATCH_ROWS
    rows = first.rows + rest.rows
    total = rest.steps[-1][1]
    assert sorted(index for index, _, _ in rows) == list(range(total)), "every row once"
    samples = Counter(s for _, _, ids in rows for s in ids)
    assert samples == Counter(range(3 * LINES + LINES // 2)), "every sample once"

    firsts = {e["w"]: e["r"] for e in stream_manifest_entries(s3_server, bucket) if "w" in e}
    holding = max(w for w, row in firsts.items() if row <= state["cursor"])
    assert packing_starts(restart_log) == [(holding, firsts[holding])], "one reader, from the cursor's window"
    assert "probed by an earlier start" in restart_log and "first 20:" not in restart_log, "no probe read again"
    window = holding
    remains, inputs, num_windows = remaining_bytes(directory, window)  # nothing of the scan: its manifest was there
    print(f"\nserve restart from row {state['cursor']:,} (window {window} of {num_windows}) on a fresh node: "
          f"{restart:,} input bytes read for {remains:,} remaining ({restart / remains:.2f}x; inputs {inputs:,}, "
          f"the first run read {first_run:,})")
    assert 0 < window < num_windows - 1 and remains < 0.8 * inputs, "what remains is a part of the inputs"
    assert restart <= RESTART_BOUND * remains, (restart, remains)


def test_a_probe_that_passed_is_not_read_again_on_the_same_files_and_is_counted_in_the_plan(
        s3_faulty, s3_proxy, corpus, caplog):
    """``preflight.probe_once`` with a record on the store (no Ray): the first probe's GETs are
    the plan's storage counts to the byte; a second start on the same files reads no input; a
    file written again (another version) is probed again."""
    directory, _ = corpus
    bucket = s3_faulty.bucket("probe")
    s3_faulty.upload_tree(directory, bucket, f"{CORPUS}/")
    config = DataConfig.from_dict({"inputs": [f"s3://{bucket}/{CORPUS}/*"], "tokenizer": TOKENIZER, "seq_len": 512,
                                   "window_samples": WINDOW, "block_samples": BLOCK})
    record, tokenizer = f"s3://{bucket}/state/probed.txt", load_tokenizer_for(config)

    def probe(plan) -> tuple[int, int]:
        """(input bytes the proxy sent, bytes the plan's counts gained) for one probe_once."""
        reset_shared_caches(clear_disk=True)
        s3_proxy.reset()
        before = plan.scan_storage.bytes_read
        probe_once(plan, tokenizer, config, record)
        return input_gets(s3_proxy.requests), plan.scan_storage.bytes_read - before

    plan = build_plan(config)
    sent, counted = probe(plan)
    assert sent > 0 and counted == sent, (sent, counted)
    with caplog.at_level(logging.INFO, logger="packfeed"):
        assert probe(build_plan(config)) == (0, 0)
    assert any("probed by an earlier start" in r.getMessage() for r in caplog.records)
    # a new version: other bytes (the same bytes again may keep the size, the ETag and, within
    # the second of the first upload, the mtime: the same version as far as a store can tell)
    lines = (directory / "instruct.jsonl").read_bytes().splitlines(keepends=True)
    s3_faulty.put(bucket, f"{CORPUS}/instruct.jsonl", b"".join(lines + lines[:1]))
    sent, counted = probe(build_plan(config))
    assert sent > 0 and counted == sent, (sent, counted)
