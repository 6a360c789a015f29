"""``packfeed pack`` from and to S3 (moto on 127.0.0.1, through the counting proxy): the rows
and stats of the same files packed on disk, an output a plain Parquet reader reads from the
store, an input read about twice at most, a crashed pack that never looks complete, an
overwrite that deletes only packfeed's keys and plans from the scan the output kept, an output
over an input refused before any write.

Every command runs in-process (``main([...])``) on one Ray started with the environment
pointing at the proxy (``support.store_runs.ray_reaching``: the packing actors read through it too).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from support.store_runs import CORPUS, count_scans, ray_reaching, write_corpus

from packfeed.service import storage
from packfeed.service.assets import demo_tokenizer_path
from packfeed.service.cli import main
from packfeed.service.faults import FAULTS_ENV
from packfeed.service.inputs.fileio import FIRST_CHUNK
from packfeed.service.packed.writer import packed_dir_info, read_packed_dir

pytestmark = pytest.mark.integration

ROW_COLUMNS = ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "row_index")


@pytest.fixture(scope="module")
def ray_via_proxy(s3_server, s3_proxy):
    with ray_reaching(s3_server.env(s3_proxy.endpoint)):
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, s3_server):
    """(local directory, its bucket): the corpus on disk and under s3://<bucket>/corpus/."""
    directory = write_corpus(tmp_path_factory.mktemp("data"))
    bucket = s3_server.bucket("pack")
    s3_server.upload_tree(directory, bucket, f"{CORPUS}/")
    return directory, bucket


def pack_argv(inputs: list[str], output: str, *flags: str) -> list[str]:
    # Windows of 1500 cap a block at 46 rows (every window draws >= 32 places of the source); blocks
    # of 32 put a JSONL seek point at every block start, so a window reads only its rows (with
    # the default 256 they read 4.8x the inputs: data/plan.py, warn_unaligned_blocks).
    return ["pack", *inputs, "--tokenizer", demo_tokenizer_path(), "--seq-len", "512", "--window-samples", "1500",
            "--block-samples", "32", "--output", output, *flags]


def pack(inputs: list[str], output: str, *flags: str) -> int:
    return main(pack_argv(inputs, output, *flags))


def stats_of(output: str) -> dict:
    """The output's stats.json but its timings (``seconds``, ``tokens_per_second``, ... at any
    depth), the tokenizer back-end's checks (each packing actor's first window, whichever it
    was) and the object-store requests (none on disk)."""
    def comparable(value):
        if isinstance(value, dict):
            return {k: comparable(v) for k, v in value.items() if "second" not in k and k not in ("checks", "storage")}
        return [comparable(v) for v in value] if isinstance(value, list) else value

    return comparable(packed_dir_info(output)["stats"])


def keys_under(s3_server, bucket: str, prefix: str) -> list[str]:
    listed = s3_server.client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in listed if not o["Key"].endswith("/"))


@pytest.fixture(scope="module")
def packed_on_disk(ray_via_proxy, corpus, tmp_path_factory):
    directory, _ = corpus
    out = str(tmp_path_factory.mktemp("local") / "packed")
    assert pack([f"{directory}/*"], out) == 0
    return out


