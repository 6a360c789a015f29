"""PackedRows <-> PackedBatch: exact round trip, zero-copy decode, malformed messages refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packfeed.client.rows import (
    IGNORE_INDEX,
    PAD_SAMPLE_ID,
    PackedRows,
    positions_from_seq_lens,
)
from packfeed.client.v1 import packfeed_pb2
from packfeed.client.wire import (
    decode_batch,
    decode_batch_bytes,
    encode_batch,
    parse_fields,
)

COLUMNS = ("input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "pair_roles", "segment_splits", "row_index")


def _golden() -> PackedRows:
    # L=8. Row 0 (index 12): samples 7 ([5,6,7]) and 9 ([8,9]) then padding.
    # Row 1 (index 13): an all-padding tail row.
    return PackedRows(
        input_ids=np.array([[5, 6, 7, 8, 9, 0, 0, 0], [0] * 8], np.int32),
        labels=np.array([[-100, 6, 7, -100, 9, -100, -100, -100], [-100] * 8], np.int32),
        position_ids=np.array([[0, 1, 2, 0, 1, 0, 1, 2], list(range(8))], np.int32),
        seq_lens=np.array([3, 2, 3, 8], np.int32),
        sample_ids=np.array([7, 9, -1, -1], np.int64),
        segment_splits=np.array([0, 3, 4], np.int64),
        row_index=np.array([12, 13], np.int64),
    )


def _root(arr):
    """The object at the bottom of a chain of numpy views and memoryviews."""
    base = arr
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return base


def _assert_rows_equal(got: PackedRows, want: PackedRows):
    for name in COLUMNS:
        a, b = getattr(got, name), getattr(want, name)
        assert a.shape == b.shape and a.dtype.kind == b.dtype.kind and a.itemsize == b.itemsize, name
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_golden_bytes_and_round_trip():
    msg = encode_batch(_golden(), cursor=26, padding_rows=np.array([False, True]), step=3)
    assert (msg.num_rows, msg.seq_len, msg.cursor, msg.step) == (2, 8, 26, 3)
    assert msg.input_ids[:12] == b"\x05\x00\x00\x00\x06\x00\x00\x00\x07\x00\x00\x00"  # little-endian int32
    assert msg.sample_ids[16:24] == b"\xff" * 8  # -1 as int64
    assert msg.segment_splits == b"\x00" * 8 + b"\x03" + b"\x00" * 7 + b"\x04" + b"\x00" * 7
    assert msg.padding_rows == b"\x00\x01"
    rows, padding, cursor, step = decode_batch(packfeed_pb2.PackedBatch.FromString(msg.SerializeToString()))
    _assert_rows_equal(rows, _golden())
    assert padding.tolist() == [False, True] and cursor == 26 and step == 3
    assert rows.row_seq_lens(0).tolist() == [3, 2, 3] and rows.row_sample_ids(1).tolist() == [-1]


def test_decode_does_not_copy():
    msg = packfeed_pb2.PackedBatch.FromString(encode_batch(_golden(), cursor=2).SerializeToString())
    rows, padding, _, _ = decode_batch(msg)
    for name in COLUMNS:
        arr = getattr(rows, name)
        assert not arr.flags.owndata and not arr.flags.writeable, name
        assert isinstance(_root(arr), bytes), f"{name} is not a view of the message's bytes"
    assert not padding.flags.owndata
    assert rows.input_ids.dtype == np.dtype("<i4") and rows.sample_ids.dtype == np.dtype("<i8")
    with pytest.raises(ValueError, match="read-only"):
        rows.labels[0, 0] = 1


def test_decode_bytes_views_the_received_buffer():
    wire = encode_batch(_golden(), cursor=26, padding_rows=np.array([False, True]), step=3).SerializeToString()
    rows, padding, cursor, step = decode_batch_bytes(wire)
    _assert_rows_equal(rows, _golden())
    assert padding.tolist() == [False, True] and cursor == 26 and step == 3
    for name in COLUMNS:
        arr = getattr(rows, name)
        assert _root(arr) is wire and not arr.flags.writeable, name  # not even protobuf copied
    assert np.shares_memory(rows.input_ids, np.frombuffer(wire, np.uint8))


def test_decode_bytes_skips_unknown_fields_and_refuses_garbage():
    wire = encode_batch(_golden(), cursor=3).SerializeToString()
    unknown = (
        b"\xa8\x06\x05" + b"\xb2\x06\x02hi" + b"\xbd\x06\x00\x00\x00\x00"
    )  # fields 101 (varint), 102 (bytes), 103 (fixed32)
    assert decode_batch_bytes(unknown + wire).cursor == 3
    assert parse_fields(b"") == {}
    with pytest.raises(ValueError, match="past the end"):
        decode_batch_bytes(wire[:40])  # inside input_ids
    with pytest.raises(ValueError, match="wire type"):
        decode_batch_bytes(b"\x08\x01" + b"\x1d\x00\x00\x00\x00")  # input_ids (3) as fixed32
    with pytest.raises(ValueError, match="varint"):
        decode_batch_bytes(b"\x08\xff")


def test_default_padding_mask_and_empty_batch():
    rows, padding, cursor, _ = decode_batch(encode_batch(_golden(), cursor=0))
    assert padding.tolist() == [False, False] and cursor == 0
    empty = PackedRows(
        input_ids=np.zeros((0, 4), np.int32),
        labels=np.zeros((0, 4), np.int32),
        position_ids=np.zeros((0, 4), np.int32),
        seq_lens=np.zeros(0, np.int32),
        sample_ids=np.zeros(0, np.int64),
        segment_splits=np.zeros(1, np.int64),
        row_index=np.zeros(0, np.int64),
    )
    rows, padding, _, _ = decode_batch(encode_batch(empty, cursor=5))
    assert rows.input_ids.shape == (0, 4) and padding.shape == (0,)


@pytest.mark.parametrize(
    "field, value, match",
    [
        pytest.param("input_ids", b"\x00" * 4, "input_ids has 4 bytes", id="short-ids"),
        pytest.param("labels", b"", "labels", id="missing-labels"),
        pytest.param(
            "segment_splits", np.array([0, 4, 3], "<i8").tobytes(), "segment_splits", id="splits-fall"
        ),
        pytest.param(
            "segment_splits", np.array([0, 3, 5], "<i8").tobytes(), "segment_splits", id="splits-past-k"
        ),
        pytest.param("sample_ids", b"\x00" * 8, "sample_ids", id="sample-ids-count"),
        pytest.param("padding_rows", b"\x00\x07", "0 or 1", id="bad-flag"),
        pytest.param("row_index", b"\x00" * 9, "row_index", id="odd-bytes"),
    ],
)
def test_malformed_messages_are_refused(field, value, match):
    msg = encode_batch(_golden(), cursor=0)
    setattr(msg, field, value)
    with pytest.raises(ValueError, match=match):
        decode_batch(msg)
    with pytest.raises(ValueError, match=match):
        decode_batch_bytes(msg.SerializeToString())


def test_encode_refuses_bad_shapes():
    with pytest.raises(ValueError, match="padding_rows"):
        encode_batch(_golden(), cursor=0, padding_rows=np.array([True]))
    with pytest.raises(ValueError, match="cursor"):
        encode_batch(_golden(), cursor=-1)


@st.composite
def packed_rows(draw):
    seq_len = draw(st.integers(1, 12))
    num_rows = draw(st.integers(0, 5))
    ids, labels, positions, lens_all, sids_all, splits, index = [], [], [], [], [], [0], []
    for _ in range(num_rows):
        lens = []
        while sum(lens) < seq_len:
            lens.append(draw(st.integers(1, seq_len - sum(lens))))
        sids = draw(st.lists(st.integers(-1, 2**62), min_size=len(lens), max_size=len(lens)))
        row_ids = draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=seq_len, max_size=seq_len))
        ids.append(row_ids)
        labels.append([t if draw(st.booleans()) else IGNORE_INDEX for t in row_ids])
        positions.append(positions_from_seq_lens(np.array(lens)))
        lens_all += lens
        sids_all += sids
        splits.append(splits[-1] + len(lens))
        index.append(draw(st.integers(0, 2**62)))
    shape = (num_rows, seq_len)
    return PackedRows(
        input_ids=np.array(ids, np.int32).reshape(shape),
        labels=np.array(labels, np.int32).reshape(shape),
        position_ids=np.array(positions, np.int32).reshape(shape),
        seq_lens=np.array(lens_all, np.int32),
        sample_ids=np.array(sids_all, np.int64),
        segment_splits=np.array(splits, np.int64),
        row_index=np.array(index, np.int64),
    )


@settings(max_examples=150, deadline=None)
@given(rows=packed_rows(), cursor=st.integers(0, 2**63), step=st.integers(0, 2**40), data=st.data())
def test_round_trip_property(rows, cursor, step, data):
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=rows.num_rows, max_size=rows.num_rows)), bool)
    wire = encode_batch(rows, cursor=cursor, padding_rows=mask, step=step).SerializeToString()
    for got, got_mask, got_cursor, got_step in (
        decode_batch(packfeed_pb2.PackedBatch.FromString(wire)),
        decode_batch_bytes(wire),
    ):
        _assert_rows_equal(got, rows)
        np.testing.assert_array_equal(got_mask, mask)
        assert (got_cursor, got_step) == (cursor, step)
    assert PAD_SAMPLE_ID == -1  # the wire carries it as int64 -1 (all 0xff bytes)
