"""Reading inputs by range: JSONL lines from seek offsets in chunks, Arrow IPC batches through a
learnt index, and listing URIs. Every read equals what reading the whole file gives; on a store
(fsspec's in-process ``memory://``, a remote URI to the storage layer) only the bytes the
pieces need are read."""

from __future__ import annotations

import itertools
import pickle
import random

import fsspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.inputs import arrow_ipc_bytes

from packfeed.service import storage
from packfeed.service.inputs import columnar, fileio
from packfeed.service.inputs.files import list_inputs
from packfeed.service.inputs.fileio import LineRun, read_line_runs

MEMORY = fsspec.filesystem("memory")
SUPPORTED = ".arrow, .feather, .ipc, .json, .jsonl, .md, .ndjson, .parquet, .pq, .txt"
_names = itertools.count()


def put(data: bytes, suffix: str = ".jsonl") -> str:
    """``data`` as a new object on the in-process store; its URI."""
    path = f"/pf-unit/{next(_names)}{suffix}"
    MEMORY.pipe(path, data)
    return f"memory:/{path}"


def lines_of(data: bytes) -> list[bytes]:
    """The lines iterating a binary file gives (each with its b"\\n"; the last may have none)."""
    *whole, rest = data.split(b"\n")
    return [line + b"\n" for line in whole] + ([rest] if rest else [])


def runs_for(lines: list[bytes], picks: list[tuple[int, int, int]]) -> list[LineRun]:
    """Runs (seek row, its offset, start row, rows) from (seek row, start - seek, rows) picks."""
    offsets = [0, *itertools.accumulate(len(line) for line in lines)]
    out = []
    for seek, ahead, n in picks:
        seek = min(seek, len(lines))
        out.append(LineRun(seek, offsets[seek], min(seek + ahead, len(lines)), n))
    return out


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Chunks of a few bytes: every line boundary falls on a chunk boundary somewhere."""
    monkeypatch.setattr(fileio, "FIRST_CHUNK", 7)
    monkeypatch.setattr(fileio, "MIN_CHUNK", 3)
    monkeypatch.setattr(fileio, "MAX_CHUNK", 11)
    monkeypatch.setattr(fileio, "MAX_GAP", 5)


LINE = st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"x"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINE, max_size=30), final_newline=st.booleans(), crlf=st.booleans(),
       picks=st.lists(st.tuples(st.integers(0, 32), st.integers(0, 6), st.integers(0, 12)), min_size=1, max_size=6),
       remote=st.booleans())
def test_line_runs_equal_the_file_read_whole(tiny_chunks, tmp_path_factory, lines, final_newline, crlf, picks, remote):
    """Any runs (out of order, overlapping, past the end), from any seek point, on a local file and
    on a store: each run's lines are exactly those of the file split whole."""
    sep = b"\r\n" if crlf else b"\n"
    data = sep.join(lines) + (sep if final_newline and lines else b"")
    if remote:
        uri = put(data)
    else:
        path = tmp_path_factory.mktemp("runs") / "x.jsonl"
        path.write_bytes(data)
        uri = str(path)
    whole = lines_of(data)
    runs = runs_for(whole, picks)
    assert read_line_runs(uri, runs) == [whole[r.start_row:r.start_row + r.num_rows] for r in runs]


@pytest.mark.parametrize("content, expected", [
    pytest.param(b"", [], id="empty"),
    pytest.param(b"{}", [b"{}"], id="no-final-newline"),
    pytest.param(b"\xef\xbb\xbf{}\r\n{}\r\n", [b"\xef\xbb\xbf{}\r\n", b"{}\r\n"], id="bom-and-crlf"),
    pytest.param(b"\n\n", [b"\n", b"\n"], id="blank-lines"),
    pytest.param(b"a" * 50 + b"\nb", [b"a" * 50 + b"\n", b"b"], id="a-line-longer-than-any-chunk"),
])
def test_line_runs_golden(tiny_chunks, content, expected):
    assert read_line_runs(put(content), [LineRun(0, 0, 0, 10)]) == [expected]


def test_a_run_reads_its_bytes_and_not_the_object():
    """1,000 lines of 1 KiB, 8,000 rows per seek point: a run of 100 lines in the middle reads
    them plus at most one chunk, in a HEAD and at most two GETs; a second run near the first
    continues the same reads."""
    line = b'{"text": "' + b"x" * 1011 + b'"}\n'
    data = line * 10_000
    uri = put(data)
    before = storage.COUNTERS.snapshot()
    (got,) = read_line_runs(uri, [LineRun(0, 0, 5_000, 100)])
    cost = storage.COUNTERS.snapshot() - before
    assert got == [line] * 100
    # the first read is blind (FIRST_CHUNK); the next is sized by the mean line length
    assert cost.requests <= 1 + (5_100 * len(line)) // fileio.MAX_CHUNK + 2
    before = storage.COUNTERS.snapshot()
    (got,) = read_line_runs(uri, [LineRun(5_000, 5_000 * len(line), 5_000, 100)])
    cost = storage.COUNTERS.snapshot() - before
    assert got == [line] * 100 and cost.requests == 2  # the HEAD and one GET
    assert 100 * len(line) <= cost.bytes_read <= fileio.FIRST_CHUNK
    before = storage.COUNTERS.snapshot()
    runs = [LineRun(k, k * len(line), k, 50) for k in (2_000, 2_100, 2_200)]  # 50 KiB gaps: one cursor
    assert read_line_runs(uri, runs) == [[line] * 50] * 3
    assert (storage.COUNTERS.snapshot() - before).requests == 2


