"""Manifest: the stream's window starts and end, kept in a file across restarts (located by
row, written a line per fact, torn lines and other streams' files ignored), and the hub that
records into it. The hub's own tests, and their helpers used here, are in test_hub.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from packfeed.service.delivery.manifest import Manifest
from support.streams import SyntheticStream
from test_hub import make_hub, read_ranks


def test_manifest_locate_golden():
    m = Manifest("k")
    for window, first in ((2, 37), (5, 188), (3, 150)):
        m.record(window, first)
    assert m.locate(0) == (0, 0)
    assert m.locate(36) == (0, 0)
    assert m.locate(37) == (2, 37)
    assert m.locate(149) == (2, 37)
    assert m.locate(150) == (3, 150)
    assert m.locate(10_000) == (5, 188)


def test_manifest_round_trip_through_its_file(tmp_path):
    path = tmp_path / "state" / "m.json"
    m = Manifest("cfg-abc", path)
    assert m.first_row == {0: 0} and m.total_rows is None
    m.record(3, 120)
    m.record(7, 400)
    m.record_end(555)
    back = Manifest("cfg-abc", path)
    assert back.first_row == {0: 0, 3: 120, 7: 400}
    assert back.total_rows == 555
    assert back.locate(401) == (7, 400)
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.json"], "temporary files left behind"
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"key": "cfg-abc"} and len(lines) == 5  # a line per fact known
    m.record(7, 400)  # known: nothing written
    with open(path, "a") as f:
        f.write('{"w": 9, "r"')  # a server killed mid-line
    back = Manifest("cfg-abc", path)
    assert back.first_row == {0: 0, 3: 120, 7: 400} and back.total_rows == 555
    back.record(9, 700)  # appended after the torn line, read back
    assert Manifest("cfg-abc", path).locate(800) == (9, 700)


def test_a_manifest_of_another_stream_is_replaced_at_the_first_write(tmp_path):
    path = tmp_path / "m.json"
    Manifest("old", path).record(4, 100)
    m = Manifest("new", path)
    assert m.first_row == {0: 0}
    m.record(2, 50)
    assert Manifest("new", path).first_row == {0: 0, 2: 50} and Manifest("old", path).first_row == {0: 0}


def test_manifest_locate_matches_a_scan_over_many_windows():
    rng = np.random.default_rng(0)
    starts = np.concatenate([[0], np.cumsum(rng.integers(0, 5, 2000))])  # empty windows share a start
    m = Manifest("k")
    for window in rng.permutation(len(starts)):
        m.record(int(window), int(starts[window]))
    for row in range(0, int(starts[-1]) + 10, 7):
        window = max(w for w in range(len(starts)) if starts[w] <= row)
        assert m.locate(row) == (window, int(starts[window]))


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(json.dumps({"key": "other-config", "first_row": {"3": 120}, "total_rows": 555}), id="other-key"),
        pytest.param(json.dumps({"first_row": {"3": 120}, "total_rows": 555}), id="no-key"),
        pytest.param("{not json", id="corrupt"),
    ],
)
def test_manifest_file_for_another_stream_is_ignored(tmp_path, content):
    path = tmp_path / "m.json"
    path.write_text(content)
    m = Manifest("cfg-abc", path)
    assert m.first_row == {0: 0} and m.total_rows is None
    assert m.locate(500) == (0, 0)


def test_hub_records_window_starts_in_the_manifest(tmp_path):
    stream = SyntheticStream()
    path = tmp_path / "m.json"
    hub = make_hub(stream, capacity=256, manifest=Manifest("synthetic", path))
    read_ranks(hub, 2, 32, 0)
    hub.close()
    saved = Manifest("synthetic", path)
    # every window, the empty one too (it starts where the next one does)
    assert saved.first_row == dict(enumerate(stream.starts))
    assert saved.total_rows == stream.total


def test_manifest_write_failure_is_logged_and_the_stream_goes_on(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the manifest's directory should be
    stream = SyntheticStream()
    hub = make_hub(stream, capacity=256, manifest=Manifest("synthetic", blocked / "m.json"))
    with pytest.raises(OSError):
        hub.manifest.check_writable()
    with caplog.at_level("WARNING", logger="packfeed"):
        got = read_ranks(hub, 1, 32, 0)
    hub.close()
    assert got[0] == list(range(stream.total))
    assert sum("cannot write the stream manifest" in r.message for r in caplog.records) == 1
