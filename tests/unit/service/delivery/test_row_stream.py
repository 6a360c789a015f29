"""The row stream of a packed directory (service/delivery/row_stream.py): which inputs are one,
and the RowStream ``open_stream`` makes of it: its windows are the row groups, every first row
known up front, rows numbered globally from any window. No Ray: a packed directory needs none."""

from __future__ import annotations

import numpy as np
import pytest

from packfeed.client.rows import PackedRows
from packfeed.service.delivery.manifest import Manifest
from packfeed.service.delivery.row_stream import PackedDir, find_packed_dir, open_stream
from support.streams import plain_rows, write_plain_packed_dir

SEQ = 8
GROUPS = (5, 3, 4)  # rows of each write: one row group each


def rows(first: int, n: int) -> PackedRows:
    return plain_rows(first, n, SEQ)


@pytest.fixture
def packed(tmp_path):
    out = tmp_path / "packed"
    write_plain_packed_dir(out, GROUPS, SEQ)
    return out


def test_only_one_packed_directory_is_served_as_it_is(packed, tmp_path):
    found = find_packed_dir([str(packed)])
    assert isinstance(found, PackedDir) and (found.path, found.seq_len, found.num_rows) == (str(packed), SEQ, 12)
    (tmp_path / "data").mkdir()
    for inputs in ([str(tmp_path / "data")], [str(packed), str(packed)], [str(tmp_path / "a.jsonl")]):
        assert find_packed_dir(inputs) is None, inputs


@pytest.mark.parametrize("window", range(len(GROUPS) + 1))
def test_a_packed_directory_reads_from_any_window_with_global_rows(packed, window):
    stream = open_stream(find_packed_dir([str(packed)]))
    manifest = Manifest(stream.manifest_key)
    stream.seed_manifest(manifest)
    firsts = np.cumsum((0,) + GROUPS)
    assert manifest.total_rows == 12 and stream.epoch_rows(manifest) == [12]
    assert [manifest.first_row[k] for k in range(len(GROUPS))] == firsts[:-1].tolist()
    got = list(stream.open_reader(window, int(firsts[window])))
    assert [k for k, _ in got] == list(range(window, len(GROUPS)))
    read = np.concatenate([r.row_index for _, r in got]) if got else np.zeros(0, np.int64)
    assert read.tolist() == list(range(int(firsts[window]), 12))
    assert all((r.input_ids[:, 0] == r.row_index * SEQ + 1).all() for _, r in got)  # the rows those indices name
    one = stream.pack_window(window)
    assert one is None if window == len(GROUPS) else one.row_index.tolist() == list(range(GROUPS[window]))
