"""Inputs on S3 (moto on 127.0.0.1) read exactly as the same files on disk, by range, retried,
and never from another version of an object than the plan saw.

One corpus of every input kind (JSONL with bad rows, without a final newline, with CRLF and a
BOM; chat and prompt/completion rows; Parquet with several row groups; Arrow IPC file and
stream; text documents; a ``save_to_disk`` dataset) is written to a local directory and
uploaded under a prefix. Listing, planning and reading the URIs must give what the local paths
give: the same files in the same order, the same records, sample ids and skips in every window.
The proxy of tests/support/s3.py counts the requests and bytes of a window, and fails requests.
"""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.inputs import arrow_ipc_bytes

from packfeed.service import storage
from packfeed.service.data.config import DataConfig, SourceConfig
from packfeed.service.data.plan import build_plan
from packfeed.service.errors import user_message
from packfeed.service.inputs import fileio
from packfeed.service.inputs.files import list_inputs
from packfeed.service.inputs.read import read_window
from packfeed.service.inputs.read_cache import reset_shared_caches

pytestmark = pytest.mark.integration

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
PREFIX = "corpus"


def _jsonl(rows, *, sep=b"\n", final=True, bom=False) -> bytes:
    lines = [r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows]
    return (b"\xef\xbb\xbf" if bom else b"") + sep.join(lines) + (sep if final else b"")


