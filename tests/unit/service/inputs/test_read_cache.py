"""The read cache (inputs/read_cache.py): whatever the reads, the bytes are the object's; no read
fetches more than it asked for; the kept bytes stay within the capacity, least recently used
out first; a version is its own key. Through ``CachedFile`` a Parquet reader reads a row group
of a file once, and the rows are the ones read without the cache."""

from __future__ import annotations

import io
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packfeed.service import storage
from packfeed.service.inputs import disk_cache, fileio, read_cache
from packfeed.service.inputs.disk_cache import DiskCache
from packfeed.service.inputs.read_cache import CachedFile, ReadCache, cache_key


class Store:
    """An object's bytes and what was fetched of it: (start, end) per request."""

    def __init__(self, data: bytes) -> None:
        self.data, self.fetched = data, []

    def fetch(self, start: int, end: int) -> bytes:
        self.fetched.append((start, end))
        return self.data[start:end]

    def fetched_bytes(self) -> int:
        return sum(b - a for a, b in self.fetched)


@pytest.mark.parametrize("capacity", [0, 1 << 10, 10 << 10, 1 << 20])
@pytest.mark.parametrize("seed", range(4))
def test_reads_give_the_objects_bytes_within_bounds_and_never_fetch_more_than_asked(capacity, seed):
    rng = random.Random(seed)
    objects = {f"s3://b/{i}": Store(rng.randbytes(rng.randint(1, 200_000))) for i in range(3)}
    cache = ReadCache(capacity)
    hits = 0
    for _ in range(300):
        uri = rng.choice(list(objects))
        store = objects[uri]
        size = len(store.data)
        start = rng.randrange(size)
        end = min(size, start + rng.choice([1, 100, 5_000, 70_000]))
        before, requests = store.fetched_bytes(), len(store.fetched)
        got = cache.read((uri, size, 1, "e"), start, end, store.fetch)
        assert got == store.data[start:end]
        fetched = store.fetched_bytes() - before
        assert fetched <= end - start, "a read fetches only inside its own range"
        assert all(start <= a < b <= end for a, b in store.fetched[requests:])
        hits += fetched < end - start
        assert cache.nbytes <= capacity
    if capacity >= 1 << 20:  # everything fits: later reads were served, in part, from memory
        assert hits > 100 and cache.counts.evicted == 0
    if capacity == 0:
        assert len(cache) == 0 and hits == 0


def test_a_second_read_fetches_only_the_gaps_and_gaps_close_together_are_one_request():
    store = Store(bytes(range(256)) * 4_000)  # 1,024,000 bytes
    cache = ReadCache(1 << 20)
    key = ("s3://b/k", len(store.data), 1, "e")
    cache.read(key, 0, 10, store.fetch)
    cache.read(key, 20, 30, store.fetch)
    store.fetched.clear()
    assert cache.read(key, 5, 25, store.fetch) == store.data[5:25] and store.fetched == [(10, 20)]
    store.fetched.clear()
    cache = ReadCache(1 << 20)
    cache.read(key, 0, 10, store.fetch)
    cache.read(key, 20, 30, store.fetch)
    store.fetched.clear()
    assert cache.read(key, 0, 40, store.fetch) == store.data[:40]
    assert store.fetched == [(10, 40)], "two gaps 10 bytes apart: one request, the kept 10 bytes read again"
    store.fetched.clear()
    assert cache.read(key, 0, 40, store.fetch) == store.data[:40] and store.fetched == []
    cache.read(key, 200_000, 300_000, store.fetch)
    store.fetched.clear()
    assert cache.read(key, 0, 400_000, store.fetch) == store.data[:400_000]
    assert store.fetched == [(40, 200_000), (300_000, 400_000)], "gaps 100 KB apart: a request each"


def test_least_recently_used_out_first_and_a_large_read_is_not_kept():
    store = Store(bytes(100_000))
    cache = ReadCache(30_000)
    key = ("s3://b/k", len(store.data), 1, "e")
    for start in (0, 10_000, 20_000):
        cache.read(key, start, start + 10_000, store.fetch)
    cache.read(key, 0, 10_000, store.fetch)  # used again: now the most recent
    cache.read(key, 50_000, 60_000, store.fetch)  # evicts [10k, 20k), the least recently used
    store.fetched.clear()
    cache.read(key, 0, 10_000, store.fetch)
    cache.read(key, 20_000, 30_000, store.fetch)
    assert store.fetched == []
    cache.read(key, 10_000, 20_000, store.fetch)
    assert store.fetched == [(10_000, 20_000)] and cache.counts.evicted >= 1
    before = len(cache)
    cache.read(key, 0, 20_000, store.fetch)  # [10k, 20k) was kept again; the read is served
    cache.read(key, 60_000, 80_000, store.fetch)  # 20 KB > half the capacity: read, not kept
    assert len(cache) <= before and cache.nbytes <= 30_000


def test_another_version_is_another_key_and_an_unknown_version_none():
    v1 = storage.ObjectInfo("s3://b/k", 100, 1_000, etag='"a"')
    v2 = storage.ObjectInfo("s3://b/k", 100, 1_000, etag='"b"')
    assert cache_key("s3://b/k", v1) != cache_key("s3://b/k", v2)
    assert cache_key("s3://b/k", None) is None
    assert cache_key("s3://b/k", storage.ObjectInfo("s3://b/k", None, 1_000, etag='"a"')) is None
    assert cache_key("s3://b/k", storage.ObjectInfo("s3://b/k", 100, None)) is None
    old, new = Store(b"a" * 100), Store(b"b" * 100)
    cache = ReadCache(1 << 20)
    assert cache.read(cache_key("s3://b/k", v1), 0, 100, old.fetch) == b"a" * 100
    assert cache.read(cache_key("s3://b/k", v2), 0, 100, new.fetch) == b"b" * 100, "never the old version's bytes"


