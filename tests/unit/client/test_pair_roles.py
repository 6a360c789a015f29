"""The ``pair_roles`` row column: the worked example, what ``check_rows`` accepts and refuses,
every constructor and transform keeping it, and data written before it existed (Arrow tables,
wire messages, per-row columns) reading as PAIR_NONE."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from packfeed.client.rows import (
    COLUMN_DTYPES,
    PAIR_CHOSEN,
    PAIR_NONE,
    PAIR_REJECTED,
    SEGMENT_COLUMNS,
    PackedRows,
    check_rows,
    concat_rows,
    padding_rows,
    renumber_rows,
    select_rows,
)
from packfeed.client.v1 import packfeed_pb2
from packfeed.client.wire import decode_batch, decode_batch_bytes, encode_batch
from packfeed.service.packed.arrow_rows import ROW_SCHEMA, rows_from_arrow, rows_to_arrow

ALL_COLUMNS = ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "pair_roles", "segment_splits",
               "row_index")


def pair_rows() -> PackedRows:
    """The worked example of client/rows.py (row 0), then sample 3 alone and padding (row 1)."""
    return PackedRows(
        input_ids=np.array([[5, 6, 7, 5, 6, 8, 9, 3, 2, 0], [4, 4, 0, 0, 0, 0, 0, 0, 0, 0]], np.int32),
        labels=np.array([[-100, -100, 7, -100, -100, 8, 9, -100, 2, -100], [-100, 4] + [-100] * 8], np.int32),
        position_ids=np.array([[0, 1, 2, 0, 1, 2, 3, 0, 1, 0], [0, 1, 0, 1, 2, 3, 4, 5, 6, 7]], np.int32),
        seq_lens=np.array([3, 4, 2, 1, 2, 8], np.int32),
        sample_ids=np.array([4, 4, 9, -1, 3, -1], np.int64),
        segment_splits=np.array([0, 4, 6], np.int64),
        row_index=np.array([0, 1], np.int64),
        pair_roles=np.array([1, 0, -1, -1, -1, -1], np.int8),
    )


def assert_rows_equal(got: PackedRows, want: PackedRows) -> None:
    for name in ALL_COLUMNS:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == np.dtype(COLUMN_DTYPES.get(name, np.int64)) or name == "segment_splits", name
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_constants_and_column_lists():
    assert (PAIR_CHOSEN, PAIR_REJECTED, PAIR_NONE) == (1, 0, -1)
    assert SEGMENT_COLUMNS == ("seq_lens", "sample_ids", "pair_roles")
    assert COLUMN_DTYPES["pair_roles"] == np.int8
    assert ROW_SCHEMA.field("pair_roles").type == pa.list_(pa.int8())


def test_worked_example_passes_and_row_accessor():
    rows = pair_rows()
    check_rows(rows, 10)
    assert rows.row_pair_roles(0).tolist() == [1, 0, -1, -1]
    assert rows.row_pair_roles(1).tolist() == [-1, -1]


def test_left_out_pair_roles_are_none():
    rows = PackedRows(**{n: getattr(pair_rows(), n) for n in ALL_COLUMNS if n != "pair_roles"})
    assert rows.pair_roles.dtype == np.int8 and rows.pair_roles.tolist() == [PAIR_NONE] * 6


@pytest.mark.parametrize(
    "roles, message",
    [
        pytest.param([0, 1, -1, -1], "chosen segment", id="rejected-before-chosen"),
        pytest.param([1, -1, -1, -1], "chosen segment", id="lone-chosen"),
        pytest.param([-1, 0, -1, -1], "chosen segment", id="lone-rejected"),
        pytest.param([-1, 1, 0, -1], "chosen segment", id="pair-across-two-samples"),
        pytest.param([1, 0, -1, 1], "padding", id="padding-with-a-role"),
        pytest.param([1, 0, 2, -1], "pair_roles must hold", id="unknown-role"),
    ],
)
def test_check_rows_refuses_broken_pairs(roles, message):
    rows = pair_rows()
    bad = rows.pair_roles.copy()
    bad[:4] = roles
    with pytest.raises(ValueError, match=message):
        check_rows(PackedRows(**{**{n: getattr(rows, n) for n in ALL_COLUMNS}, "pair_roles": bad}), 10)


def test_check_rows_refuses_a_pair_split_over_two_rows():
    rows = pair_rows()
    roles = rows.pair_roles.copy()
    roles[:] = [-1, -1, -1, -1, 1, -1]  # a chosen segment ending its row, its rejected nowhere
    with pytest.raises(ValueError, match="chosen segment"):
        check_rows(PackedRows(**{**{n: getattr(rows, n) for n in ALL_COLUMNS}, "pair_roles": roles}), 10)


def test_transforms_keep_pair_roles():
    rows = pair_rows()
    pads = padding_rows(2, 10, 0)
    assert pads.pair_roles.tolist() == [-1, -1] and pads.pair_roles.dtype == np.int8
    both = concat_rows([rows, pads, rows])
    assert both.pair_roles.tolist() == [1, 0, -1, -1, -1, -1, -1, -1, 1, 0, -1, -1, -1, -1]
    check_rows(both, 10)
    picked = select_rows(both, [4, 1, 0])
    assert [picked.row_pair_roles(r).tolist() for r in range(3)] == [[1, 0, -1, -1], [-1, -1], [1, 0, -1, -1]]
    check_rows(picked, 10)
    assert renumber_rows(rows, 7).pair_roles is rows.pair_roles


def test_from_columns_with_and_without_pair_roles():
    rows = pair_rows()
    columns = {
        "input_ids": list(rows.input_ids),
        "labels": list(rows.labels),
        "position_ids": list(rows.position_ids),
        "seq_lens": [rows.row_seq_lens(r).tolist() for r in range(2)],
        "sample_ids": [rows.row_sample_ids(r).tolist() for r in range(2)],
        "row_index": [0, 1],
    }
    old = PackedRows.from_columns(columns)
    assert old.pair_roles.dtype == np.int8 and old.pair_roles.tolist() == [-1] * 6
    new = PackedRows.from_columns({**columns, "pair_roles": [rows.row_pair_roles(r).tolist() for r in range(2)]})
    assert_rows_equal(new, rows)
    nulls = PackedRows.from_columns({**columns, "pair_roles": [None, None]})  # an old file read with ROW_SCHEMA
    assert nulls.pair_roles.tolist() == [-1] * 6


def test_arrow_round_trip_and_old_tables():
    rows = pair_rows()
    table = rows_to_arrow(rows)
    assert table.schema == ROW_SCHEMA
    assert_rows_equal(rows_from_arrow(table), rows)
    old = rows_from_arrow(table.drop_columns(["pair_roles"]))  # a table written before the column
    assert old.pair_roles.tolist() == [-1] * 6
    np.testing.assert_array_equal(old.sample_ids, rows.sample_ids)


def test_an_old_parquet_file_read_with_the_new_schema(tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "part-00000.parquet"
    pq.write_table(rows_to_arrow(pair_rows()).drop_columns(["pair_roles"]), path)
    old = rows_from_arrow(pq.read_table(path, schema=ROW_SCHEMA))  # the missing column reads as nulls
    assert old.pair_roles.tolist() == [-1] * 6
    pq.write_table(rows_to_arrow(pair_rows()), path)
    assert_rows_equal(rows_from_arrow(pq.read_table(path, schema=ROW_SCHEMA)), pair_rows())


@pytest.mark.parametrize("decode", [decode_batch, lambda m: decode_batch_bytes(m.SerializeToString())],
                         ids=["message", "bytes"])
def test_wire_round_trip_and_a_message_from_an_older_server(decode):
    rows = pair_rows()
    msg = encode_batch(rows, cursor=2)
    assert msg.pair_roles == b"\x01\x00" + b"\xff" * 4
    assert_rows_equal(decode(msg).rows, rows)
    old = packfeed_pb2.PackedBatch()
    old.CopyFrom(msg)
    old.ClearField("pair_roles")  # what a server from before the column sends
    got = decode(old).rows
    assert got.pair_roles.dtype == np.int8 and got.pair_roles.tolist() == [-1] * 6
    np.testing.assert_array_equal(got.seq_lens, rows.seq_lens)


def test_wire_refuses_malformed_pair_roles():
    msg = encode_batch(pair_rows(), cursor=2)
    short = packfeed_pb2.PackedBatch()
    short.CopyFrom(msg)
    short.pair_roles = msg.pair_roles[:-1]
    with pytest.raises(ValueError, match="pair_roles has 5 bytes"):
        decode_batch(short)
    bad = packfeed_pb2.PackedBatch()
    bad.CopyFrom(msg)
    bad.pair_roles = b"\x05" + msg.pair_roles[1:]
    with pytest.raises(ValueError, match="pair_roles must hold"):
        decode_batch(bad)


def test_a_packed_directory_serves_pair_roles_and_an_old_one_serves_none(tmp_path):
    import pyarrow.parquet as pq

    from packfeed.service.delivery.row_stream import find_packed_dir, open_stream
    from packfeed.service.packed.writer import ParquetRowWriter, part_files

    out = tmp_path / "packed"
    writer = ParquetRowWriter(out, seq_len=10, config_hash="abc")
    writer.write(pair_rows())
    config = {"data": {"seq_len": 10, "tokenizer": "tok"}, "config_hash": "abc",
              "tokenizer": {"name": "tok", "pad_id": 0, "vocab_size": 99}, "plan": {"epochs": 1}}
    writer.close(config=config, stats={"rows": 2, "epoch_rows": [2]}, status="complete")

    def served() -> PackedRows:
        return open_stream(find_packed_dir([str(out)])).pack_window(0)

    assert_rows_equal(served(), pair_rows())
    part = part_files(out)[0]
    table = pq.read_table(part)
    pq.write_table(table.drop_columns(["pair_roles"]).replace_schema_metadata(table.schema.metadata), part)
    old = served()  # a directory packed before the column
    assert old.pair_roles.tolist() == [-1] * 6
    np.testing.assert_array_equal(old.input_ids, pair_rows().input_ids)