def _write_corpus(root) -> None:
    texts = [{"text": f"doc {i} " + "word " * (i % 9)} for i in range(30)]
    files = {
        "jsonl/a.jsonl": _jsonl([*texts[:10], b"", b"{oops", b"[1]", {"txt": "x"}, *texts[10:20]]),
        "jsonl/b-no-final-newline.jsonl": _jsonl(texts[:7], final=False),
        "jsonl/c-crlf.jsonl": _jsonl(texts[5:16], sep=b"\r\n"),
        "jsonl/d-bom.jsonl": _jsonl(texts[:6], bom=True),
        "chat/messages.jsonl": _jsonl([{"messages": CHAT}] * 5 + [{"messages": []}] + [{"messages": CHAT[:1]}] * 4),
        "chat/pc.ndjson": _jsonl([{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(9)]),
        "columnar/p.parquet": None,
        "columnar/f.arrow": arrow_ipc_bytes(pa.Table.from_pylist(texts), stream=False, batch_rows=4),
        "columnar/s.arrow": arrow_ipc_bytes(pa.Table.from_pylist(texts[:23]), stream=True, batch_rows=5),
        "docs/a.txt": b"first document\n",
        "docs/b.md": "\ufeffsecond \u00e9".encode(),
        "docs/c.txt": b"  \n",
        "docs/d.txt": b"bad \xff byte",
        "deep/x/y/z.jsonl": _jsonl(texts[:3]),
        "deep/.hidden.jsonl": _jsonl(texts[:1]),
    }
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if data is not None:
            path.write_bytes(data)
    pq.write_table(pa.Table.from_pylist(texts + [{"text": None}] + texts[:9]), root / "columnar/p.parquet",
                   row_group_size=6)
    from datasets import Dataset

    Dataset.from_list([{"messages": CHAT}] * 4 + texts[:7]).save_to_disk(str(root / "hf"), num_shards=3)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    _write_corpus(root)
    return root


@pytest.fixture(scope="module")
def bucket(s3_server, corpus):
    """The corpus under ``s3://<bucket>/corpus/`` (uploaded once for the module)."""
    name = s3_server.bucket("inputs")
    s3_server.upload_tree(corpus, name, f"{PREFIX}/")
    return name


def _both(corpus, bucket, *patterns):
    """The same inputs on disk and on S3."""
    return [f"{corpus}/{p}" for p in patterns], [f"s3://{bucket}/{PREFIX}/{p}" for p in patterns]


PATTERNS = [
    ["jsonl"], ["jsonl/"], ["jsonl/*.jsonl"], ["**/*.jsonl"], ["**"], ["*/*.jsonl", "chat/pc.ndjson"], ["hf"],
    ["docs"], ["columnar/*"], ["columnar/p.parquet", "jsonl/a.jsonl", "columnar/p.parquet"], ["deep/**/*.jsonl"],
    ["deep/*/*/z.jsonl"], ["*.none"], ["jsonl/missing.jsonl"],
]


@pytest.mark.parametrize("patterns", PATTERNS, ids=["+".join(p) for p in PATTERNS])
def test_listing_uris_equals_listing_the_same_files_on_disk(s3, corpus, bucket, patterns):
    """Same files, same order, same kinds and sizes; a glob that matches nothing fails on both."""
    local, remote = _both(corpus, bucket, *patterns)

    def outcome(inputs, root):
        try:
            return [(f.path[len(root) + 1:], f.kind, f.info.size) for f in list_inputs(inputs)]
        except ValueError as e:  # one line naming the input
            assert "\n" not in str(e) and inputs[-1].rsplit("/", 1)[-1] in str(e)
            return "error"
    expected = outcome(local, str(corpus))
    assert outcome(remote, f"s3://{bucket}/{PREFIX}") == expected
    if patterns not in (["*.none"], ["jsonl/missing.jsonl"]):
        assert expected and all(size is not None for _, _, size in expected)


def test_a_glob_on_a_store_is_one_listing(s3_faulty, s3_proxy, corpus, bucket):
    files = list_inputs(f"s3://{bucket}/{PREFIX}/**/*.jsonl")
    assert len(files) == 6 and s3_proxy.count(lists=True) == 1 and s3_proxy.count() == 1


def _plan(inputs, *, window, block, fmt="auto"):
    config = DataConfig(sources=(SourceConfig(name="c", paths=tuple(inputs)),), tokenizer="-", seq_len=2,
                        window_samples=window, block_samples=block, format=fmt)
    return build_plan(config)


def _window_rows(plan, k, root):
    raw = read_window(plan.window(k))
    skips = [(s.sample_id, s.source[len(root) + 1:], s.row, s.reason, s.detail, s.line) for s in raw.skips]
    return raw.sample_ids.tolist(), raw.records, skips, raw.sources.tolist()


CORPORA = {
    "jsonl": ["jsonl"],
    "chat": ["chat"],
    "columnar": ["columnar"],
    "docs": ["docs"],
    "hf": ["hf"],
    "everything": ["jsonl/*.jsonl", "chat", "columnar/*", "docs", "hf", "deep/**/*.jsonl"],
}


@pytest.mark.parametrize("block", [0, 4], ids=["in-order", "shuffled-blocks"])
@pytest.mark.parametrize("window", [5, 64])
@pytest.mark.parametrize("corpus_name", list(CORPORA))
def test_every_window_reads_from_s3_what_it_reads_from_disk(s3, corpus, bucket, corpus_name, window, block):
    local, remote = _both(corpus, bucket, *CORPORA[corpus_name])
    local_plan, remote_plan = _plan(local, window=window, block=block), _plan(remote, window=window, block=block)
    assert remote_plan.num_windows == local_plan.num_windows > (1 if window == 5 and corpus_name != "docs" else 0)
    num_records = num_skips = 0
    for k in range(local_plan.num_windows):
        expected = _window_rows(local_plan, k, str(corpus))
        assert _window_rows(remote_plan, k, f"s3://{bucket}/{PREFIX}") == expected
        num_records, num_skips = num_records + len(expected[1]), num_skips + len(expected[2])
    assert num_records > 0 and (num_skips > 0 or corpus_name == "hf")  # bad rows are named alike too


# ---- what a window costs -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_jsonl(s3_server):
    """~8 MiB of JSONL, 8,000 rows of ~1 KiB, on S3; and its lines."""
    lines = [json.dumps({"text": f"row {i} " + "x" * (1000 + i % 50)}).encode() + b"\n" for i in range(8000)]
    name = s3_server.bucket("big")
    return s3_server.put(name, "big.jsonl", b"".join(lines)), lines


def test_a_jsonl_window_reads_its_rows_not_the_object(s3_faulty, s3_proxy, big_jsonl):
    """Each window of 500 rows reads its bytes and at most a first blind chunk more, in a HEAD
    and a few ranged GETs; the counters see what the proxy sees."""
    uri, lines = big_jsonl
    size = sum(map(len, lines))
    plan = _plan([uri], window=500, block=0)
    for k in (0, 9, plan.num_windows - 1):  # seek points every 4,096 rows: 9 and the last start past one
        reset_shared_caches(clear_disk=True)  # a window read cold, not from the bytes the scan kept
        s3_proxy.reset()
        before = storage.COUNTERS.snapshot()
        raw = read_window(plan.window(k))
        cost = storage.COUNTERS.snapshot() - before
        rows = plan.window(k).sample_ids()
        assert [r["text"] for r in map(json.loads, (lines[i] for i in rows))] == raw.records
        wanted = sum(len(lines[i]) for i in rows)
        got = s3_proxy.bytes_out("GET")
        assert wanted <= got <= wanted + fileio.FIRST_CHUNK + 4096 * 1100 and got < size / 2  # 4096: the seek stride
        assert s3_proxy.count("HEAD") == 1 and s3_proxy.count("GET") <= 4
        assert (cost.requests, cost.bytes_read, cost.retries) == (s3_proxy.count(), got, 0)


def test_a_shuffled_window_reads_few_requests_and_bytes(s3_faulty, s3_proxy, big_jsonl):
    """Blocks of 10 rows from all over the object (a window of 400 draws 40 blocks: at least 32,
    plan.mixing_block): blocks closer than ``MAX_GAP`` and than their
    own size share a GET (and the gap's bytes: a round trip costs about as much), others a GET
    each; bytes are the
    blocks' and those gaps', never past a block's end (the plan knows where each ends)."""
    uri, lines = big_jsonl
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    plan = _plan([uri], window=400, block=10)
    for k in (0, 3, 19):
        spec = plan.window(k)
        reset_shared_caches(clear_disk=True)  # a window read cold, not from the bytes the scan kept
        s3_proxy.reset()
        raw = read_window(spec)
        assert raw.sample_ids.tolist() == spec.sample_ids().tolist() and 30 <= len(spec.pieces) <= 40
        assert all(p.start_row % 10 == 0 and p.num_rows % 10 == 0 for p in spec.pieces), "whole blocks"
        spans = sorted((offsets[p.start_row], offsets[p.start_row + p.num_rows]) for p in spec.pieces)
        # a gap is read through when at most MAX_GAP and no larger than the block after it
        through = [b[0] - a[1] <= min(fileio.MAX_GAP, b[1] - b[0]) for a, b in zip(spans, spans[1:])]
        read_through = sum(b[0] - a[1] for (a, b), t in zip(zip(spans, spans[1:]), through) if t)
        groups = 1 + sum(not t for t in through)
        assert s3_proxy.count("GET") <= groups + 1 <= len(spec.pieces) + 1
        # blocks start and end on seek points (the plan's stride is the block): no byte past them
        assert sum(b - a for a, b in spans) <= s3_proxy.bytes_out("GET") <= sum(b - a for a, b in spans) + read_through


def test_a_parquet_window_reads_its_row_groups_not_the_object(s3_faulty, s3_proxy, tmp_path):
    texts = [f"row {i} " + "y" * 2000 for i in range(2000)]
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"text": texts, "other": texts}), path, row_group_size=100, compression="none")
    name = s3_faulty.bucket("pq")
    uri = s3_faulty.put(name, "big.parquet", path.read_bytes())
    plan = _plan([uri], window=100, block=0)
    reset_shared_caches(clear_disk=True)  # a window read cold, not from the footer the scan kept
    s3_proxy.reset()
    raw = read_window(plan.window(12))
    assert raw.records == texts[1200:1300]
    metadata = pq.ParquetFile(path).metadata
    group = metadata.row_group(12).column(0).total_compressed_size
    # its "text" column chunk, the footer (pyarrow reads the last 64 KiB, then the rest of it)
    assert s3_proxy.bytes_out("GET") <= group + metadata.serialized_size + (64 << 10) < path.stat().st_size / 10
    assert s3_proxy.count("GET") <= 3


