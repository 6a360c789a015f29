"""TrainState: a checkpoint's trainer_state.json as a typed record.

Checked: the record the worker writes today (``{"step", **RowFeeder.state(step), "config"}``)
comes back from ``from_dict``/``to_dict`` as the same JSON text, byte for byte; a checkpoint
from before ``manifest``/``config`` existed loads and is written back as it was; a damaged
field is a ValueError that names it (with the file, through ``read_train_state``); the
accessors read what the driver's checks used to read by key.
"""

from __future__ import annotations

import json

import pytest
from support.streams import plain_rows

from packfeed.service.data.config import DataConfig
from packfeed.service.delivery.manifest import Manifest
from packfeed.trainer.state.checkpoint import STATE_FILE
from packfeed.trainer.run_config import ModelConfig, RunConfig, TrainConfig
from packfeed.service.delivery.feeder import RowFeeder
from packfeed.trainer.state.resume import finished, read_train_state
from packfeed.trainer.state.train_state import TrainState

# A checkpoint's trainer_state.json as the worker writes it (json.dumps(state, indent=1)), config cut short.
GOLDEN = """{
 "step": 6,
 "stream": {
  "version": 1,
  "cursor": 48,
  "step": 6,
  "config_hash": "9f3c",
  "seq_len": 4096
 },
 "manifest": {
  "key": "9f3c-f1",
  "first_row": {
   "0": 0,
   "1": 40
  },
  "total_rows": 96
 },
 "config": {
  "model": {
   "name": "tiny-llama",
   "attn": "auto",
   "overrides": {}
  },
  "train": {
   "objective": "dpo"
  }
 }
}"""


def test_the_golden_record_round_trips_byte_for_byte_and_reads_by_name():
    state = TrainState.from_dict(json.loads(GOLDEN))
    assert json.dumps(state.to_dict(), indent=1) == GOLDEN
    assert (state.step, state.cursor, state.total_rows, state.manifest_key) == (6, 48, 96, "9f3c-f1")
    assert state.model_config == {"name": "tiny-llama", "attn": "auto", "overrides": {}}
    assert state.objective == "dpo"
    assert (state.stream_state.config_hash, state.stream_state.seq_len) == ("9f3c", 4096)


SEQ_LEN = 4


def test_the_record_the_worker_builds_round_trips_byte_for_byte():
    """Two windows of 3 rows, 2 ranks of 1 row a step: after step 3 the stream is used up."""
    def open_reader(window, first_row):
        for w in range(window, 2):
            yield w, plain_rows(3 * w, 3, seq_len=SEQ_LEN)

    feeder = RowFeeder(open_reader, Manifest("cafe-f1"), world_size=2, grad_accum=1, micro_rows=1, seq_len=SEQ_LEN,
                       pad_id=0, config_hash="cafe", capacity=128)
    for step in range(3):
        assert all(feeder.get_step(rank, step) is not None for rank in range(2))
    assert feeder.get_step(0, 3) is None and feeder.total_rows() == 6
    run = RunConfig(data=DataConfig.from_inputs(["a.jsonl"], tokenizer="tok", seq_len=SEQ_LEN),
                    model=ModelConfig(name="tiny-llama"), train=TrainConfig(max_steps=10))
    written = json.dumps({"step": 3, **feeder.state(3), "config": run.to_dict()}, indent=1)  # worker._checkpoint's
    state = TrainState.from_dict(json.loads(written))
    assert json.dumps(state.to_dict(), indent=1) == written
    assert list(state.to_dict()) == ["step", "stream", "manifest", "config"]
    assert (state.step, state.cursor, state.total_rows) == (3, 6, 6)
    assert (state.manifest_key, state.objective) == ("cafe-f1", "sft")
    assert finished(state, run) == ("its data ran out at step 3 (6 rows)", "pass --overwrite to start again")


