import argparse

import pytest

from packfeed.service.commands.args import add_data_arguments, data_config_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_data_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_override_the_config_file_table():
    base = {"data": {"inputs": ["a.jsonl"], "tokenizer": "tok", "seq_len": 512, "seed": 7, "strategy": "concat"}}
    config = data_config_from_args(parse("b.jsonl", "--seq-len", "1024", "--no-add-eos"), base)
    assert config.inputs == ("b.jsonl",)
    assert (config.seq_len, config.seed, config.strategy, config.add_eos) == (1024, 7, "concat", False)


def test_unset_flags_keep_the_dataclass_defaults():
    config = data_config_from_args(parse("a.jsonl", "--tokenizer", "t", "--seq-len", "64"))
    assert (config.strategy, config.overlong, config.format, config.strict, config.add_eos) == (
        "exactfit", "truncate", "auto", False, True)


@pytest.mark.parametrize("argv, missing", [
    pytest.param(("--tokenizer", "t", "--seq-len", "8"), "INPUT", id="no-inputs"),
    pytest.param(("a.jsonl", "--seq-len", "8"), "--tokenizer", id="no-tokenizer"),
    pytest.param(("a.jsonl", "--tokenizer", "t"), "--seq-len", id="no-seq-len"),
])
def test_missing_required_settings_name_the_flag(argv, missing):
    with pytest.raises(ValueError, match=f"missing {missing}"):
        data_config_from_args(parse(*argv))
