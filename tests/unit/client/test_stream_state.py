"""StreamState: the one resume record of the stream (client, torch dataset, train checkpoints).

Checked: the dict format is the one checkpoints already hold (a golden record loads and is
written back unchanged); every state survives to_dict/JSON/from_dict; a bad record is refused
naming the field at fault; a state of another stream is refused saying what differs; the
client's stream and dataset take and give the same record.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from packfeed.client.state import STATE_VERSION, StreamState
from packfeed.client.stream import PackedStream

# What PackedStream.state_dict() and a `packfeed train` checkpoint have always held.
GOLDEN = {"version": 1, "cursor": 48, "step": 6, "config_hash": "9f3c0a", "seq_len": 4096}


def test_the_golden_record_loads_and_is_written_back_unchanged():
    state = StreamState.from_dict(GOLDEN)
    assert state == StreamState(cursor=48, step=6, config_hash="9f3c0a", seq_len=4096)
    assert state.to_dict() == GOLDEN and list(state.to_dict()) == list(GOLDEN), "same keys, same order"
    assert STATE_VERSION == GOLDEN["version"]


@pytest.mark.parametrize("state", [
    StreamState(),
    StreamState(cursor=7, step=1),
    StreamState(cursor=10**12, step=10**6, config_hash="abc", seq_len=1),
    StreamState(cursor=np.int64(96), step=np.int32(3), config_hash="abc", seq_len=np.int64(512)),
])
def test_every_state_survives_a_round_trip_through_json(state):
    record = json.loads(json.dumps(state.to_dict()))
    assert StreamState.from_dict(record) == state
    assert all(type(record[k]) is int for k in ("cursor", "step")), "numpy integers are stored as ints"


@pytest.mark.parametrize("record,state", [
    pytest.param({"version": 1}, StreamState(), id="version-only"),
    pytest.param({"version": 1, "cursor": 600, "step": 0}, StreamState(cursor=600), id="no-stream-pinned"),
    pytest.param({"version": 1, "cursor": 4, "step": 1, "config_hash": None, "seq_len": None},
                 StreamState(cursor=4, step=1), id="saved-before-the-first-batch"),
])
def test_a_partial_record_takes_the_defaults(record, state):
    assert StreamState.from_dict(record) == state


@pytest.mark.parametrize("record,match", [
    pytest.param({"cursor": 3}, "unknown stream state version None, expected 1", id="no-version"),
    pytest.param({**GOLDEN, "version": 2}, "unknown stream state version 2", id="other-version"),
    pytest.param({**GOLDEN, "cursur": 3}, r"unknown stream state field\(s\) \['cursur'\]", id="misspelt-field"),
    pytest.param({**GOLDEN, "cursor": -1}, "'cursor' must be an integer >= 0, got -1", id="negative-cursor"),
    pytest.param({**GOLDEN, "cursor": "48"}, "'cursor' must be an integer >= 0, got '48'", id="cursor-string"),
    pytest.param({**GOLDEN, "cursor": 48.0}, "'cursor' must be an integer >= 0, got 48.0", id="cursor-float"),
    pytest.param({**GOLDEN, "step": True}, "'step' must be an integer >= 0, got True", id="step-bool"),
    pytest.param({**GOLDEN, "seq_len": 0}, "'seq_len' must be an integer >= 1, got 0", id="no-seq-len"),
    pytest.param({**GOLDEN, "config_hash": 5}, "'config_hash' must be a string or None, got 5", id="hash-number"),
    pytest.param([("version", 1)], "a stream state is a dict", id="not-a-dict"),
])
def test_a_bad_record_is_refused_naming_the_field(record, match):
    with pytest.raises(ValueError, match=match):
        StreamState.from_dict(record)


def test_resume_from_takes_a_state_its_record_or_nothing():
    state = StreamState(cursor=8, step=2)
    assert StreamState.resume_from(state) is state
    assert StreamState.resume_from(state.to_dict()) == state
    assert StreamState.resume_from(None) == StreamState.resume_from({}) == StreamState()
    with pytest.raises(ValueError, match="version"):
        StreamState.resume_from({"cursor": 8})


def test_a_step_advances_the_cursor_and_the_step_and_pinning_keeps_what_is_known():
    state = StreamState(cursor=8, step=2).after_step(16)
    assert (state.cursor, state.step) == (16, 3)
    assert state.pinned("abc", 64) == StreamState(cursor=16, step=3, config_hash="abc", seq_len=64)
    pinned = StreamState(config_hash="old", seq_len=32)
    assert pinned.pinned("new", 64) == pinned, "a state keeps the stream it was saved on"


@pytest.mark.parametrize("config_hash,seq_len,match", [
    ("abc", 64, None),
    (None, None, None),
    ("abc", None, None),
    ("other", 64, "trained on data config other, this run's is abc"),
    ("abc", 128, "trained on rows of 128 tokens, this run's seq_len is 64"),
])
def test_a_state_continues_only_its_own_stream(config_hash, seq_len, match):
    state = StreamState(cursor=8, step=1, config_hash=config_hash, seq_len=seq_len)
    if match is None:
        state.check_matches("abc", 64)
        return
    with pytest.raises(ValueError, match=match) as refused:
        state.check_matches("abc", 64, fix="start a new run (--overwrite)")
    assert str(refused.value).endswith("or start a new run (--overwrite)")


@pytest.mark.parametrize("state", [GOLDEN, StreamState.from_dict(GOLDEN), {"version": 1, "cursor": 600, "step": 0}])
def test_the_stream_takes_a_state_and_gives_its_record_back(state):
    stream = PackedStream("127.0.0.1:1", state=state)  # no call is made: nothing connects
    try:
        assert stream.state_dict() == StreamState.resume_from(state).to_dict()
        assert stream.state == StreamState.resume_from(state)
    finally:
        stream.close()


def test_the_stream_and_the_dataset_refuse_a_bad_state_at_once():
    with pytest.raises(ValueError, match="'cursor' must be an integer"):
        PackedStream("127.0.0.1:1", state={**GOLDEN, "cursor": -5})
    pytest.importorskip("torch")
    from packfeed.client.torch_data import PackedIterableDataset

    dataset = PackedIterableDataset("127.0.0.1:1", state=GOLDEN)
    assert dataset.state_dict() == GOLDEN
    with pytest.raises(ValueError, match="version"):
        dataset.load_state_dict({"cursor": 3})
    dataset.load_state_dict({**GOLDEN, "cursor": 96})
    assert dataset.state_dict()["cursor"] == 96