def test_an_old_checkpoint_without_manifest_or_config_loads_and_is_written_back_as_it_was():
    old = {"step": 2, "stream": {"version": 1, "cursor": 8, "step": 2, "config_hash": "cafe", "seq_len": 4}}
    state = TrainState.from_dict(old)
    assert state.to_dict() == old and list(state.to_dict()) == ["step", "stream"]
    assert (state.manifest, state.config, state.total_rows, state.manifest_key) == (None, None, None, None)
    assert (state.model_config, state.objective) == (None, None)
    no_objective = TrainState.from_dict({**old, "config": {"model": {"name": "m"}, "train": {"lr": 1e-3}}})
    assert no_objective.objective == "sft", "a checkpoint from before objectives existed trained SFT"
    run = RunConfig(data=DataConfig.from_inputs(["a.jsonl"], tokenizer="tok", seq_len=4),
                    model=ModelConfig(name="tiny-llama"), train=TrainConfig(max_steps=2))
    assert finished(state, run)[0] == "it trained step 2 of 2"
    assert finished(TrainState(step=1, stream={}), run) is None, "{}: the stream's start, nothing finished"


STREAM = {"version": 1, "cursor": 8, "step": 2, "config_hash": "cafe", "seq_len": 4}


@pytest.mark.parametrize(("record", "match"), [
    pytest.param([1, 2], "a trainer state is a dict, got list", id="not-a-dict"),
    pytest.param({"stream": STREAM}, "field 'step' is missing", id="step-missing"),
    pytest.param({"step": 2}, "field 'stream' is missing", id="stream-missing"),
    pytest.param({"step": "2", "stream": STREAM}, "field 'step' must be an integer >= 0, got '2'", id="step-string"),
    pytest.param({"step": -1, "stream": STREAM}, "field 'step' must be an integer >= 0", id="step-negative"),
    pytest.param({"step": True, "stream": STREAM}, "field 'step' must be an integer >= 0", id="step-bool"),
    pytest.param({"step": 2, "stream": None}, "field 'stream' must be a stream state record", id="stream-null"),
    pytest.param({"step": 2, "stream": {**STREAM, "cursor": -3}}, "field 'stream': stream state field 'cursor'",
                 id="stream-cursor-negative"),
    pytest.param({"step": 2, "stream": {**STREAM, "version": 9}}, "field 'stream': unknown stream state version 9",
                 id="stream-version"),
    pytest.param({"step": 2, "stream": STREAM, "manifest": [1]}, "field 'manifest' must be a dict", id="manifest-list"),
    pytest.param({"step": 2, "stream": STREAM, "manifest": {"key": 5}}, "field 'manifest.key' must be a string",
                 id="manifest-key"),
    pytest.param({"step": 2, "stream": STREAM, "manifest": {"total_rows": "x"}}, "field 'manifest.total_rows'",
                 id="manifest-total-rows"),
    pytest.param({"step": 2, "stream": STREAM, "config": "run"}, "field 'config' must be a dict", id="config-string"),
    pytest.param({"step": 2, "stream": STREAM, "config": {"model": "m"}}, "field 'config.model' must be a dict",
                 id="config-model"),
    pytest.param({"step": 2, "stream": STREAM, "config": {"train": {"objective": 1}}},
                 "field 'config.train.objective' must be a string", id="config-objective"),
    pytest.param({"step": 2, "stream": STREAM, "extra": 1}, r"unknown trainer state field\(s\) \['extra'\]",
                 id="unknown-field"),
])
def test_a_damaged_field_is_named(record, match):
    with pytest.raises(ValueError, match=match):
        TrainState.from_dict(record)


def test_a_damaged_checkpoint_says_which_file_and_field(tmp_path):
    (tmp_path / STATE_FILE).write_text(json.dumps({"step": 3, "stream": {**STREAM, "seq_len": 0}}))
    with pytest.raises(ValueError, match=rf"{STATE_FILE} is damaged \(trainer state field 'stream': stream state field "
                                         r"'seq_len' must be an integer >= 1, got 0\): resume from another checkpoint"):
        read_train_state(tmp_path)
    (tmp_path / STATE_FILE).write_text(json.dumps({"step": 3, "stream": STREAM}))
    assert read_train_state(tmp_path) == TrainState(step=3, stream=STREAM)