def test_the_capacity_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(read_cache.CAPACITY_ENV, "64")
    assert read_cache.capacity_from_env() == 64 << 20
    monkeypatch.setenv(read_cache.CAPACITY_ENV, "0")
    assert read_cache.capacity_from_env() == 0
    monkeypatch.setenv(read_cache.CAPACITY_ENV, "lots")
    with pytest.raises(ValueError, match="PACKFEED_READ_CACHE_MIB must be a whole number of MiB >= 0"):
        read_cache.capacity_from_env()
    monkeypatch.delenv(read_cache.CAPACITY_ENV)
    assert read_cache.capacity_from_env() == read_cache.DEFAULT_CAPACITY


class CountingFile(io.BytesIO):
    """An in-memory object as ``storage.open_input`` gives it, counting the bytes read."""

    read_bytes = 0

    def read(self, n: int = -1) -> bytes:
        data = super().read(n)
        CountingFile.read_bytes += len(data)
        return data

    def size(self) -> int:
        return len(self.getbuffer())


def test_a_parquet_reader_through_the_cache_reads_each_row_group_once_and_the_same_rows():
    table = pa.table({"text": [f"row {i} " * 20 for i in range(2_000)], "n": list(range(2_000))})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=250)
    data = sink.getvalue()
    cache = ReadCache(1 << 20)
    key = ("s3://b/t.parquet", len(data), 1, "e")
    CountingFile.read_bytes = 0
    rng = random.Random(0)
    for _ in range(20):  # windows: a few row groups each, in any order
        groups = sorted(rng.sample(range(8), 3))
        with pa.PythonFile(CachedFile(CountingFile(data), key, cache), mode="r") as f:
            got = pq.ParquetFile(f).read_row_groups(groups, columns=["text"])
        assert got.equals(pq.ParquetFile(pa.BufferReader(data)).read_row_groups(groups, columns=["text"]))
    assert CountingFile.read_bytes <= len(data), "every byte of the file fetched once at most"


def test_open_input_caches_only_a_known_version_on_a_store(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text": "a"}\n')
    local = fileio.open_input(str(path), expect=storage.stat(str(path)))
    assert not isinstance(local, pa.PythonFile), "a local file is read as it is"
    local.close()


# ---- the node's disk cache, shared by its processes --------------------------------------------
@pytest.mark.parametrize("seed", range(3))
def test_the_disk_cache_gives_the_objects_bytes_and_fetches_each_byte_once(tmp_path, seed):
    rng = random.Random(seed)
    store = Store(rng.randbytes(300_000))
    key = ("s3://b/k", len(store.data), 1, '"etag"')
    first, second = DiskCache(str(tmp_path), 1 << 20), DiskCache(str(tmp_path), 1 << 20)  # two processes
    for _ in range(200):
        start = rng.randrange(len(store.data))
        end = min(len(store.data), start + rng.choice([10, 3_000, 40_000]))
        before = len(store.fetched)
        assert rng.choice([first, second]).read(key, start, end, store.fetch) == store.data[start:end]
        assert all(start <= a < b <= end for a, b in store.fetched[before:])
    assert store.fetched_bytes() <= len(store.data), "a byte one process fetched, the other read from disk"
    other = ("s3://b/k", len(store.data), 1, '"another"')
    assert first.read(other, 0, 10, Store(b"z" * 300_000).fetch) == b"z" * 10, "another version: another directory"


def test_the_disk_cache_trims_the_oldest_extents_and_stops_writing_when_it_thrashes(tmp_path):
    store = Store(bytes(1_000_000))
    cache = DiskCache(str(tmp_path), 100_000)
    key = ("s3://b/k", len(store.data), 1, '"etag"')
    for start in range(0, 140_000, 20_000):  # 7 extents of 20 KB: trimmed past 100 KB, to 75 KB
        cache.read(key, start, start + 20_000, store.fetch)
    assert cache.nbytes() <= 100_000
    store.fetched.clear()
    cache.read(key, 120_000, 140_000, store.fetch)  # the newest: kept
    assert store.fetched == []
    cache.read(key, 0, 20_000, store.fetch)  # the oldest: trimmed, fetched again (and kept: 160 KB written)
    assert store.fetched == [(0, 20_000)]
    for start in range(140_000, 240_000, 20_000):  # past 2x the capacity written: no more writes
        cache.read(key, start, start + 20_000, store.fetch)
    store.fetched.clear()
    cache.read(key, 220_000, 240_000, store.fetch)
    assert store.fetched == [(220_000, 240_000)] and cache.nbytes() <= 100_000


def test_the_disk_cache_is_where_the_environment_says_or_off(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_cache.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.delenv(disk_cache.DIR_ENV, raising=False)
    monkeypatch.delenv(disk_cache.CAPACITY_ENV, raising=False)
    default = disk_cache.disk_cache_from_env()
    assert default.root == str(tmp_path / f"packfeed-read-cache-{os.getuid()}")
    assert oct(os.stat(default.root).st_mode & 0o777) == oct(0o700)
    monkeypatch.setenv(disk_cache.DIR_ENV, "off")
    assert disk_cache.disk_cache_from_env() is None
    monkeypatch.setenv(disk_cache.DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(disk_cache.CAPACITY_ENV, "5")
    made = disk_cache.disk_cache_from_env()
    assert made is not None and made.capacity <= 5 << 20 and (tmp_path / "cache").is_dir()
    monkeypatch.setenv(disk_cache.CAPACITY_ENV, "-1")
    with pytest.raises(ValueError, match="PACKFEED_READ_CACHE_DISK_MIB must be a whole number"):
        disk_cache.disk_cache_from_env()
