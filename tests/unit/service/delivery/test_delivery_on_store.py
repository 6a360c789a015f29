"""What serve keeps and reads, on an object store the same as on disk (support/stores.py: the
storage layer's URI path without a socket): the stream manifest, whole objects written at a
bounded rate, and a packed directory served from the store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.stores import keys, local_or_store, memory_store  # noqa: F401 - the fixtures "where", "store"

from packfeed.client.rows import PackedRows
from packfeed.service import storage
from packfeed.service.delivery.manifest import Manifest
from packfeed.service.delivery.row_stream import find_packed_dir, open_stream
from support.streams import plain_rows, write_plain_packed_dir

SEQ = 8
GROUPS = (5, 3, 4)  # rows of each write: one row group each


def rows(first: int, n: int) -> PackedRows:
    return plain_rows(first, n, SEQ)


def test_the_stream_manifest_on_a_store_resumes_as_on_disk(where):
    path = storage.join(where, "state", "k.json")
    m = Manifest("k", path)
    m.check_writable()
    for window, first in ((1, 40), (2, 95), (3, 130)):
        m.record(window, first)
    m.record_end(170)
    back = Manifest("k", path)
    assert back.first_row == {0: 0, 1: 40, 2: 95, 3: 130} and back.total_rows == 170
    assert back.locate(100) == (2, 95)
    assert Manifest("another stream", path).first_row == {0: 0}, "a manifest of another key is never trusted"
    probes = [name for name in (keys(storage.join(where, "state")) if "://" in where else
                                [p.name for p in Path(where, "state").iterdir()]) if "probe" in name]
    assert probes == [], "the writability probe is removed"


def test_a_manifest_on_a_store_writes_whole_objects_at_a_bounded_rate(store, monkeypatch):
    """An object cannot be appended to: each write is the whole file, at most every
    remote_write_s seconds; the end of the stream and flush() write what is pending."""
    writes = []
    real = storage.write_bytes_atomic
    monkeypatch.setattr("packfeed.service.delivery.manifest.storage.write_bytes_atomic",
                        lambda uri, data: (writes.append(data), real(uri, data)))
    path = f"{store}/state/k.json"
    m = Manifest("k", path)
    m.remote_write_s = 3600.0
    for window in range(1, 50):
        m.record(window, 10 * window)
    assert len(writes) == 1, "the first record writes the file; the others wait"
    assert Manifest("k", path).first_row == {0: 0, 1: 10}
    m.flush()
    assert len(writes) == 2 and len(Manifest("k", path).first_row) == 50
    m.flush()
    assert len(writes) == 2, "nothing pending: nothing written"
    m.record(50, 500)
    m.record_end(510)
    assert len(writes) == 3 and Manifest("k", path).total_rows == 510 and Manifest("k", path).first_row[50] == 500
    storage.write_bytes_atomic(path, b"\xff\xfe not json")
    assert Manifest("k", path).first_row == {0: 0}, "a damaged manifest is a cache miss"


def test_a_packed_directory_on_a_store_streams_the_rows_of_the_local_one(tmp_path, store):
    streams = {}
    for name, out in (("local", str(tmp_path / "packed")), ("store", f"{store}/packed")):
        write_plain_packed_dir(out, GROUPS, SEQ)
        streams[name] = open_stream(find_packed_dir([out]))
    local, remote = streams["local"], streams["store"]
    assert (remote.manifest_key, remote.known_first_rows, remote.known_total) == (
        local.manifest_key, local.known_first_rows, local.known_total)
    for window in range(len(GROUPS)):
        a, b = list(local.open_reader(window, 0)), list(remote.open_reader(window, 0))
        assert [k for k, _ in a] == [k for k, _ in b] == list(range(window, len(GROUPS)))
        for (_, x), (_, y) in zip(a, b):
            assert np.array_equal(x.input_ids, y.input_ids) and np.array_equal(x.row_index, y.row_index)
    storage.write_bytes_atomic(f"{store}/packed/part-00000.parquet", storage.read_bytes(
        f"{store}/packed/part-00000.parquet") + b"x")  # replaced after the stream opened
    with pytest.raises(ValueError, match="part-00000.parquet: changed since it was planned"):
        remote.pack_window(0)


def test_a_store_refusing_the_manifest_is_tried_once_an_interval_and_said_once(store, monkeypatch, caplog):
    attempts = []

    def refuse(uri, data):
        attempts.append(uri)
        raise storage.StorageError(uri, "access denied (AccessDenied)", kind="denied")

    monkeypatch.setattr("packfeed.service.delivery.manifest.storage.write_bytes_atomic", refuse)
    m = Manifest("k", f"{store}/state/k.json")
    m.remote_write_s = 3600.0
    for window in range(1, 20):
        m.record(window, 10 * window)  # the stream goes on: no error reaches the reader
    assert len(attempts) == 1, "not a failing request per window"
    assert m.locate(55) == (5, 50)
    assert sum("cannot write the stream manifest" in r.getMessage() for r in caplog.records) == 1
