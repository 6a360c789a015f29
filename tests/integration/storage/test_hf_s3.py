"""``packed_hf_dataset`` of a packed output on S3 (moto on 127.0.0.1): the same rows and columns
as the same output on disk, read through packfeed's storage layer into ``datasets``' cache once;
a second call reads no part again, and a repacked output is read anew."""

from __future__ import annotations

import pytest
from support.streams import plain_rows

from packfeed.client.rows import PackedRows
from packfeed.service.packed.writer import ParquetRowWriter, part_files
from packfeed.trainer.hf import packed_hf_dataset

pytestmark = pytest.mark.integration

SEQ = 8


def rows(first: int, n: int) -> PackedRows:
    return plain_rows(first, n, SEQ)


def write(out: str, first: int, *, overwrite: bool = False) -> None:
    writer = ParquetRowWriter(out, seq_len=SEQ, config_hash="abc", overwrite=overwrite)
    writer.rows_per_file = 4  # several part files, read in name order
    writer.write(rows(first, 5))
    writer.write(rows(first + 5, 5))
    writer.close(config={"data": {"seq_len": SEQ}, "config_hash": "abc"}, stats={"rows": 10, "first": first})


def test_a_packed_output_on_s3_reads_as_the_same_dataset(s3_faulty, s3_proxy, tmp_path):
    bucket = s3_faulty.bucket("hf")
    uri, local = f"s3://{bucket}/packed", str(tmp_path / "packed")
    write(uri, 0)
    write(local, 0)
    assert len(part_files(uri)) == 3
    cache = tmp_path / "cache"
    remote_ds = packed_hf_dataset(uri, cache_dir=cache)
    local_ds = packed_hf_dataset(local, cache_dir=cache)
    assert remote_ds.features == local_ds.features and len(remote_ds) == 10
    assert remote_ds.to_dict() == local_ds.to_dict()
    assert remote_ds[7]["row_index"] == 7 and remote_ds[7]["input_ids"] == list(range(57, 65))

    s3_proxy.reset()
    again = packed_hf_dataset(uri, cache_dir=cache)  # from the cache: the metadata read, no part
    assert again.to_dict() == remote_ds.to_dict()
    assert not [r for r in s3_proxy.requests if r.method == "GET" and "part-" in r.key]

    write(uri, 100, overwrite=True)  # packed again over it: read anew
    assert packed_hf_dataset(uri, cache_dir=cache)[0]["row_index"] == 100


def test_an_unfinished_output_on_s3_is_refused(s3, tmp_path):
    bucket = s3.bucket("hf")
    writer = ParquetRowWriter(f"s3://{bucket}/killed", seq_len=SEQ, config_hash="abc")
    writer.write(rows(0, 3))
    writer.abandon()
    with pytest.raises(ValueError, match=f"s3://{bucket}/killed is incomplete"):
        packed_hf_dataset(f"s3://{bucket}/killed", cache_dir=tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match="holds no packed rows"):
        packed_hf_dataset(f"s3://{bucket}/nothing", cache_dir=tmp_path / "cache")
