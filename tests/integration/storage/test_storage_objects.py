"""Reads by range equal the local bytes; coalescing and requests are counted; writes are whole."""

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packfeed.service.storage import (
    COUNTERS,
    ObjectInfo,
    StorageError,
    coalesce,
    delete_prefix,
    exists,
    expand,
    open_input,
    read_bytes,
    read_range,
    read_ranges,
    stat,
    write_bytes_atomic,
)
from packfeed.service.storage.objects import CHANGED
from packfeed.service.storage.reads import MIN_REQUEST, coalesce_members

pytestmark = pytest.mark.integration

SIZE = 300_000
DATA = random.Random(7).randbytes(SIZE)


def _range_sweep(rng, n):
    """Ranges of every kind: empty, one byte, at both ends, past the end, large, overlapping."""
    fixed = [(0, 0), (0, 1), (SIZE - 1, 1), (SIZE - 10, 100), (SIZE, 5), (SIZE + 50, 5), (0, SIZE), (1000, 70_000)]
    random_ones = [(rng.randrange(SIZE), rng.choice([1, 17, 4096, 65_536, 200_000])) for _ in range(n)]
    return fixed + random_ones


@pytest.mark.parametrize("ranges, max_gap, spans", [
    pytest.param([(0, 10), (15, 5), (100, 10)], 5, [(0, 20), (100, 110)], id="gap-within-limit-merges"),
    pytest.param([(0, 10), (16, 5)], 5, [(0, 10), (16, 21)], id="gap-over-limit-splits"),
    pytest.param([(50, 10), (0, 10)], 100, [(0, 60)], id="unsorted"),
    pytest.param([(0, 100), (10, 5)], 0, [(0, 100)], id="contained"),
    pytest.param([(0, 0), (5, 0)], 10, [], id="empty-ranges-request-nothing"),
])
def test_coalesce_golden(ranges, max_gap, spans):
    assert coalesce(ranges, max_gap=max_gap, max_request=1 << 20) == spans


def test_coalesce_properties():
    rng = random.Random(3)
    for _ in range(300):
        ranges = [(rng.randrange(10_000), rng.randrange(0, 500)) for _ in range(rng.randrange(1, 30))]
        max_gap, max_request = rng.choice([0, 10, 300]), rng.choice([400, 2000, 1 << 20])
        spans = coalesce_members(ranges, max_gap=max_gap, max_request=max_request)
        held = sorted(i for _, _, members in spans for i in members)
        assert held == [i for i, (_, length) in enumerate(ranges) if length > 0]  # each non-empty range once
        for start, end, members in spans:
            assert all(start <= ranges[i][0] and ranges[i][0] + ranges[i][1] <= end for i in members)
            assert end - start <= max(max_request, max(ranges[i][1] for i in members))
        for (start_a, end_a, _), (start_b, end_b, _) in zip(spans, spans[1:]):  # why they stayed apart
            assert start_b - end_a > max_gap or max(end_a, end_b) - start_a > max_request
        assert len(spans) <= len(held)


@pytest.fixture
def stored(s3_faulty, tmp_path):
    local = tmp_path / "blob.bin"
    local.write_bytes(DATA)
    bucket = s3_faulty.bucket()
    return local, s3_faulty.put(bucket, "dir/blob.bin", DATA)


def test_read_range_equals_local_bytes(stored, s3_proxy):
    import fsspec

    local, uri = stored
    fsspec.filesystem("memory").pipe("/objects-test/blob.bin", DATA)
    rng = random.Random(11)
    for offset, length in _range_sweep(rng, 40):
        expected = DATA[offset:offset + length]
        assert read_range(str(local), offset, length) == expected
        assert read_range("memory://objects-test/blob.bin", offset, length) == expected
        s3_proxy.reset()
        before = COUNTERS.snapshot()
        assert read_range(uri, offset, length) == expected, (offset, length)
        asked = length > 0 and offset < SIZE
        assert s3_proxy.count("HEAD") == 1 and s3_proxy.count("GET") == int(asked)
        delta = COUNTERS.snapshot() - before
        assert delta.requests == 1 + int(asked) and delta.retries == 0
        # a short range is asked with MIN_REQUEST bytes around it (reads.py): the counts are the wire's
        wire = s3_proxy.bytes_out("GET")
        assert delta.bytes_read == wire == (max(len(expected), min(MIN_REQUEST, SIZE)) if asked else 0)


