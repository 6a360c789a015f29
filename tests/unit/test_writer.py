"""The packed output directory: safe to write (never deletes what packfeed did not write,
never inside or around its inputs) and readable as a plain Parquet / Hugging Face dataset."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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
