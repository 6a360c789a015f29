"""The packed output directory: safe to write (never deletes what packfeed did not write,
never inside or around its inputs) and readable as a plain Parquet / Hugging Face dataset."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.stores import keys, memory_store  # noqa: F401 - the fixture "store"

from packfeed.client.rows import PackedRows, check_rows
from packfeed.service.packed.writer import META_DIR, ParquetRowWriter, packed_dir_info, prepare_output, read_packed_dir

SEQ = 8


def rows(first: int, n: int) -> PackedRows:
    ids = np.arange(first * SEQ, (first + n) * SEQ, dtype=np.int32).reshape(n, SEQ) + 1
    labels = ids.copy()
    labels[:, 0] = -100
    return PackedRows(input_ids=ids, labels=labels, position_ids=np.tile(np.arange(SEQ, dtype=np.int32), (n, 1)),
                      seq_lens=np.full(n, SEQ, np.int32), sample_ids=np.arange(first, first + n, dtype=np.int64),
                      segment_splits=np.arange(n + 1, dtype=np.int64), row_index=np.arange(first, first + n))


def write(out, *, overwrite=False, inputs=(), status="complete"):
    w = ParquetRowWriter(out, seq_len=SEQ, config_hash="abc", overwrite=overwrite, inputs=inputs)
    w.write(rows(0, 5))
    w.write(rows(5, 3))
    w.close(config={"data": {"seq_len": SEQ}, "config_hash": "abc"}, stats={"rows": 8}, status=status)
    return w


def test_a_packed_directory_reads_as_a_plain_parquet_and_hf_dataset(tmp_path):
    out = tmp_path / "pack"
    write(out)
    assert sorted(os.listdir(out)) == [".packfeed", "part-00000.parquet"]
    table = pq.read_table(out)  # the metadata directory is skipped: a plain dataset
    assert table.num_rows == 8 and table.column("row_index").to_pylist() == list(range(8))
    assert pq.read_schema(out / "part-00000.parquet").metadata[b"packfeed.seq_len"] == b"8"
    # stored without nulls (no definition levels), with statistics for row_index alone (a reader finds rows by it)
    assert not any(f.nullable or (f.type.num_fields and f.type.value_field.nullable) for f in table.schema)
    meta = pq.ParquetFile(out / "part-00000.parquet").metadata
    groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
    with_stats = {c.path_in_schema for g in groups for c in map(g.column, range(g.num_columns)) if c.is_stats_set}
    assert with_stats == {"row_index"}
    assert [g.column(g.num_columns - 1).statistics.max for g in groups] == [4, 7]  # the rows of each write
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("parquet", data_dir=str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert len(ds) == 8 and ds[3]["row_index"] == 3
    back = read_packed_dir(out)
    check_rows(back, SEQ)
    assert np.array_equal(back.input_ids, np.concatenate([rows(0, 5).input_ids, rows(5, 3).input_ids]))
    assert packed_dir_info(out)["stats"] == {"status": "complete", "rows": 8}


def test_overwrite_removes_only_what_packfeed_wrote(tmp_path):
    out = tmp_path / "pack"
    write(out)
    with pytest.raises(ValueError, match="already holds packed output; pass --overwrite"):
        write(out)
    write(out, overwrite=True)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files packfeed did not write \(notes.txt\)"):
        write(out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "part-00000.parquet").exists()


def test_spark_style_input_files_are_never_deleted(tmp_path):
    """Issue: `pack DIR --output DIR --overwrite` deleted part-*.parquet inputs before reading them."""
    data = tmp_path / "data"
    data.mkdir()
    spark = data / "part-00000-1b2c3d4e.snappy.parquet"
    pq.write_table(pa.table({"text": ["hello"]}), spark)
    for out in (data, data / "packed", tmp_path):  # is, lies inside, contains the input
        with pytest.raises(ValueError, match=r"--output .* (is|lies inside|contains) the input"):
            prepare_output(out, inputs=[str(spark), str(data)], overwrite=True)
    with pytest.raises(ValueError, match="holds files packfeed did not write"):
        prepare_output(data, inputs=[], overwrite=True)  # even without the input check
    assert spark.exists() and pq.read_table(spark).num_rows == 1


def test_an_input_given_through_a_symlink_is_still_protected(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text('{"text": "x"}\n')
    link = tmp_path / "link"
    link.symlink_to(data)
    with pytest.raises(ValueError, match="is the input"):
        prepare_output(data, inputs=[str(link)], overwrite=True)


def test_an_unfinished_output_is_refused_as_input(tmp_path):
    out = tmp_path / "pack"
    write(out, status="failed: nothing was packed")
    with pytest.raises(ValueError, match="unfinished or failed packfeed output"):
        packed_dir_info(out)
    assert packed_dir_info(tmp_path) is None  # not a packfeed directory at all


def test_an_interrupted_output_says_what_it_holds_and_what_it_lacks(tmp_path):
    """A pack killed mid-run: files.json lists its part files, the last one has no footer yet,
    and config.json and stats.json (written at the end) do not exist."""
    out = tmp_path / "pack"
    w = ParquetRowWriter(out, seq_len=SEQ, config_hash="abc")
    with pytest.raises(ValueError, match=r"pack is incomplete: .* it has no part file yet and lacks "
                                         r"\.packfeed/config\.json and \.packfeed/stats\.json .*--overwrite$"):
        packed_dir_info(out)  # killed before the first row
    w.rows_per_group = w.rows_per_file = 5  # two files from 8 rows
    w.write(rows(0, 8))  # part-00000 finished (5 rows), part-00001 being written: the kill comes now
    with pytest.raises(ValueError) as err:
        packed_dir_info(out)
    assert str(err.value) == (
        f"{out} is incomplete: a packfeed pack started there and did not finish; it has 2 part file(s) (5 rows "
        "readable; part-00001.parquet cut off while it was written) and lacks .packfeed/config.json and "
        ".packfeed/stats.json (written when a pack ends): pack it again with --overwrite")
    w.close(config={"data": {"seq_len": SEQ}, "config_hash": "abc"}, stats={"rows": 8})
    assert packed_dir_info(out)["stats"]["rows"] == 8


def test_a_read_only_location_is_one_clear_error_before_any_work():
    out = "/sys/packfeed-output"  # sysfs refuses new entries, for root too
    with pytest.raises(OSError) as err:
        prepare_output(Path(out), inputs=[], overwrite=False)
    assert out in str(err.value)


def test_an_output_path_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(ValueError, match="is a file"):
        prepare_output(f, inputs=[], overwrite=True)


@pytest.mark.parametrize("stats", [b"{oops", b"[]", b"\xff"])
def test_a_packed_directory_with_damaged_metadata_is_named(tmp_path, stats):
    ParquetRowWriter(tmp_path / "o", seq_len=8, config_hash="h").close(config={}, stats={"rows": 0})
    (tmp_path / "o" / META_DIR / "stats.json").write_bytes(stats)
    with pytest.raises(ValueError, match="stats.json is not a valid JSON object.*pack the directory again"):
        packed_dir_info(tmp_path / "o")


# ---- on an object store (support/stores.py: the storage layer's URI path, no socket) ----------------
def test_a_packed_output_on_a_store_is_the_local_one_byte_for_byte(tmp_path, store):
    from packfeed.service import storage

    local, remote = tmp_path / "pack", f"{store}/pack"
    for out in (local, remote):
        w = ParquetRowWriter(out, seq_len=SEQ, config_hash="abc")
        w.rows_per_group, w.rows_per_file = 2, 4  # several row groups and files
        w.write(rows(0, 5))
        w.write(rows(5, 4))
        w.close(config={"data": {"seq_len": SEQ}, "config_hash": "abc"}, stats={"rows": 9})
    assert keys(remote) == sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
    for name in keys(remote):
        assert storage.read_bytes(f"{remote}/{name}") == (local / name).read_bytes(), name
    assert packed_dir_info(remote) == packed_dir_info(local)
    a, b = read_packed_dir(local), read_packed_dir(remote)
    for column in ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "row_index"):
        assert np.array_equal(getattr(a, column), getattr(b, column)), column


@pytest.mark.parametrize("secret_uri", [
    "s3://AKIAEXAMPLE:wJalrSECRET@bucket/corpus/*.jsonl",
    "https://host/corpus.jsonl?X-Amz-Signature=SECRETSIG&X-Amz-Credential=AKIAEXAMPLE",
    "abfss://container@acct.dfs.core.windows.net/c.jsonl?sig=SECRETSIG",
])
def test_config_json_never_holds_a_credential(store, secret_uri):
    from packfeed.service import storage

    out = f"{store}/pack"
    ParquetRowWriter(out, seq_len=SEQ, config_hash="abc").close(
        config={"data": {"sources": [{"paths": [secret_uri]}]}}, stats={"rows": 0})
    text = storage.read_bytes(f"{out}/{META_DIR}/config.json").decode()
    assert "SECRET" not in text and "AKIAEXAMPLE" not in text, text
    assert "corpus" in text or "c.jsonl" in text, "the location itself is kept"


def test_an_unfinished_output_on_a_store_never_looks_complete(store):
    out = f"{store}/pack"
    w = ParquetRowWriter(out, seq_len=SEQ, config_hash="abc")
    w.rows_per_group = w.rows_per_file = 5
    with pytest.raises(ValueError, match=rf"^{out} is incomplete: .* no part file yet"):
        packed_dir_info(out)
    w.write(rows(0, 8))  # part-00000 done, part-00001 being written: a crash now
    with pytest.raises(ValueError, match=rf"^{out} is incomplete: .* lacks \.packfeed/config\.json"):
        packed_dir_info(out)
    w.close(config={"data": {"seq_len": SEQ}}, stats={"rows": 8}, status="failed: nothing was packed")
    with pytest.raises(ValueError, match="unfinished or failed packfeed output"):
        packed_dir_info(out)
    assert packed_dir_info(f"{store}/elsewhere") is None and packed_dir_info(f"{store}/pack/*.parquet") is None


def test_overwrite_on_a_store_removes_only_packfeeds_keys_completion_marker_first(store, monkeypatch):
    from packfeed.service import storage
    from packfeed.service.packed import location

    out = f"{store}/pack"
    w = ParquetRowWriter(out, seq_len=SEQ, config_hash="abc")
    w.rows_per_group = w.rows_per_file = 3
    w.write(rows(0, 8))  # three part files
    w.close(config={}, stats={"rows": 8})
    neighbours = ["pack-old/part-00000.parquet", "packx", "pack.json"]  # share the prefix's text, not its keys
    for name in [*neighbours, f"pack/{META_DIR}/scan.npz"]:
        storage.write_bytes_atomic(f"{store}/{name}", b"kept")
    storage.write_bytes_atomic(f"{out}/notes.txt", b"mine")
    with pytest.raises(ValueError, match=r"holds files packfeed did not write \(notes.txt\) next to a previous output"):
        write(out, overwrite=True)
    assert len(keys(out)) == 3 + 4 + 1, "a refused overwrite deletes nothing (3 parts, 4 metadata files, notes)"
    storage.delete_prefix(out, only=lambda rel: rel == "notes.txt")  # the user moves it away

    deleted = []
    real = storage.delete_prefix
    monkeypatch.setattr(location.storage, "delete_prefix", lambda uri, only=None: deleted.append(real(uri, only=only)))
    write(out, overwrite=True)
    assert deleted[0] == [f"{out}/{META_DIR}/stats.json"], "the completion marker goes first"
    assert sorted(u for batch in deleted[1:2] for u in batch) == sorted(
        [f"{out}/part-0000{i}.parquet" for i in range(3)] + [f"{out}/{META_DIR}/{n}" for n in ("config.json", "files.json")])
    assert keys(out) == [f"{META_DIR}/{n}" for n in ("config.json", "files.json", "scan.npz", "stats.json")] + [
        "part-00000.parquet"]
    assert all(storage.read_bytes(f"{store}/{n}") == b"kept" for n in neighbours + [f"pack/{META_DIR}/scan.npz"])


@pytest.mark.parametrize(("out", "given", "relation"), [
    pytest.param("s3://b/corpus", "s3://b/corpus", "is", id="same-prefix"),
    pytest.param("s3://b/corpus/packed", "s3://b/corpus/", "lies inside", id="inside-a-prefix"),
    pytest.param("s3://b", "s3://b/corpus/a.jsonl", "contains", id="contains-an-object"),
    pytest.param("s3://b/corpus", "s3://KEY:SECRET@b/corpus/a.jsonl", "contains", id="credentials-ignored"),
    pytest.param("s3a://b/corpus/x", "s3://b/corpus", "lies inside", id="s3a-is-s3"),
    pytest.param("s3://b/corpus/packed", "s3://b/corpus/**/*.parquet", "lies inside", id="glob-would-read-the-parts"),
    pytest.param("s3://b/corpus/packed", "s3://b/corpus/*", "lies inside", id="glob-matches-the-output-prefix"),
    pytest.param("s3://b/corpus", "s3://b/corpus/*.jsonl", "contains", id="output-is-the-glob-base"),
    pytest.param("s3://b", "s3://b/c/*/x.jsonl", "contains", id="output-above-the-glob"),
    pytest.param("s3://b/corpus/packed", "s3://b/corpus/*.jsonl", None, id="glob-never-reads-the-output"),
    pytest.param("s3://b/corpus/packed", "s3://b/corpus/**/*.jsonl", None, id="recursive-glob-of-other-files"),
    pytest.param("s3://b/corpus-2", "s3://b/corpus/*.jsonl", None, id="sibling-sharing-the-text"),
    pytest.param("s3://b/corpus-2", "s3://b/corpus", None, id="sibling-of-a-prefix"),
    pytest.param("s3://other/corpus", "s3://b/corpus", None, id="other-bucket"),
    pytest.param("gs://b/corpus", "s3://b/corpus", None, id="other-store"),
    pytest.param("/b/corpus", "s3://b/corpus", None, id="local-output-remote-input"),
])
def test_an_output_over_an_input_uri_is_refused(out, given, relation):
    from packfeed.service.packed.location import check_not_over_inputs

    if relation is None:
        check_not_over_inputs(out, [given])
        return
    with pytest.raises(ValueError, match=rf"^--output {out} {relation} the input ") as err:
        check_not_over_inputs(out, [given])
    assert "SECRET" not in str(err.value)


def test_the_scan_manifest_kept_in_the_output_is_written_only_once_the_output_is(store, monkeypatch):
    from packfeed.service import storage
    from packfeed.service.packed import location

    out = f"{store}/pack"
    written = []
    real = storage.write_bytes_atomic
    monkeypatch.setattr(location.storage, "write_bytes_atomic", lambda uri, data: (written.append(uri), real(uri, data)))
    with pytest.raises(RuntimeError):
        with location.kept_scan(out) as (copy, write_back):
            Path(copy).write_bytes(b"scan v1")  # what build_plan writes
            raise RuntimeError("a check failed before the output was written")
    assert written == [] and keys(store) == []
    kept = f"{out}/{META_DIR}/scan.npz"
    for before, after, writes in ((None, b"scan v1", [kept]), (b"scan v1", b"scan v1", []), (b"scan v1", b"v2", [kept])):
        written.clear()
        with location.kept_scan(out) as (copy, write_back):
            assert (Path(copy).read_bytes() if os.path.exists(copy) else None) == before  # what the plan reads
            Path(copy).write_bytes(after)  # what the plan writes
            write_back()  # the output is being written
        assert written == writes and storage.read_bytes(kept) == after


@pytest.mark.parametrize("where", ["local", "store"])
def test_part_files_written_by_others_make_the_same_dataset(tmp_path, store, where):
    """`pack`'s actors write one part per window (write_part); the driver names them all first
    (list_parts) and lists those written at the end: a window without rows has none."""
    import json

    from packfeed.service import storage
    from packfeed.service.packed.writer import write_part
    from packfeed.service.packed.part_sink import part_name

    out = str(tmp_path / "pack") if where == "local" else f"{store}/pack"
    counts = [3, 0, 4, 1]
    w = ParquetRowWriter(out, seq_len=SEQ, config_hash="abc")
    w.list_parts([part_name(k, len(counts)) for k in range(len(counts))])
    assert json.loads(storage.read_bytes(f"{out}/{META_DIR}/files.json"))["files"] == [
        f"part-0000{k}.parquet" for k in range(4)]
    first, written = 0, []
    for k, n in enumerate(counts):
        if n:
            written.append(part_name(k, len(counts)))
            write_part(storage.join(out, written[-1]), rows(first, n), seq_len=SEQ, config_hash="abc")
        first += n
    w.close(config={"data": {"seq_len": SEQ}, "config_hash": "abc"}, stats={"rows": first}, written=written)
    assert json.loads(storage.read_bytes(f"{out}/{META_DIR}/files.json"))["files"] == written and w.num_files == 3
    got = read_packed_dir(out)
    assert np.array_equal(got.row_index, np.arange(first)) and np.array_equal(got.sample_ids, np.arange(first))
    check_rows(got, SEQ)
    assert packed_dir_info(out)["stats"]["rows"] == first
    local = tmp_path / "one-writer"  # the same rows from one process: the same Parquet columns
    one = ParquetRowWriter(local, seq_len=SEQ, config_hash="abc")
    one.write(rows(0, first))
    one.close(config={}, stats={"rows": first})
    assert pq.read_table(local / "part-00000.parquet").equals(
        pa.concat_tables(pq.read_table(storage.open_input(storage.join(out, n)) if where == "store"
                                       else os.path.join(out, n)) for n in written))


@settings(max_examples=12, deadline=None)
@given(seq=st.integers(1, 64), data=st.data())
def test_part_files_read_back_exactly_through_every_reader_with_plain_encodings(tmp_path_factory, seq, data):
    """Any int32 token values (negative, past 2**24, the extremes) and segment layouts: a part
    file reads back to the same rows through read_packed_dir, pyarrow and Hugging Face datasets;
    no column needs an encoding past Parquet's plain and RLE ones (any reader reads the parts)."""
    from packfeed.service.packed.writer import write_part

    n = data.draw(st.integers(1, 5))
    tokens = st.integers(-2**31, 2**31 - 1) | st.sampled_from([-100, 0, 151_643, 2**24 - 1, 2**24])
    values = [np.array(data.draw(st.lists(tokens, min_size=n * seq, max_size=n * seq)), np.int32).reshape(n, seq)
              for _ in range(2)]
    cuts = [sorted(data.draw(st.sets(st.integers(1, seq - 1), max_size=3))) if seq > 1 else [] for _ in range(n)]
    lens = [np.diff([0, *c, seq]) for c in cuts]
    given_rows = PackedRows(
        input_ids=values[0], labels=values[1],
        position_ids=np.stack([np.concatenate([np.arange(k, dtype=np.int32) for k in row]) for row in lens]),
        seq_lens=np.concatenate(lens).astype(np.int32), sample_ids=np.arange(sum(map(len, lens)), dtype=np.int64),
        segment_splits=np.cumsum([0, *map(len, lens)]).astype(np.int64), row_index=np.arange(n, dtype=np.int64))
    out = tmp_path_factory.mktemp("part")
    write_part(str(out / "part-00000.parquet"), given_rows, seq_len=seq, config_hash="abc")
    meta = pq.ParquetFile(out / "part-00000.parquet").metadata
    chunks = {c.path_in_schema: c.encodings for c in map(meta.row_group(0).column, range(meta.num_columns))}
    assert all(set(encodings) <= {"PLAIN", "RLE", "BIT_PACKED"} for encodings in chunks.values()), chunks
    back = read_packed_dir(out)
    for name in ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "segment_splits", "row_index"):
        assert np.array_equal(getattr(back, name), getattr(given_rows, name)), name
    assert pq.read_table(out).column("input_ids").to_pylist() == values[0].tolist()
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("parquet", data_dir=str(out), split="train", cache_dir=str(out / ".hf"))
    assert ds["labels"] == values[1].tolist()
