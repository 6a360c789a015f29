"""Rows of an Arrow IPC file from its footer and its record batches' headers, not their bodies.

An IPC file ends with a footer (a flatbuffer, then its int32 length and ``ARROW1``) that lists
where every record batch is: ``Block {offset: int64, metaDataLength: int32, bodyLength:
int64}``, 24 bytes each. A batch's row count is not there but in its header (the ``Message``
flatbuffer at ``offset``, ``metaDataLength`` bytes with its prefix): ``Message.header`` is a
``RecordBatch`` table whose field 0 is ``length``. pyarrow's ``count_rows`` reads every batch
whole (header and body) to get it; this reads the last ``TAIL_BYTES`` (footer), then the
headers alone by ``storage.read_ranges``, which coalesces headers closer than its gap: a file
of small batches costs one HEAD and two GETs; one of large batches one more GET per batch.

Layouts: https://arrow.apache.org/docs/format/Columnar.html#ipc-file-format and
``format/File.fbs``, ``format/Message.fbs`` of the Arrow repository. Flatbuffers here: a
buffer starts with the uint32 offset of its root table; a table starts with the int32 distance
back to its vtable (uint16 vtable size, uint16 table size, one uint16 offset per field, 0 for
an absent field); a vector is a uint32 count followed by its elements.
"""

from __future__ import annotations

import struct

from packfeed.service.storage import ObjectInfo, StorageError, display, read_range, read_ranges

MAGIC = b"ARROW1"
TAIL_BYTES = 64 << 10
RECORD_BATCH = 3  # MessageHeader union: NONE, Schema, DictionaryBatch, RecordBatch, ...
CONTINUATION = 0xFFFFFFFF
_BLOCK = struct.Struct("<qi4xq")


def ipc_file_rows(path: str, size: int, *, expect: ObjectInfo | None = None) -> int | None:
    """Rows of the Arrow IPC file ``path`` of ``size`` bytes; None when it does not end like an
    IPC file (an IPC stream has no footer). ValueError for a footer that cannot be one."""
    if size < 2 * len(MAGIC) + 4:
        return None
    tail = read_range(path, max(0, size - TAIL_BYTES), TAIL_BYTES, expect=expect)
    if not tail.endswith(MAGIC):
        return None
    footer_length = struct.unpack_from("<i", tail, len(tail) - len(MAGIC) - 4)[0]
    footer_end = size - len(MAGIC) - 4
    try:
        if not 0 < footer_length <= footer_end - 8:
            raise ValueError(f"a footer of {footer_length} bytes in a file of {size}")
        if footer_length <= len(tail) - len(MAGIC) - 4:
            footer = tail[len(tail) - len(MAGIC) - 4 - footer_length:len(tail) - len(MAGIC) - 4]
        else:
            footer = read_range(path, footer_end - footer_length, footer_length, expect=expect)
        blocks = _record_batch_blocks(footer)
        headers = read_ranges(path, blocks, expect=expect)
        return sum(_batch_length(h) for h in headers)
    except (struct.error, IndexError, ValueError) as e:
        if isinstance(e, StorageError):
            raise
        raise ValueError(f"input {display(path)!r}: not a readable arrow file (a broken IPC footer: {e}); "
                         "re-export it or leave it out") from None


def _record_batch_blocks(footer: bytes) -> list[tuple[int, int]]:
    """(offset, metaDataLength) of each record batch the footer lists (``Footer`` field 3)."""
    field = _field(footer, _root(footer), 3)
    if not field:
        return []
    vector = field + _u32(footer, field)
    count = _u32(footer, vector)
    return [_BLOCK.unpack_from(footer, vector + 4 + i * _BLOCK.size)[:2] for i in range(count)]


def _batch_length(header: bytes) -> int:
    """``RecordBatch.length`` of an encapsulated message: [0xFFFFFFFF] int32 size, flatbuffer."""
    start = 8 if _u32(header, 0) == CONTINUATION else 4
    message = header[start:]
    root = _root(message)
    kind = _field(message, root, 1)
    if not kind or message[kind] != RECORD_BATCH:
        raise ValueError("it points at a message that is not a record batch")
    batch = _field(message, root, 2)
    length = _field(message, batch + _u32(message, batch), 0)
    return struct.unpack_from("<q", message, length)[0] if length else 0


def _root(buf: bytes) -> int:
    return _u32(buf, 0)


def _field(buf: bytes, table: int, index: int) -> int:
    """Where field ``index`` of the table at ``table`` lies in ``buf``; 0 when it is absent."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    if 4 + 2 * index >= struct.unpack_from("<H", buf, vtable)[0]:
        return 0
    offset = struct.unpack_from("<H", buf, vtable + 4 + 2 * index)[0]
    return table + offset if offset else 0


def _u32(buf: bytes, at: int) -> int:
    return struct.unpack_from("<I", buf, at)[0]