def test_pack_from_and_to_s3_equals_pack_on_disk_and_reads_each_input_byte_about_twice(
        ray_via_proxy, corpus, packed_on_disk, s3_server, s3_proxy, capsys):
    directory, bucket = corpus
    out = f"s3://{bucket}/runs/packed"
    s3_proxy.reset()
    before = storage.COUNTERS.snapshot()
    assert pack([f"s3://{bucket}/{CORPUS}/*"], out) == 0
    driver = storage.COUNTERS.snapshot() - before
    requests = s3_proxy.requests
    assert f"to {out} (metadata in .packfeed/)" in capsys.readouterr().out

    local, remote = read_packed_dir(packed_on_disk), read_packed_dir(out)
    assert local.num_rows > 100
    for column in ROW_COLUMNS:
        assert np.array_equal(getattr(local, column), getattr(remote, column)), column
    assert stats_of(out) == stats_of(packed_on_disk)
    assert packed_dir_info(out)["config"]["data"]["sources"][0]["paths"] == [f"s3://{bucket}/{CORPUS}/*"]

    # a plain Parquet reader on the store, with its own S3 client: the rows, the metadata skipped
    fs = pafs.S3FileSystem(endpoint_override=s3_server.endpoint, access_key="testing", secret_key="testing-secret",
                           region="us-east-1")
    table = pq.read_table(f"{bucket}/runs/packed", filesystem=fs)
    expected = pq.read_table(packed_on_disk)
    assert table.replace_schema_metadata(None).equals(expected.replace_schema_metadata(None))

    # what it cost: a JSONL input read about twice (the scan, then the windows' ranges), plus the
    # probe's first chunk (its first rows); Parquet by footers and row groups
    sizes = {f"{CORPUS}/{name}": os.path.getsize(directory / name) for name in os.listdir(directory)}
    read = {key: sum(r.bytes_out for r in requests if r.method == "GET" and r.key == key) for key in sizes}
    print(f"\npack of {sum(sizes.values()):,} input bytes in {len(sizes)} objects via S3: {len(requests)} requests "
          f"({', '.join(f'{m} {sum(r.method == m for r in requests)}' for m in ('HEAD', 'GET', 'PUT', 'POST'))}), "
          f"{sum(read.values()):,} input bytes read ({sum(read.values()) / sum(sizes.values()):.2f}x: "
          f"{', '.join(f'{os.path.basename(k)} {read[k] / sizes[k]:.2f}x' for k in sorted(sizes))}), "
          f"{sum(r.bytes_in for r in requests if r.method in ('PUT', 'POST')):,} bytes written; "
          f"the driver: {driver.requests} requests, {driver.retries} retries, {driver.bytes_read:,} bytes read")
    for key in (k for k in sizes if k.endswith(".jsonl")):
        assert read[key] <= 2 * sizes[key] + FIRST_CHUNK, (key, read[key], sizes[key])


# What a pack of the corpus (JSONL + Parquet, default windows and blocks, 2 packing actors) may read
# from the store per input byte (issue 41: 1.5): the scan reads every JSONL byte once, the probe the
# first Parquet row group, and the windows find the rest on the node's disk cache
# (inputs/disk_cache.py; memory alone: ~2.9x, each actor reading what its windows need once;
# before either: ~5.6x).
READ_RATIO_BOUND = 1.5


def test_a_default_pack_from_s3_reads_each_input_byte_about_once(
        ray_via_proxy, corpus, s3_proxy, tmp_path, capsys):
    directory, bucket = corpus
    argv = ["--tokenizer", demo_tokenizer_path(), "--seq-len", "512"]
    assert main(["pack", f"{directory}/*", *argv, "--output", str(tmp_path / "local")]) == 0
    out = f"s3://{bucket}/runs/default"
    s3_proxy.reset()
    assert main(["pack", f"s3://{bucket}/{CORPUS}/*", *argv, "--output", out]) == 0
    printed = capsys.readouterr().out
    local, remote = read_packed_dir(str(tmp_path / "local")), read_packed_dir(out)
    assert local.num_rows > 100
    for column in ROW_COLUMNS:
        assert np.array_equal(getattr(local, column), getattr(remote, column)), column

    inputs = sum(os.path.getsize(directory / name) for name in os.listdir(directory))
    read = sum(r.bytes_out for r in s3_proxy.select("GET", lists=False) if r.key.startswith(f"{CORPUS}/"))
    io = packed_dir_info(out)["stats"]["storage"]
    print(f"\ndefault pack from S3: {read:,} of {inputs:,} input bytes read ({read / inputs:.2f}x); stats.json: "
          f"{io['read_ratio']:.2f}x (the scan, the probe and the windows)")
    assert io["input_bytes"] == inputs and f"({io['read_ratio']:.2f} x the inputs)" in printed
    assert io["bytes_read"] == read, "stats.json counts every input byte the store sent: scan, probe, windows"
    assert read <= READ_RATIO_BOUND * inputs, (read, inputs)