# ---- another version of an object -------------------------------------------------------------
OVERWRITES = {
    "jsonl/a.jsonl": lambda data: data + b'{"text": "appended"}\n',
    "columnar/p.parquet": lambda data: data[:-8] + b"\0" * 8 + data[-8:],
    "columnar/s.arrow": lambda data: data + b"\0" * 8,
    "docs/a.txt": lambda data: data + b" more",
}


@pytest.mark.parametrize("name", list(OVERWRITES))
def test_an_object_overwritten_after_the_plan_is_an_error_naming_it(s3, corpus, name):
    """A new version (another size at once; the same size: another ETag) fails the read, naming
    the object without credentials, before any row of it is returned."""
    bucket = s3.bucket("changed")
    s3.upload_tree(corpus, bucket, f"{PREFIX}/")
    uri = f"s3://{bucket}/{PREFIX}/{name}"
    plan = _plan([uri], window=1000, block=0)
    (piece,) = plan.window(0).pieces
    assert piece.size == len((corpus / name).read_bytes())
    data = (corpus / name).read_bytes()
    s3.put(bucket, f"{PREFIX}/{name}", OVERWRITES[name](data))
    with pytest.raises(storage.StorageError, match=f"^{uri}: changed since it was planned \\(size ") as caught:
        read_window(plan.window(0))
    assert user_message(caught.value) == str(caught.value)  # one line: exit 2
    # the same size, another content: the ETag the plan would keep tells them apart
    s3.put(bucket, f"{PREFIX}/{name}", data)
    etag = storage.stat(uri).etag
    same_size = dataclasses.replace(plan.window(0), pieces=(dataclasses.replace(piece, etag=etag, mtime_ns=-1),))
    read_window(same_size)
    s3.put(bucket, f"{PREFIX}/{name}", data[::-1])
    with pytest.raises(storage.StorageError, match=f"^{uri}: changed since it was planned \\(ETag "):
        read_window(same_size)


