"""``packfeed serve`` with its inputs and its ``--state-dir`` on S3 (moto on 127.0.0.1, through
the counting proxy): SIGKILLed mid-stream and started again, it delivers every row exactly once
(the contract of serve/test_serve_failures.py), the restart reads no input to plan (the scan manifest
and the probe's record in the state dir), and a packed directory on S3 is served as it is.

The servers are real processes (tests/support/serve.py), each with its own embedded Ray that
reaches the store through the proxy.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
from support.serve import DEMO_SAMPLES, TOKENIZER, ServerProcess
from support.streams import plain_rows
from support.store_runs import CORPUS
from test_serve_failures import (
    JOIN_S,
    SEED,
    Rank,
    Reference,
    assert_exactly_once,
    assert_steps,
    close_all,
    finish,
    log_between,
    packing_starts,
    run_ranks,
)

from packfeed.client.stream import PackedStream
from packfeed.service.assets import demo_corpus_paths
from packfeed.service.faults import FAULTS_ENV

pytestmark = pytest.mark.integration


class StoreServer(ServerProcess):
    """A ``packfeed serve`` process whose ``--state-dir`` is a URI (ServerProcess takes a path)."""

    def __init__(self, args: list[str], *, log: Path, state_uri: str, env: dict) -> None:
        super().__init__(args, log=log, state_dir=Path(state_uri), env=env)
        self.state_uri = state_uri

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("--state-dir") + 1] = self.state_uri
        return command


@pytest.fixture(scope="module")
def bucket(s3_server):
    """The bundled corpus (7,500 samples) under s3://<bucket>/corpus/."""
    name = s3_server.bucket("serve")
    for path in demo_corpus_paths():
        s3_server.put(name, f"{CORPUS}/{os.path.basename(path)}", Path(path).read_bytes())
    return name


def planning(requests: list) -> list:
    """The requests of a server's start before it opened its stream manifest: the state dir's
    check, the plan and the probe of the inputs' first rows (it serves only after)."""
    for i, r in enumerate(requests):
        name = r.key.removeprefix("serve-state/")
        if name != r.key and name.endswith(".json") and not name.startswith("probe.json"):
            return requests[:i]
    raise AssertionError(f"the stream manifest was never read: {[r.key for r in requests]}")


def input_bytes(requests) -> dict[str, int]:
    """Input key -> bytes its GETs returned."""
    out: dict[str, int] = {}
    for r in requests:
        if r.method == "GET" and r.key.startswith(f"{CORPUS}/"):
            out[r.key] = out.get(r.key, 0) + r.bytes_out
    return out


@pytest.mark.timeout(300)
def test_serve_from_s3_with_its_state_on_s3_survives_sigkill_exactly_once_and_plans_again_from_its_manifest(
        s3_server, s3_proxy, bucket, tmp_path):
    sizes = {f"{CORPUS}/{os.path.basename(p)}": os.path.getsize(p) for p in demo_corpus_paths()}
    env = {**s3_server.env(s3_proxy.endpoint), "RAY_ADDRESS": ""}
    state = f"s3://{bucket}/serve-state"
    args = [f"s3://{bucket}/{CORPUS}/*.jsonl", "--tokenizer", TOKENIZER, "--seq-len", "512", "--window-samples", "1000",
            "--num-workers", "1", "--buffer-rows", "128"]
    server = StoreServer(args, log=tmp_path / "serve.log", state_uri=state, env=env)
    crash_row = random.Random(SEED).randint(300, 600)  # the stream holds ~950 rows
    s3_proxy.reset()
    server.env[FAULTS_ENV] = f"serve-row:{crash_row}"
    server.start()
    del server.env[FAULTS_ENV]
    first_plan = input_bytes(planning(s3_proxy.requests))
    assert all(first_plan.get(key, 0) >= size for key, size in sizes.items()), (first_plan, sizes)  # scanned whole

    world, b = 2, 4
    streams = [PackedStream(server.target, rank=r, world_size=world, batch_rows=b, max_backoff_s=1.0)
               for r in range(world)]
    ranks = [Rank(s) for s in streams]
    try:
        run_ranks(ranks)
        assert server.proc.wait(JOIN_S) < 0, server.tail()  # SIGKILLed by the fault, no drain
        server.kill()  # what is left of its process groups, as a crashed container's
        before = server.log.stat().st_size
        s3_proxy.wait_quiet()  # a request the dead server's actors sent is not the restart's
        s3_proxy.reset()
        server.start()
        finish(ranks)
        restart_plan = planning(s3_proxy.requests)
        ref = reference_read(server)
    finally:
        close_all(streams)
        server.kill()

    # the restart planned from the scan manifest in the state dir, and the probe's record there
    # said these inputs passed it: no input byte read before serving
    read = input_bytes(restart_plan)
    print(f"\nserve restart, to plan: {len(restart_plan)} requests, {sum(read.values()):,} input bytes "
          f"(a scan would add {sum(sizes.values()):,}); first start: {sum(first_plan.values()):,}")
    assert read == {}, read
    for kept in ("serve-state/scan-", "serve-state/probed-"):
        methods = [r.method for r in restart_plan if r.key.startswith(kept) and r.method in ("GET", "PUT")]
        assert methods == ["GET"], f"{kept}: read, not written again ({methods})"
    # The killed server left the windows it had packed in the stream manifest on the store (whether
    # the restart's reader must then start at a later window is timing: see test_serve_failures).
    left = stream_manifest_entries(s3_server, bucket)
    assert any(entry.get("w", 0) > 0 for entry in left), f"no later window in the manifest: {left[:5]}"
    assert packing_starts(log_between(server, before)), "the restarted server packed"

    for rank in ranks:
        assert_steps(rank.steps, first_step=0, cursor=0, per_step=world * b, total=ref.total)
    assert sum(s.reconnects > 0 for s in streams) == world, "each rank reconnected to the restarted server"
    assert_exactly_once(ranks[0].rows + ranks[1].rows, ranks[0].padding + ranks[1].padding, ref)


