"""PackedRows <-> the wire message ``packfeed.v1.PackedBatch``, column-wise raw bytes.

One message carries B rows of length L. Every column is one little-endian ``bytes`` field
(layout documented in protos/packfeed/v1/packfeed.proto), so decoding is ``np.frombuffer`` on
each field: no per-element work and no copy made by this module.

Worked example, B=1, L=4, samples 7 ([5, 6]) then padding::

    input_ids      b'\\x05\\0\\0\\0 \\x06\\0\\0\\0 \\0\\0\\0\\0 \\0\\0\\0\\0'   int32 [5, 6, 0, 0]
    seq_lens       int32 [2, 2]      segment_splits int64 [0, 2]
    sample_ids     int64 [7, -1]     row_index int64 [12]      padding_rows uint8 [0]
    pair_roles     int8 [-1, -1]     (absent in a message from an older server: all -1)

Decoded arrays are READ-ONLY views of the message's bytes objects (``flags.writeable`` is
False, ``flags.owndata`` is False): copy one (``arr.copy()``) before writing to it. They keep
those bytes objects alive, not the message. Their dtypes are little-endian ('<i4', '<i8'),
which is the native dtype on every platform packfeed runs on.

Two decoders, same result and checks:

* ``decode_batch(msg)`` from a parsed message. Protobuf itself copies: parsing copies the wire
  buffer into the message, and reading a bytes field of a upb message builds a new Python
  ``bytes`` on every access (``decode_batch`` reads each field once). The views are then over
  those bytes.
* ``decode_batch_bytes(data)`` from the serialized message, e.g. as the gRPC stub's response
  deserializer: a 13-field wire-format loop, the arrays are views into the very buffer gRPC
  received. No copy anywhere after gRPC; the one the client should use on the hot path.

Encoding makes one ``tobytes`` copy per column. Cost: O(B*L) memcpy to encode; decoding is O(B)
validation plus, for ``decode_batch``, protobuf's copies.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
from packfeed.client.rows import PackedRows, no_pair_roles
from packfeed.client.v1 import packfeed_pb2

WIRE_VERSION = 1
I4 = np.dtype("<i4")
I8 = np.dtype("<i8")
I1 = np.dtype("i1")
U1 = np.dtype("u1")

PackedBatch = packfeed_pb2.PackedBatch


class DecodedBatch(NamedTuple):
    """A decoded PackedBatch: the rows, which of them are all-padding fillers, the cursor after
    and the step number (counted from the request's cursor)."""

    rows: PackedRows
    padding_rows: np.ndarray  # bool [B], read-only view
    cursor: int
    step: int = 0


def _le_bytes(array: np.ndarray, dtype: np.dtype) -> bytes:
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def encode_batch(
    rows: PackedRows, *, cursor: int, padding_rows: np.ndarray | None = None, step: int = 0
) -> PackedBatch:
    """Pack ``rows`` into a PackedBatch message.

    ``padding_rows``: bool [B], True for the all-padding tail rows (None: no padding rows).
    ``cursor``: rows of the global stream consumed after this batch's step (resume point).
    ``step``: 0-based step number counted from the request's cursor.
    Raises ValueError when the arrays do not have the shapes of B rows of length L.
    """
    b, seq_len = rows.num_rows, rows.seq_len
    k = len(rows.seq_lens)
    if rows.labels.shape != (b, seq_len) or rows.position_ids.shape != (b, seq_len):
        raise ValueError(f"labels and position_ids must be [{b}, {seq_len}] like input_ids")
    if (len(rows.sample_ids) != k or len(rows.pair_roles) != k or rows.segment_splits.shape != (b + 1,)
            or len(rows.row_index) != b):
        raise ValueError(
            f"need sample_ids and pair_roles [{k}] (one per segment), segment_splits [{b + 1}] and row_index "
            f"[{b}]; got {len(rows.sample_ids)}, {len(rows.pair_roles)}, {rows.segment_splits.shape}, "
            f"{len(rows.row_index)}"
        )
    if padding_rows is None:
        padding_rows = np.zeros(b, dtype=bool)
    padding_rows = np.asarray(padding_rows)
    if padding_rows.shape != (b,):
        raise ValueError(f"padding_rows must be a bool mask of shape [{b}], got {padding_rows.shape}")
    if cursor < 0 or step < 0:
        raise ValueError(f"cursor and step must be >= 0, got cursor={cursor}, step={step}")
    return PackedBatch(
        num_rows=b,
        seq_len=seq_len,
        input_ids=_le_bytes(rows.input_ids, I4),
        labels=_le_bytes(rows.labels, I4),
        position_ids=_le_bytes(rows.position_ids, I4),
        seq_lens=_le_bytes(rows.seq_lens, I4),
        segment_splits=_le_bytes(rows.segment_splits, I8),
        sample_ids=_le_bytes(rows.sample_ids, I8),
        row_index=_le_bytes(rows.row_index, I8),
        padding_rows=_le_bytes(padding_rows.astype(bool), U1),
        cursor=int(cursor),
        step=int(step),
        pair_roles=_le_bytes(rows.pair_roles, I1),
    )


def _view(field: str, data, dtype: np.dtype, count: int) -> np.ndarray:
    if len(data) != count * dtype.itemsize:
        raise ValueError(
            f"malformed PackedBatch: {field} has {len(data)} bytes, expected {count} x {dtype.itemsize}"
        )
    return np.frombuffer(data, dtype=dtype)


def _decode(num_rows: int, seq_len: int, cursor: int, step: int, field: Callable[[str], object]) -> DecodedBatch:
    b, n = num_rows, num_rows * seq_len
    splits = _view("segment_splits", field("segment_splits"), I8, b + 1)
    seq_lens_bytes = field("seq_lens")
    k = len(seq_lens_bytes) // I4.itemsize
    if splits[0] != 0 or splits[-1] != k or (np.diff(splits) < 0).any():
        raise ValueError(
            f"malformed PackedBatch: segment_splits must rise from 0 to the {k} segments, got "
            f"{splits[:4].tolist()}...{splits[-1:].tolist()}"
        )
    padding = _view("padding_rows", field("padding_rows"), U1, b)
    roles_bytes = field("pair_roles")  # empty from an older server: no pairs
    roles = _view("pair_roles", roles_bytes, I1, k) if len(roles_bytes) or not k else no_pair_roles(k)
    if ((roles < -1) | (roles > 1)).any():
        raise ValueError("malformed PackedBatch: pair_roles must hold -1, 0 or 1 per segment")
    if (padding > 1).any():
        raise ValueError("malformed PackedBatch: padding_rows must hold 0 or 1 per row")
    rows = PackedRows(
        input_ids=_view("input_ids", field("input_ids"), I4, n).reshape(b, seq_len),
        labels=_view("labels", field("labels"), I4, n).reshape(b, seq_len),
        position_ids=_view("position_ids", field("position_ids"), I4, n).reshape(b, seq_len),
        seq_lens=_view("seq_lens", seq_lens_bytes, I4, k),
        sample_ids=_view("sample_ids", field("sample_ids"), I8, k),
        segment_splits=splits,
        row_index=_view("row_index", field("row_index"), I8, b),
        pair_roles=roles,
    )
    return DecodedBatch(rows=rows, padding_rows=padding.view(np.bool_), cursor=int(cursor), step=int(step))


def decode_batch(msg: PackedBatch) -> DecodedBatch:
    """Views over a PackedBatch's bytes: ``(rows, padding_rows, cursor, step)``, without copying.

    The arrays are read-only views (see the module docstring). Raises ValueError when a field's
    size does not match num_rows/seq_len or the segment offsets are inconsistent, so a corrupt
    message fails here and not deep inside a training step.
    """
    return _decode(
        int(msg.num_rows), int(msg.seq_len), int(msg.cursor), int(msg.step), lambda name: getattr(msg, name)
    )


# --- Decoding straight from the serialized message -------------------------------------------
# A gRPC stub created with ``response_deserializer=decode_batch_bytes`` (or None, then calling
# it) skips protobuf's two copies: the arrays are views into the very bytes object gRPC
# received. PackedBatch is flat (scalars and bytes fields), so its wire format is a short loop.

_FIELD_NUMBERS = {f.name: f.number for f in PackedBatch.DESCRIPTOR.fields}
_NUMBER_NAMES = {v: k for k, v in _FIELD_NUMBERS.items()}
_BYTES_FIELDS = frozenset(f.name for f in PackedBatch.DESCRIPTOR.fields if f.type == f.TYPE_BYTES)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("malformed PackedBatch: truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("malformed PackedBatch: varint longer than 10 bytes")


def parse_fields(data: bytes | memoryview) -> dict[str, object]:
    """The known fields of a serialized PackedBatch: ints for scalars, memoryviews into ``data``
    for bytes fields (no copy). Absent fields are absent; unknown fields are skipped, as
    protobuf does; a repeated field keeps its last value, as protobuf does for scalars.
    Cost: O(number of fields), independent of the payload size.
    """
    view = memoryview(data).cast("B")
    size, pos, out = len(view), 0, {}
    while pos < size:
        key, pos = _varint(view, pos)
        number, wire_type = key >> 3, key & 7
        name = _NUMBER_NAMES.get(number)
        if wire_type == 0:
            value, pos = _varint(view, pos)
        elif wire_type == 2:
            length, pos = _varint(view, pos)
            if pos + length > size:
                raise ValueError(f"malformed PackedBatch: field {number} runs past the end of the message")
            value, pos = view[pos : pos + length], pos + length
        elif wire_type in (1, 5):
            value, pos = None, pos + (8 if wire_type == 1 else 4)
        else:
            raise ValueError(f"malformed PackedBatch: unsupported wire type {wire_type} (field {number})")
        if name is not None:
            if (name in _BYTES_FIELDS) != (wire_type == 2):
                raise ValueError(f"malformed PackedBatch: field {name} has wire type {wire_type}")
            out[name] = value
    if pos != size:
        raise ValueError("malformed PackedBatch: truncated field")
    return out


def decode_batch_bytes(data: bytes | memoryview) -> DecodedBatch:
    """Like ``decode_batch`` but from the serialized message, with no copy at all: every array
    is a read-only view into ``data`` (keeping it alive). Same checks, same result.
    """
    fields = parse_fields(data)
    empty = memoryview(b"")
    return _decode(
        int(fields.get("num_rows", 0)),
        int(fields.get("seq_len", 0)),
        int(fields.get("cursor", 0)),
        int(fields.get("step", 0)),
        lambda name: fields.get(name, empty),
    )