@pytest.mark.parametrize("name", [n for n in OVERWRITES if not n.endswith(".txt")])
def test_the_plan_keeps_each_objects_etag_so_a_same_size_rewrite_is_caught(s3, corpus, name):
    """A listing has no ETag and a store's mtime has whole seconds: the scan's HEAD records the
    ETag, so a rewrite of the same size within the same second still fails the read."""
    bucket = s3.bucket("rewritten")
    s3.upload_tree(corpus, bucket, f"{PREFIX}/")
    uri = f"s3://{bucket}/{PREFIX}/{name}"
    plan = _plan([uri[:-1] + "?"], window=1000, block=0)  # a glob: the identity comes from a listing
    (piece,) = plan.window(0).pieces
    assert piece.etag == storage.stat(uri).etag is not None
    data = (corpus / name).read_bytes()
    s3.put(bucket, f"{PREFIX}/{name}", data[::-1])
    with pytest.raises(storage.StorageError, match=f"^{uri}: changed since it was planned \\(ETag "):
        read_window(plan.window(0))


# ---- faults ------------------------------------------------------------------------------------
FAULT_INPUTS = ["jsonl/a.jsonl", "columnar/p.parquet", "columnar/f.arrow", "columnar/s.arrow", "docs/a.txt"]


@pytest.mark.parametrize("mode", ["503", "500", "drop"])
@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("name", FAULT_INPUTS)
def test_a_window_survives_four_failures_in_a_row(s3_faulty, s3_proxy, corpus, bucket, name, method, mode):
    uri = f"s3://{bucket}/{PREFIX}/{name}"
    plan = _plan([uri], window=1000, block=0)
    expected = _window_rows(_plan([str(corpus / name)], window=1000, block=0), 0, str(corpus))
    reset_shared_caches(clear_disk=True)  # the window reads the store, not the bytes the scan kept
    s3_proxy.reset()
    s3_proxy.fail_next(4, mode, method=method, key=f"{PREFIX}/{name}")
    before = storage.COUNTERS.snapshot()
    assert _window_rows(plan, 0, f"s3://{bucket}/{PREFIX}") == expected
    cost = storage.COUNTERS.snapshot() - before
    assert s3_proxy.pending_faults() == 0
    assert cost.retries >= (3 if mode == "drop" else 4) and cost.failures == 0  # curl resends one drop itself


@pytest.mark.parametrize("case, message", [
    ("no-bucket", "does not exist"),
    ("glob-matches-nothing", "the glob matches no file"),
    ("no-object", "no such object"),
    ("denied", "access denied"),
])
def test_bad_inputs_on_a_store_are_one_line(s3_faulty, s3_proxy, bucket, case, message):
    uri = {
        "no-bucket": "s3://pf-no-such-bucket/x/*.jsonl",
        "glob-matches-nothing": f"s3://{bucket}/{PREFIX}/nothing/*.jsonl",
        "no-object": f"s3://{bucket}/{PREFIX}/jsonl/nothing.jsonl",
        "denied": f"s3://{bucket}/{PREFIX}/jsonl/*.jsonl",
    }[case]
    if case == "denied":
        s3_proxy.fail_next(10, "403")
    with pytest.raises(ValueError) as caught:
        _plan([uri], window=10, block=0)
    line = user_message(caught.value)
    assert line is not None and "\n" not in line and message in line and uri.split("*")[0].rstrip("/") in line
    assert "testing-secret" not in line