def test_a_crashed_pack_on_s3_never_looks_complete_and_overwrite_deletes_only_packfeeds_keys(
        ray_via_proxy, corpus, s3_server, s3_proxy, monkeypatch, capsys):
    """Fault injection: the packing actor that starts window 4 (of 6) fails, and the pack's
    process with it (a process of its own on the module's Ray: a failed run's actors end with
    its driver); it ends without its completion marker, whatever it wrote. A foreign key
    refuses the overwrite (nothing deleted); keys that only share the prefix's text survive it."""
    import ray

    _, bucket = corpus
    inputs, out = [f"s3://{bucket}/{CORPUS}/instruct.jsonl"], f"s3://{bucket}/crash/packed"  # 3,000 short samples
    argv = pack_argv(inputs, out, "--window-samples", "500", "--address", ray.get_runtime_context().gcs_address)
    crash = subprocess.run([sys.executable, "-m", "packfeed.service.cli", *argv], capture_output=True, text=True,
                           env={**os.environ, FAULTS_ENV: "packer-window:4"}, timeout=120)
    assert crash.returncode == 2 and "fault injected at packer-window:4" in crash.stderr, crash.stderr[-2000:]
    crashed = keys_under(s3_server, bucket, "crash/")
    assert "crash/packed/.packfeed/files.json" in crashed and "crash/packed/.packfeed/stats.json" not in crashed
    with pytest.raises(ValueError, match=rf"^{out} is incomplete: a packfeed pack started there and did not finish"):
        packed_dir_info(out)
    capsys.readouterr()
    assert main(["serve", out, "--port", "0"]) == 2  # nor served
    assert f"error: {out} is incomplete" in capsys.readouterr().err

    assert pack(inputs, out, "--window-samples", "500") == 2
    assert "already holds packed output; pass --overwrite" in capsys.readouterr().err
    s3_server.put(bucket, "crash/packed/notes.txt", b"mine")
    assert pack(inputs, out, "--window-samples", "500", "--overwrite") == 2
    assert "holds files packfeed did not write (notes.txt)" in capsys.readouterr().err
    assert keys_under(s3_server, bucket, "crash/") == sorted(crashed + ["crash/packed/notes.txt"]), "nothing deleted"
    s3_server.client.delete_object(Bucket=bucket, Key="crash/packed/notes.txt")
    neighbours = ["crash/packed-old/part-00000.parquet", "crash/packedx", "crash/packed.json"]
    for key in neighbours:
        s3_server.put(bucket, key, b"not packfeed's")

    scanned = count_scans(monkeypatch)
    s3_proxy.reset()
    assert pack(inputs, out, "--window-samples", "500", "--overwrite") == 0
    assert scanned == [0], "the second pack of the same input planned from the scan the crashed one kept"
    assert s3_proxy.count("GET", key="crash/packed/.packfeed/scan.npz") == 1
    stats = packed_dir_info(out)["stats"]
    assert stats["status"] == "complete" and stats["samples_packed"] == 3000
    assert read_packed_dir(out).num_rows == stats["rows"]
    assert set(neighbours) <= set(keys_under(s3_server, bucket, "crash/")), "keys beside the prefix survive"
    assert all(s3_server.client.get_object(Bucket=bucket, Key=k)["Body"].read() == b"not packfeed's" for k in neighbours)


@pytest.mark.parametrize(("inputs", "output", "says"), [
    pytest.param(["{corpus}/*"], "{corpus}/out", "lies inside the input", id="inside-a-glob-that-reads-it"),
    pytest.param(["{corpus}/*.jsonl"], "{bucket}", "contains the input", id="the-bucket-holding-the-inputs"),
    pytest.param(["{corpus}/chat.jsonl"], "{corpus}/chat.jsonl", "is the input", id="an-input-object"),
    pytest.param(["s3://KEY:SECRET@{b}/corpus/*.jsonl"], "s3://{b}/corpus", "contains the input", id="credentials"),
    pytest.param(["{corpus}/*.jsonl"], "s3://no-such-bucket-pf/out", "the bucket 'no-such-bucket-pf' does not exist",
                 id="missing-bucket"),
])
def test_an_output_over_an_input_is_refused_before_anything_is_written(
        corpus, s3_faulty, s3_proxy, inputs, output, says, capsys):
    _, bucket = corpus
    names = {"corpus": f"s3://{bucket}/{CORPUS}", "bucket": f"s3://{bucket}", "b": bucket}
    inputs, output = [i.format(**names) for i in inputs], output.format(**names)
    code = pack(inputs, output, "--overwrite")
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and says in err, err
    assert "SECRET" not in err and "Traceback" not in err
    assert s3_proxy.count("PUT") == s3_proxy.count("POST") == s3_proxy.count("DELETE") == 0, "nothing written"
