import pytest

from packfeed.service.config import DataConfig

BASE = dict(inputs=("a.jsonl",), tokenizer="tok", seq_len=128)


@pytest.mark.parametrize(
    "override, message",
    [
        pytest.param({"inputs": ()}, "inputs", id="no-inputs"),
        pytest.param({"inputs": "a.jsonl"}, "inputs", id="inputs-as-one-string"),
        pytest.param({"tokenizer": ""}, "tokenizer", id="no-tokenizer"),
        pytest.param({"seq_len": 1}, "seq_len", id="seq-len-too-small"),
        pytest.param({"seq_len": 12.5}, "seq_len", id="seq-len-not-int"),
        pytest.param({"strategy": "ffd"}, "strategy must be one of bfd, concat", id="unknown-strategy"),
        pytest.param({"overlong": "wrap"}, "overlong", id="unknown-overlong"),
        pytest.param({"format": "sharegpt"}, "format", id="unknown-format"),
        pytest.param({"loss": "prompt"}, "loss", id="unknown-loss"),
        pytest.param({"window_samples": 0}, "window_samples", id="empty-window"),
    ],
)
def test_invalid_config_is_a_clear_value_error(override, message):
    with pytest.raises(ValueError, match=message):
        DataConfig(**{**BASE, **override})


def test_round_trip_and_hash_names_the_stream():
    config = DataConfig(**BASE, seed=3)
    again = DataConfig.from_dict(config.to_dict())
    assert again == config and again.config_hash() == config.config_hash()
    assert DataConfig(**BASE, seed=4).config_hash() != config.config_hash()


def test_unknown_keys_are_rejected_with_the_known_ones_listed():
    with pytest.raises(ValueError, match="unknown data config keys \\['seqlen'\\]"):
        DataConfig.from_dict({**BASE, "seqlen": 5})


def test_config_is_frozen_and_keyword_only():
    config = DataConfig(**BASE)
    with pytest.raises(Exception):
        config.seq_len = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        DataConfig(("a",), "tok", 128)  # type: ignore[misc]