def stream_manifest_entries(s3_server, bucket: str) -> list[dict]:
    """The entries of the stream manifest(s) in the state dir on the store, read with boto3."""
    client = s3_server.client
    listed = client.list_objects_v2(Bucket=bucket, Prefix="serve-state/").get("Contents", [])
    keys = [o["Key"] for o in listed if o["Key"].endswith(".json") and not o["Key"].endswith("/probe.json")]
    assert keys, f"no stream manifest in the state dir: {[o['Key'] for o in listed]}"
    text = "".join(client.get_object(Bucket=bucket, Key=key)["Body"].read().decode() for key in keys)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def reference_read(server: ServerProcess) -> Reference:
    """One uninterrupted rank's read of the whole stream, from its first row."""
    with PackedStream(server.target, rank=0, world_size=1, batch_rows=32) as stream:
        rank = Rank(stream)
        run_ranks([rank])
        finish([rank])
    total = rank.steps[-1][1]
    assert len(rank.rows) == total and len({s for _, _, ids in rank.rows for s in ids}) == DEMO_SAMPLES
    return Reference(total=total, rows={index: (digest, ids) for index, digest, ids in rank.rows})


@pytest.mark.timeout(120)
def test_a_packed_directory_on_s3_is_served_as_it_is_by_ranged_reads(s3_faulty, s3_proxy, tmp_path):
    """No Ray, no scan: a listing, each part's footer, then each row group by range; the rows
    are the directory's, globally numbered."""
    from packfeed.service.packed.writer import ParquetRowWriter

    seq, groups = 64, (40, 25, 35)
    uri = f"s3://{s3_faulty.bucket('packed')}/packed"
    writer = ParquetRowWriter(uri, seq_len=seq, config_hash="toy")
    writer.rows_per_group, writer.rows_per_file = 40, 80  # two part files, four row groups
    first = 0
    for n in groups:
        writer.write(plain_rows(first, n, seq))
        first += n
    writer.close(config={"data": {"seq_len": seq, "tokenizer": TOKENIZER}, "config_hash": "toy",
                         "tokenizer": {"name": "toy", "pad_id": 0, "vocab_size": 1 << 20}, "plan": {"epochs": 1}},
                 stats={"rows": first, "epoch_rows": [first]})
    s3_proxy.reset()
    server = ServerProcess([uri], log=tmp_path / "serve.log", state_dir=tmp_path / "state",
                           env={**s3_faulty.env(s3_proxy.endpoint), "RAY_ADDRESS": ""})
    with server, PackedStream(server.target, rank=0, world_size=1, batch_rows=16) as stream:
        batches = list(stream)
    assert "Ray shut down" not in server.tail(), "a packed directory is served without Ray"
    real = [(b.row_index[~b.padding_rows], b.rows.input_ids[~b.padding_rows]) for b in batches]
    assert np.array_equal(np.concatenate([i for i, _ in real]), np.arange(first))
    assert np.array_equal(np.concatenate([ids for _, ids in real]), plain_rows(0, first, seq).input_ids)
    parts = [r for r in s3_proxy.requests if r.key.endswith(".parquet")]
    heads, gets = (sum(r.method == m for r in parts) for m in ("HEAD", "GET"))
    print(f"\nserving a packed directory of {first} rows in 2 parts / 4 row groups from S3: "
          f"{len(s3_proxy.requests)} requests, on the parts {heads} HEAD and {gets} GET "
          f"({sum(r.bytes_out for r in parts):,} bytes)")
    assert heads == 2 * 2 + 4, "each part's version, its open; a row group read checks the version again"
    assert gets <= 2 * 2 + 4, "each footer in a request or two, then each row group in one"