# ---- Arrow IPC: batches through the learnt index -----------------------------------------------
@pytest.mark.parametrize("fmt", ["file", "stream"])
@pytest.mark.parametrize("dictionary", [False, True], ids=["plain", "dictionary-encoded"])
@pytest.mark.parametrize("remote", [False, True], ids=["local", "store"])
def test_arrow_ranges_equal_the_table_in_any_order(tmp_path, fmt, dictionary, remote):
    texts = [f"row {i}" for i in range(97)]
    column = pa.array(texts).dictionary_encode() if dictionary else pa.array(texts)
    data = arrow_ipc_bytes(pa.table({"text": column}), stream=fmt == "stream", batch_rows=10)
    if remote:
        uri = put(data, ".arrow")
    else:
        (tmp_path / "t.arrow").write_bytes(data)
        uri = str(tmp_path / "t.arrow")
    expect = storage.stat(uri)  # a known version: the index is kept
    rng = random.Random(0)
    for _ in range(25):
        ranges = [tuple(sorted(rng.sample(range(98), 2))) for _ in range(rng.randint(1, 3))]
        tables = columnar.read_columnar(uri, "arrow", ranges, "text", expect=expect)
        for (lo, hi), table in zip(ranges, tables):
            assert table.column("text").to_pylist() == texts[lo:hi]


@pytest.mark.parametrize("fmt", ["file", "stream"])
def test_a_later_window_of_an_arrow_file_reads_only_its_batches(fmt):
    """The first read learns where batches start; a later one seeks to them: its bytes are its
    batches' and at most a buffer more, wherever they are in the object."""
    texts = ["x" * 4000 + str(i) for i in range(400)]  # 40 batches of ~40 KB
    data = arrow_ipc_bytes(pa.table({"text": texts}), stream=fmt == "stream", batch_rows=10)
    uri = put(data, ".arrow")
    expect = storage.stat(uri)
    columnar.read_columnar(uri, "arrow", [(390, 400)], "text", expect=expect)  # learns every batch
    before = storage.COUNTERS.snapshot()
    (table,) = columnar.read_columnar(uri, "arrow", [(200, 210)], "text", expect=expect)
    cost = storage.COUNTERS.snapshot() - before
    assert table.column("text").to_pylist() == texts[200:210]
    assert cost.bytes_read < 10 * 4_100 + fileio.FIRST_CHUNK and cost.bytes_read < len(data) / 4
    other = storage.ObjectInfo(uri, expect.size, 1, etag="another")  # another version: not its index
    assert columnar._INDEXES.get((uri, other)) is None


# ---- listing URIs ------------------------------------------------------------------------------
def test_uris_list_like_local_paths(tmp_path):
    """Directories, globs and files on a store give what the same tree on disk gives, in the same
    order, with each file's size from the listing, or the same error."""
    tree = {"d/b.jsonl": b"{}\n", "d/a.parquet": b"PAR1", "d/c.txt": b"doc", "d/_meta.jsonl": b"",
            "d/.h.jsonl": b"", "d/README": b"x", "d/sub/e.jsonl": b"{}\n{}\n", "d/sub/deeper/f.arrow": b"A"}
    root = f"/pf-unit/tree{next(_names)}"
    for name, data in tree.items():
        MEMORY.pipe(f"{root}/{name}", data)
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)

    def outcome(base: str, pattern: str) -> list | str:
        try:
            return [(f.path[len(base) + 1:], f.kind, f.info.size) for f in list_inputs(f"{base}/{pattern}")]
        except ValueError as e:
            return str(e).replace(base, "<root>")

    for pattern in ["d", "d/", "d/*.jsonl", "d/**/*.jsonl", "d/**", "d/*", "d/sub/e.jsonl", "**/f.arrow", "*/*/*"]:
        assert outcome(f"memory:/{root}", pattern) == outcome(str(tmp_path), pattern), pattern
    assert outcome(str(tmp_path), "d/*").endswith("README': unknown file type; supported extensions: " + SUPPORTED)
    assert len(outcome(str(tmp_path), "d/**")) == 6  # a glob keeps "_" names; a directory listing does not


@pytest.mark.parametrize("pattern, message", [
    ("nothing/*.jsonl", "the glob matches no file"),
    ("d/*.csv", "unknown file type"),
    ("d/**/*.csv", "the glob matches no supported file"),
    ("nothing/", "no such"),
    ("d/nothing.jsonl", "no such"),
    ("d/README", "unknown file type"),
])
def test_bad_uris_are_one_line_naming_them(pattern, message):
    root = f"/pf-unit/bad{next(_names)}"
    MEMORY.pipe(f"{root}/d/README", b"x")
    MEMORY.pipe(f"{root}/d/a.csv", b"x")
    with pytest.raises(ValueError, match=message) as caught:
        list_inputs(f"memory:/{root}/{pattern}")
    assert "\n" not in str(caught.value) and f"{root}/" in str(caught.value)


def test_a_read_error_raised_in_an_actor_reaches_the_driver_whole():
    """Ray pickles what an actor raises: the one-line error and its kind must survive."""
    error = storage.StorageError("s3://b/k.jsonl", "changed since it was planned (size 3 -> 4)", kind="changed")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is storage.StorageError and str(again) == str(error)
    assert (again.kind, again.uri) == ("changed", "s3://b/k.jsonl")