def test_read_ranges_coalesce_into_one_request_per_span(stored, s3_proxy):
    local, uri = stored
    rng = random.Random(5)
    merged_somewhere = False
    for trial in range(25):
        ranges = _range_sweep(rng, rng.randrange(1, 12))[8:] if trial % 2 else _range_sweep(rng, 4)
        max_gap = rng.choice([0, 1000, 100_000])
        max_request = rng.choice([70_000, 1 << 20])
        s3_proxy.reset()
        before = COUNTERS.snapshot()
        got = read_ranges(uri, ranges, max_gap=max_gap, max_request=max_request)
        assert got == read_ranges(str(local), ranges, max_gap=max_gap, max_request=max_request)
        assert got == [DATA[o:o + n] for o, n in ranges]
        clamped = [(min(o, SIZE), max(0, min(o + n, SIZE) - min(o, SIZE))) for o, n in ranges]
        spans = coalesce(clamped, max_gap=max_gap, max_request=max_request)
        gets = s3_proxy.select("GET")
        assert len(gets) == len(spans) and s3_proxy.count("HEAD") == 1
        on_wire = sum(max(end - start, min(MIN_REQUEST, SIZE)) for start, end in spans)  # short spans ask 4 KiB
        assert sum(r.bytes_out for r in gets) == on_wire
        assert (COUNTERS.snapshot() - before).bytes_read == on_wire
        merged_somewhere |= len(spans) < sum(1 for _, n in clamped if n)
    assert merged_somewhere


def test_stat_and_the_changed_object_check(stored, s3_faulty):
    local, uri = stored
    info = stat(uri)
    assert info.size == SIZE and info.etag and info.mtime_ns > 0 and not info.is_dir
    listed = expand(uri.rsplit("/", 1)[0] + "/*.bin")[0]
    assert (listed.size, listed.mtime_ns // 10**9) == (info.size, info.mtime_ns // 10**9)
    assert read_range(uri, 10, 5, expect=info) == DATA[10:15]
    assert read_range(uri, 10, 5, expect=listed) == DATA[10:15]  # a listing's info serves as well
    bucket, key = uri[len("s3://"):].split("/", 1)
    for changed in (DATA[:-1], DATA[::-1]):  # another size; the same size, another ETag
        s3_faulty.put(bucket, key, changed)
        with pytest.raises(StorageError) as error:
            read_range(uri, 0, 5, expect=info)
        assert error.value.kind == CHANGED and str(error.value).startswith(f"{uri}: changed since it was planned")
    local_info = stat(str(local))
    assert (local_info.size, local_info.etag) == (SIZE, None)
    local.write_bytes(DATA[::-1])
    with pytest.raises(StorageError, match="changed since it was planned"):
        read_range(str(local), 0, 5, expect=ObjectInfo(str(local), SIZE, local_info.mtime_ns - 10**9))


def test_open_input_reads_parquet_by_ranges(s3_faulty, s3_proxy, tmp_path):
    table = pa.table({"text": [f"row {i} " * 20 for i in range(20_000)], "n": list(range(20_000))})
    local = tmp_path / "t.parquet"
    pq.write_table(table, local, row_group_size=2_000)
    bucket = s3_faulty.bucket()
    uri = s3_faulty.put(bucket, "t.parquet", local.read_bytes())
    s3_proxy.reset()
    before = COUNTERS.snapshot()
    parquet = pq.ParquetFile(open_input(uri))
    assert parquet.read_row_group(3).equals(pq.ParquetFile(open_input(str(local))).read_row_group(3))
    read = (COUNTERS.snapshot() - before).bytes_read
    # the footer (Arrow reads the last 64 KiB at once) and one of ten row groups: never the whole object
    meta = parquet.metadata.row_group(3)
    group = sum(meta.column(c).total_compressed_size for c in range(meta.num_columns))
    assert read == s3_proxy.bytes_out("GET") and group < read < (64 << 10) + 2 * group < local.stat().st_size
    assert pq.read_table(open_input(uri)).equals(table)


def test_write_read_delete(s3_faulty, s3_proxy, tmp_path):
    s3 = s3_faulty
    bucket = s3.bucket()
    for base in (f"s3://{bucket}/run", str(tmp_path / "run")):
        names = ["data/part-0.parquet", "data/part-1.parquet", "meta/stats.json", "notes/mine.txt"]
        for i, name in enumerate(names):
            if not base.startswith("s3://"):
                (tmp_path / "run" / name).parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(f"{base}/{name}", f"{name} {i}".encode())
        assert read_bytes(f"{base}/meta/stats.json") == b"meta/stats.json 2"
        s3_proxy.reset()
        write_bytes_atomic(f"{base}/meta/stats.json", b"{}")  # replaced whole
        assert s3_proxy.count() == (1 if base.startswith("s3://") else 0)  # one PUT
        assert read_bytes(f"{base}/meta/stats.json") == b"{}"
        s3_proxy.reset()
        ours = delete_prefix(base, only=lambda rel: rel.startswith(("data/", "meta/")))
        assert ours == [f"{base}/{n}" for n in names[:3]]
        if base.startswith("s3://"):  # one listing, one DELETE per object of ours
            assert s3_proxy.count(lists=True) == 1 and s3_proxy.count("DELETE") == 3
        assert [exists(f"{base}/{n}") for n in names] == [False, False, False, True]
        assert delete_prefix(base, only=lambda rel: rel.startswith("data/")) == []
        assert delete_prefix(base) == [f"{base}/notes/mine.txt"] and not exists(f"{base}/notes/mine.txt")
    assert not list(tmp_path.glob("run/**/*.tmp"))  # no temporary file left behind
