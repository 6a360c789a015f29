"""The scan on Ray and on the S3 server: the parallel scan equals the sequential one, on local
files and on the store; a plan from the scan manifest reads no input byte (the proxy's count);
a changed object is scanned again."""

import json
import os
import random
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.store_runs import ray_reaching

from packfeed.service.data.config import DataConfig, SourceConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.inputs import scan_tasks
from packfeed.service.inputs.files import list_inputs
from packfeed.service.inputs.scan_tasks import ScanItem, scan_sources

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ray_s3(s3_server):
    """A Ray of this module whose workers reach the S3 server (support/store_runs.ray_reaching)."""
    import ray

    with ray_reaching(s3_server.env()):
        yield ray

def write_corpus(root) -> list[str]:
    """JSONL files of every ending (one large, split in many ranges), a Parquet and an Arrow file."""
    rng = random.Random(5)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (rows, ending) in enumerate([(2500, "\n"), (7, ""), (40, "\r\n"), (1, ""), (300, "\n")]):
        lines = [json.dumps({"text": "z" * rng.randrange(0, 90)}) if rng.random() > 0.05 else "" for _ in range(rows)]
        path = root / f"part-{i}.jsonl"
        path.write_text(ending.join(lines) + ending if ending else "\n".join(lines))
        paths.append(str(path))
    table = pa.table({"text": [rng.randbytes(30).hex() for _ in range(60_000)]})  # ~4 MB
    pq.write_table(table, root / "t.parquet", row_group_size=5000)
    with pa.ipc.new_file(root / "t.arrow", table.schema) as writer:
        # batches of 1.3 MB: their headers lie further apart than a read coalesces through
        for batch in table.to_batches(max_chunksize=20_000):
            writer.write_batch(batch)
    return paths + [str(root / "t.arrow"), str(root / "t.parquet")]  # sorted, as a glob lists them


def items_of(paths, stride) -> list[ScanItem]:
    return [ScanItem(f.path, f.kind, f.info, stride) for f in list_inputs(paths)]


def comparable(scans) -> list:
    return [[(os.path.basename(s.path), s.kind, s.num_rows, s.seek_phase, s.seek_offsets.tolist()) for s in source]
            for source in scans]


@pytest.fixture
def on_ray(monkeypatch):
    """Every scan on Ray (this one node too), in ranges of 4 KiB, at most 3 parts a task; counts
    the Ray scans."""
    calls = []
    real = scan_tasks._on_ray

    def spy(items, **kw):
        calls.append(len(items))
        return real(items, **kw)

    monkeypatch.setattr(scan_tasks, "_on_ray", spy)
    monkeypatch.setattr(scan_tasks, "RAY_MIN_BYTES", 0)
    monkeypatch.setattr(scan_tasks, "MIN_RAY_NODES", 1)
    monkeypatch.setattr(scan_tasks, "RANGE_BYTES", 4096)
    monkeypatch.setattr(scan_tasks, "MAX_PARTS_PER_TASK", 3)
    return calls


def cpus_free_again(ray) -> None:
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)


def sequential(sources):
    engine = scan_tasks.choose_engine
    scan_tasks.choose_engine = lambda todo: None
    try:
        return scan_sources(sources)[0]
    finally:
        scan_tasks.choose_engine = engine


def test_the_ray_scan_equals_the_sequential_scan_on_disk_and_on_the_store(ray_s3, s3, tmp_path, on_ray):
    paths = write_corpus(tmp_path / "corpus")
    bucket = s3.bucket()
    s3.upload_tree(tmp_path / "corpus", bucket, "corpus/")
    for stride in (1, 7, 256):
        local = [items_of(paths[:3], stride), items_of(paths[3:], stride)]
        remote = [items_of([f"s3://{bucket}/corpus/part-[0-2].jsonl"], stride),
                  items_of([f"s3://{bucket}/corpus/part-[34].jsonl", f"s3://{bucket}/corpus/t.*"], stride)]
        want = comparable(sequential(local))
        assert comparable(sequential(remote)) == want
        calls = len(on_ray)
        for sources in (local, remote):
            cpus_free_again(ray_s3)  # Ray's view of free CPUs lags the end of the last tasks
            assert comparable(scan_sources(sources)[0]) == want
        assert on_ray[calls:] == [7, 7]  # both on Ray, every file


def test_a_plan_from_the_manifest_reads_no_input_byte_and_a_changed_object_is_scanned_again(
        ray_s3, s3_faulty, s3_proxy, tmp_path):
    paths = write_corpus(tmp_path / "corpus")
    bucket = s3_faulty.bucket()
    keys = s3_faulty.upload_tree(tmp_path / "corpus", bucket, "corpus/")
    config = DataConfig(sources=(SourceConfig(name="a", paths=[f"s3://{bucket}/corpus/*.jsonl"]),
                                 SourceConfig(name="b", paths=[f"s3://{bucket}/corpus/t.*"])),
                        tokenizer="-", seq_len=8, window_samples=64, block_samples=16)
    cache = f"s3://{bucket}/run/.packfeed/scan.npz"

    def input_requests() -> dict[str, int]:
        return {key: n for key in keys if (n := s3_proxy.count(key=key))}

    s3_proxy.reset()
    cold = build_plan(config, scan_cache=cache)
    assert set(input_requests()) == set(keys)  # the first plan reads every input (Parquet, Arrow: the footer)
    for path in paths[5:]:  # Parquet and Arrow IPC: footers and batch headers, not the data
        key = "corpus/" + os.path.basename(path)
        assert s3_proxy.bytes_out("GET", key=key) < os.path.getsize(path) / 10
    s3_proxy.reset()
    warm = build_plan(config, scan_cache=cache)
    assert input_requests() == {}  # a listing and the manifest, no input byte
    assert s3_proxy.count("PUT") == 0  # nothing new: the manifest is not written again
    windows = [warm.window(k) for k in range(warm.num_windows)]
    assert windows == [cold.window(k) for k in range(cold.num_windows)] and warm.fingerprint() == cold.fingerprint()

    # part-4 is the last file of source a: a new version of it is scanned again, nothing else
    s3_faulty.put(bucket, "corpus/part-4.jsonl", b'{"text": "a new version"}\n' * 5)
    s3_proxy.reset()
    again = build_plan(config, scan_cache=cache)
    assert set(input_requests()) == {"corpus/part-4.jsonl"}
    fresh = build_plan(config)
    assert [again.window(k) for k in range(again.num_windows)] == [fresh.window(k) for k in range(fresh.num_windows)]
    assert again.sources[0].num_rows == cold.sources[0].num_rows - 300 + 5


def test_a_corrupt_file_scanned_on_ray_is_the_task_s_one_line(ray_s3, tmp_path, on_ray):
    paths = write_corpus(tmp_path / "corpus")
    (tmp_path / "corpus" / "t.parquet").write_bytes(b"garbage " * 1000)
    cpus_free_again(ray_s3)
    with pytest.raises(ValueError, match=r"t\.parquet.*not a readable parquet file") as err:
        scan_sources([items_of(paths, 256)])
    assert on_ray and "\n" not in str(err.value)
