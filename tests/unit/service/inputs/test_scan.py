"""The scan of input files: row counts and seek offsets, sequential or in byte ranges; the scan
manifest and when its entries still hold; a plan that reuses it reads no input byte.

The oracle is a plain Python split of the bytes (``expected_scan``): every engine (one pass,
ranges of a few bytes combined in file order, a pool of threads over several files and
sources) must give exactly its rows and offsets."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random

import numpy as np
import pyarrow as pa
import pytest
from support.inputs import write_arrow_ipc

from packfeed.service.data.config import DataConfig, SourceConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.inputs import ipc_footer
from packfeed.service.inputs import scan as scan_module
from packfeed.service.inputs import scan_tasks
from packfeed.service.inputs.scan import FileScan, scan_file, seek_phase
from packfeed.service.inputs.scan_cache import ScanManifest, encode, same_version
from packfeed.service.inputs.scan_tasks import ScanItem, combine, scan_parts, scan_sources, split_parts
from packfeed.service.storage import COUNTERS, ObjectInfo, stat


def expected_scan(data: bytes, first_row: int, stride: int) -> tuple[int, list[int]]:
    """(rows, seek offsets) by the definition: a row is a line; seek points are row 0 and the
    rows r with (first_row + r) % stride == 0."""
    rows = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    starts = [0] + [i + 1 for i, byte in enumerate(data) if byte == 10]
    return rows, [starts[r] for r in range(max(rows, 1)) if r == 0 or (first_row + r) % stride == 0]


CONTENTS = {
    "empty-file": b"",
    "one-row-no-newline": b"{}",
    "no-trailing-newline": b'{"a": 1}\n{"b": 22}\n{"c": 333}',
    "crlf": b"{}\r\n{}\r\n\r\n{}\r\n",
    "empty-lines": b"\n\n{}\n\n\n{}\n\n",
    "only-newlines": b"\n" * 9,
    "three-byte-lines": b"ab\n" * 12,  # ranges of 3 end right after a newline; of 2 and 4, on one
}


def random_content(rng: random.Random) -> bytes:
    lines = [b"x" * rng.choice([0, 0, 1, 2, 5, 17]) for _ in range(rng.randrange(0, 60))]
    return b"\n".join(lines) + (b"\n" if rng.random() < 0.5 else b"")


def sweep() -> list:
    rng = random.Random(11)
    cases = [pytest.param(data, id=name) for name, data in CONTENTS.items()]
    return cases + [pytest.param(random_content(rng), id=f"random-{i}") for i in range(12)]


def item(path, stride: int, kind: str = "jsonl") -> ScanItem:
    return ScanItem(str(path), kind, stat(str(path)), stride)


@pytest.mark.parametrize("data", sweep())
def test_sequential_scan_equals_the_definition(tmp_path, monkeypatch, data):
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    for chunk in (1, 2, 3, 7, 1 << 20):
        monkeypatch.setattr(scan_module, "SCAN_CHUNK", chunk)
        for stride in (1, 2, 3, 4, 256):
            for first_row in (0, 1, 5):
                scan = scan_file(str(path), "jsonl", first_row=first_row, stride=stride)
                rows, offsets = expected_scan(data, first_row, stride)
                assert (scan.num_rows, scan.seek_offsets.tolist()) == (rows, offsets), (chunk, stride, first_row)
                assert (scan.size, scan.mtime_ns) == (len(data), os.stat(path).st_mtime_ns)


@pytest.mark.parametrize("data", sweep())
def test_byte_ranges_combine_to_the_sequential_scan(tmp_path, monkeypatch, data):
    """Ranges of 1..9 bytes (boundaries on and beside every newline), counted separately and
    combined in file order, give the one-pass scan's rows and offsets at every phase."""
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    monkeypatch.setattr(scan_module, "SCAN_CHUNK", 2)
    for range_bytes in (1, 2, 3, 4, 9):
        monkeypatch.setattr(scan_tasks, "RANGE_BYTES", range_bytes)
        for stride in (1, 3, 4):
            it = item(path, stride)
            tasks, per_item = split_parts([it])
            parts = [p for task in tasks for p in task]
            assert per_item == [len(parts)] and len(parts) == max(1, -(-len(data) // range_bytes))
            raw = [r for task in tasks for r in scan_parts(task)]
            assert all(r[1].dtype == np.uint32 for r in raw)
            for first_row in (0, 1, 2, 7):
                got = combine(it, raw, seek_phase(first_row, stride))
                want = scan_file(str(path), "jsonl", first_row=first_row, stride=stride)
                assert got.num_rows == want.num_rows == expected_scan(data, first_row, stride)[0]
                assert got.seek_offsets.tolist() == want.seek_offsets.tolist(), (range_bytes, stride, first_row)


@pytest.mark.parametrize("phase, stride, rows", [(0, 4, 13), (3, 4, 13), (1, 1, 5), (2, 256, 3), (0, 256, 700)])
def test_seek_finds_the_last_seek_point_at_or_before_a_row(phase, stride, rows):
    seek_rows = [0] + [r for r in range(1, rows) if (r - phase) % stride == 0]
    scan = FileScan("f.jsonl", "jsonl", rows, seek_offsets=np.asarray(seek_rows, np.int64) * 10, seek_phase=phase,
                    seek_stride=stride)
    for row in range(rows):
        want = max(r for r in seek_rows if r <= row)
        assert scan.seek(row) == (want, want * 10)


def write_files(directory, sizes, *, seed=0) -> list[str]:
    rng = random.Random(seed)
    paths = []
    for i, n in enumerate(sizes):
        path = directory / f"part-{i:02d}.jsonl"
        path.write_text("".join(json.dumps({"text": "y" * rng.randrange(0, 30)}) + "\n" for _ in range(n)))
        paths.append(str(path))
    return paths


def test_parallel_engine_equals_the_inline_scan_across_files_and_sources(tmp_path, monkeypatch):
    """Threads over byte ranges of many files in two sources: every file's rows and offsets as
    the one-by-one scan finds them (each file's phase follows the rows of the files before it)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_files(tmp_path / "a", [13, 0, 40, 7, 1], seed=1)
    b = write_files(tmp_path / "b", [5, 22, 9], seed=2)
    sources = [[item(p, 4) for p in a], [item(p, 3) for p in b]]
    inline, n = scan_sources(sources)
    assert n == 8
    monkeypatch.setattr(scan_tasks, "RANGE_BYTES", 50)
    monkeypatch.setattr(scan_tasks, "MAX_PARTS_PER_TASK", 3)
    monkeypatch.setattr(scan_tasks, "choose_engine", lambda todo: scan_tasks._on_threads if todo else None)
    threaded, _ = scan_sources(sources)
    for xs, ys in zip(inline, threaded):
        for x, y in zip(xs, ys):
            assert (x.path, x.num_rows, x.seek_phase, x.seek_offsets.tolist()) == \
                   (y.path, y.num_rows, y.seek_phase, y.seek_offsets.tolist())
    assert [s.seek_phase for s in inline[0]] == [0, (-13) % 4, (-13) % 4, (-53) % 4, (-60) % 4]


FIELDS = [f.name for f in dataclasses.fields(FileScan) if f.name != "seek_offsets"]


def test_manifest_round_trip(tmp_path):
    scans = [
        FileScan("/d/a.jsonl", "jsonl", 700, size=9000, mtime_ns=17, seek_offsets=np.asarray([0, 40, 90], np.int64),
                 seek_phase=3, seek_stride=256),
        FileScan("s3://b/k/x.parquet", "parquet", 12, size=4096, mtime_ns=2 * 10**18, etag='"abc"'),
        FileScan("/d/t.txt", "text", 1, size=5, mtime_ns=1),
    ]
    path = str(tmp_path / "deep" / "scan.npz")
    ScanManifest.save(path, scans)
    loaded = ScanManifest.load(path)
    assert loaded.num_scans == 3
    for s in scans:
        (got,) = loaded.matching(s.path, s.kind, s.info(), s.seek_stride)
        assert [getattr(got, f) for f in FIELDS] == [getattr(s, f) for f in FIELDS]
        assert got.seek_offsets.tolist() == s.seek_offsets.tolist()
    assert ScanManifest.load(str(tmp_path / "none.npz")).num_scans == 0  # not there yet: no error


def another_version() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, header=np.frombuffer(json.dumps({"format": "packfeed-scan", "version": 99}).encode(), np.uint8))
    return buffer.getvalue()


@pytest.mark.parametrize("content, message", [
    pytest.param(b"not a zip", "unreadable", id="garbage"),
    pytest.param(encode([FileScan("/a.jsonl", "jsonl", 1)])[:-40], "unreadable", id="truncated"),
    pytest.param(another_version(), "version 99", id="another-version"),
])
def test_an_unreadable_manifest_is_warned_about_and_ignored(tmp_path, caplog, content, message):
    path = tmp_path / "scan.npz"
    path.write_bytes(content)
    assert ScanManifest.load(str(path)).num_scans == 0
    assert message in caplog.text


LOCAL = FileScan("/d/a.jsonl", "jsonl", 3, size=100, mtime_ns=1_500_000_123)
REMOTE = FileScan("s3://b/a.jsonl", "jsonl", 3, size=100, mtime_ns=1_700_000_000_250_000_000, etag='"e1"')


@pytest.mark.parametrize("scan, now, same", [
    pytest.param(LOCAL, ObjectInfo("/d/a.jsonl", 100, 1_500_000_123), True, id="local-unchanged"),
    pytest.param(LOCAL, ObjectInfo("/d/a.jsonl", 101, 1_500_000_123), False, id="local-size"),
    pytest.param(LOCAL, ObjectInfo("/d/a.jsonl", 100, 1_500_000_124), False, id="local-mtime-to-the-ns"),
    pytest.param(LOCAL, ObjectInfo("/d/a.jsonl", None, None), False, id="unknown-identity"),
    pytest.param(REMOTE, ObjectInfo("s3://b/a.jsonl", 100, 1_700_000_000_000_000_000), True,
                 id="listing-without-etag-same-second"),
    pytest.param(REMOTE, ObjectInfo("s3://b/a.jsonl", 100, 1_700_000_001_000_000_000), False,
                 id="listing-without-etag-next-second"),
    pytest.param(REMOTE, ObjectInfo("s3://b/a.jsonl", 100, 1_700_000_009_000_000_000, etag='"e1"'), True,
                 id="same-etag-decides"),
    pytest.param(REMOTE, ObjectInfo("s3://b/a.jsonl", 100, 1_700_000_000_000_000_000, etag='"e2"'), False,
                 id="another-etag"),
    pytest.param(REMOTE, ObjectInfo("s3://b/a.jsonl", 99, 1_700_000_000_000_000_000, etag='"e1"'), False,
                 id="remote-size"),
])
def test_an_entry_holds_while_the_identity_is_the_same(scan, now, same):
    assert same_version(scan, now) is same
    assert bool(ScanManifest([scan]).matching(scan.path, "jsonl", now, 0)) is same


def data_config(paths, **kw) -> DataConfig:
    return DataConfig(sources=(SourceConfig(name="a", paths=paths[:3]), SourceConfig(name="b", paths=paths[3:])),
                      tokenizer="-", seq_len=8, window_samples=16, block_samples=4, **kw)


def windows(plan) -> list:
    return [plan.window(k) for k in range(plan.num_windows)]


def test_a_plan_from_the_manifest_reads_no_input_and_a_changed_file_is_scanned_again(tmp_path, monkeypatch):
    paths = write_files(tmp_path, [13, 9, 30, 11, 6], seed=3)
    cache = str(tmp_path / "out" / ".packfeed" / "scan.npz")
    cold = build_plan(data_config(paths), scan_cache=cache)
    assert windows(cold) == windows(build_plan(data_config(paths)))  # the cache changes nothing planned
    stamp = os.stat(cache).st_mtime_ns

    opened: list[str] = []
    real_open = scan_module.open_input

    def counting_open(path, **kw):
        opened.append(os.path.basename(path))
        return real_open(path, **kw)

    monkeypatch.setattr(scan_module, "open_input", counting_open)
    monkeypatch.setattr(scan_tasks, "open_input", counting_open)
    warm = build_plan(data_config(paths), scan_cache=cache)
    assert opened == [] and os.stat(cache).st_mtime_ns == stamp  # nothing read, nothing rewritten
    assert windows(warm) == windows(cold) and warm.fingerprint() == cold.fingerprint()

    # part-00 gains 2 rows: it is scanned again, and so are part-01 and part-02, whose seek
    # points move (their first rows within source a shift by 2, not a multiple of the stride 4)
    with open(paths[0], "a") as f:
        f.write('{"text": "new"}\n{"text": "newer"}\n')
    again = build_plan(data_config(paths), scan_cache=cache)
    assert sorted(opened) == ["part-00.jsonl", "part-01.jsonl", "part-02.jsonl"]
    fresh = build_plan(data_config(paths))
    assert windows(again) == windows(fresh) and again.fingerprint() == fresh.fingerprint()

    opened.clear()  # a touch without a change of content: mtime differs, the file is read again
    os.utime(paths[4], ns=(1, 1))
    build_plan(data_config(paths), scan_cache=cache)
    assert opened == ["part-04.jsonl"]


def write_arrow(path, batches: list[int], *, stream: bool, dictionary: bool = False) -> int:
    """An Arrow IPC file (or stream) of batches of these sizes; returns the rows."""
    tag = [("tag", pa.dictionary(pa.int32(), pa.string()))] if dictionary else []
    schema = pa.schema([("text", pa.string()), *tag])
    open_writer = pa.ipc.new_stream if stream else pa.ipc.new_file
    with open_writer(path, schema) as writer:
        for n in batches:
            columns = [pa.array([f"row {i}" for i in range(n)], pa.string())]
            if dictionary:
                columns.append(pa.DictionaryArray.from_arrays(pa.array([i % 2 for i in range(n)], pa.int32()),
                                                              pa.array(["a", "b"])))
            writer.write_batch(pa.record_batch(columns, schema=schema))
    return sum(batches)


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
@pytest.mark.parametrize("batches, dictionary", [
    pytest.param([1000], False, id="one-batch"),
    pytest.param([10, 0, 990, 3], False, id="several-one-empty"),
    pytest.param([], False, id="no-batch"),
    pytest.param([7], True, id="dictionary-column"),
    pytest.param([5000] * 40, False, id="headers-beyond-the-footer-read"),
])
def test_arrow_rows_from_the_footer_equal_the_batches(tmp_path, monkeypatch, stream, batches, dictionary):
    path = str(tmp_path / "x.arrow")
    rows = write_arrow(path, batches, stream=stream, dictionary=dictionary)
    monkeypatch.setattr(ipc_footer, "TAIL_BYTES", 64)  # the footer itself takes a second read
    assert scan_file(path, "arrow").num_rows == rows
    assert (ipc_footer.ipc_file_rows(path, os.path.getsize(path)) is None) is stream


def test_a_broken_arrow_footer_names_the_file(tmp_path):
    path = tmp_path / "x.arrow"
    write_arrow(str(path), [10, 20], stream=False)
    data = bytearray(path.read_bytes())
    data[-10:-6] = (len(data) * 2).to_bytes(4, "little")  # a footer longer than the file
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"x\.arrow.*not a readable arrow file"):
        scan_file(str(path), "arrow")


@pytest.mark.parametrize("name, kind, message", [
    pytest.param("bad.parquet", "parquet", "not a readable parquet file", id="parquet-garbage"),
    pytest.param("cut.parquet", "parquet", "not a readable parquet file", id="parquet-truncated"),
    pytest.param("bad.arrow", "arrow", "not an Arrow IPC file or stream", id="arrow-garbage"),
])
def test_a_corrupt_file_is_one_line_naming_it(tmp_path, name, kind, message):
    import pyarrow.parquet as pq

    path = tmp_path / name
    if name.startswith("cut"):
        pq.write_table(pa.table({"text": ["x"] * 100}), path)
        path.write_bytes(path.read_bytes()[:-20])
    else:
        path.write_bytes(b"garbage " * 100)
    with pytest.raises(ValueError, match=f"{name}.*{message}") as err:
        scan_file(str(path), kind)
    assert "\n" not in str(err.value)


@pytest.fixture
def memory_store(tmp_path):
    """A store without a socket: fsspec's in-memory filesystem (``memory://``), which the
    storage layer serves like any remote one (requests and bytes counted)."""
    import fsspec

    fs, root = fsspec.filesystem("memory"), f"/scan-test-{tmp_path.name}"
    yield fs, root
    fs.rm(root, recursive=True)


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_arrow_on_a_store_costs_a_few_requests(memory_store, stream):
    """A stream is read whole in requests of SCAN_CHUNK, not a request per message; a file of
    large batches by its footer and batch headers, not its bodies."""
    fs, root = memory_store
    table = pa.table({"text": [f"{i:040d}" for i in range(120_000)]})  # ~5.3 MB
    with fs.open(f"{root}/x.arrow", "wb") as f:  # 1.3 MB batches in the file
        write_arrow_ipc(f, table, stream=stream, batch_rows=300 if stream else 30_000)
    uri, size = f"memory:/{root}/x.arrow", fs.size(f"{root}/x.arrow")
    before = COUNTERS.snapshot()
    assert scan_file(uri, "arrow").num_rows == 120_000
    used = COUNTERS.snapshot() - before
    if stream:
        # the tail that shows it has no footer, then the stream from its start
        assert used.bytes_read == size + ipc_footer.TAIL_BYTES and used.requests <= 5 + size // scan_module.SCAN_CHUNK
    else:
        assert used.bytes_read < size / 10 and used.requests <= 4 + 4  # stat, tail, then 4 headers


def test_a_corrupt_stream_on_a_store_fails_at_once(memory_store):
    fs, root = memory_store
    fs.pipe(f"{root}/bad.arrow", b"garbage " * 100)  # a header claiming 1.6 GB of metadata
    with pytest.raises(ValueError, match="bad.arrow.*not an Arrow IPC file or stream"):
        scan_file(f"memory:/{root}/bad.arrow", "arrow")
