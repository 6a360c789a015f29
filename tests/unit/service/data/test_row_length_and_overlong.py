"""What a user's seq_len and strategy mean without further flags: a row too short to train on is
refused in one line (the library's DataConfig still takes toy rows), 1M-token rows stay legal,
and concat splits a long document across rows unless --overlong says otherwise."""

from __future__ import annotations

import argparse

import pytest

from packfeed.service.commands.args import add_data_arguments, data_config_from_args
from packfeed.service.commands.pack import FEW_ROWS, few_rows_notice
from packfeed.service.data.config import MIN_ROW_TOKENS, DataConfig


def from_flags(*argv: str, base: dict | None = None) -> DataConfig:
    parser = argparse.ArgumentParser()
    add_data_arguments(parser)
    return data_config_from_args(parser.parse_args(["a.jsonl", "--tokenizer", "t", *argv]), base)


@pytest.mark.parametrize("argv, base, name", [
    pytest.param(("--seq-len", "4"), None, "--seq-len 4", id="flag"),
    pytest.param((), {"data": {"seq_len": 1}}, r"\[data\] seq_len 1", id="config-file"),
])
def test_a_row_too_short_to_train_on_is_refused(argv, base, name):
    with pytest.raises(ValueError, match=f"^{name}: a row of fewer than {MIN_ROW_TOKENS} tokens .* give "
                                         f"{MIN_ROW_TOKENS} or more"):
        from_flags(*argv, base=base)


@pytest.mark.parametrize("seq_len", [MIN_ROW_TOKENS, 2048, 65_536, 1_000_000, 1 << 20])
def test_short_to_long_context_rows_are_legal(seq_len):
    assert from_flags("--seq-len", str(seq_len)).seq_len == seq_len


def test_the_library_still_takes_toy_rows():
    assert DataConfig.from_inputs(["a.jsonl"], tokenizer="t", seq_len=4).seq_len == 4  # golden tests' rows


@pytest.mark.parametrize("argv, overlong", [
    pytest.param(("--strategy", "concat"), "split", id="concat-splits"),
    pytest.param(("--strategy", "concat", "--overlong", "truncate"), "truncate", id="explicit-kept"),
    pytest.param(("--strategy", "concat", "--overlong", "drop"), "drop", id="explicit-drop"),
    pytest.param(("--strategy", "exactfit"), "truncate", id="exactfit-truncates"),
    pytest.param(("--strategy", "bfd"), "truncate", id="bfd-truncates"),
    pytest.param((), "truncate", id="default-strategy"),
])
def test_the_overlong_default_follows_the_strategy(argv, overlong):
    assert from_flags("--seq-len", "64", *argv).overlong == overlong


def test_the_resolved_policy_is_what_the_config_holds_and_hashes():
    implied = DataConfig.from_inputs(["a.jsonl"], tokenizer="t", seq_len=64, strategy="concat")
    given = DataConfig.from_inputs(["a.jsonl"], tokenizer="t", seq_len=64, strategy="concat", overlong="split")
    assert implied.to_dict()["overlong"] == "split" and implied.config_hash() == given.config_hash()
    assert DataConfig.from_dict(implied.to_dict()) == implied
    from_file = from_flags("--seq-len", "64", base={"data": {"strategy": "concat"}})
    assert from_file.overlong == "split"


@pytest.mark.parametrize("rows, seq_len, tokens, expected", [
    pytest.param(1, 1_000_000, 400_000, "the whole output is 1 row(s) of 1,000,000 tokens (400,000 tokens packed)",
                 id="one-long-row"),
    pytest.param(FEW_ROWS - 1, 65_536, 400_000, f"pack with --seq-len {400_000 // FEW_ROWS} or less", id="few"),
])
def test_a_long_row_on_a_small_corpus_is_said(rows, seq_len, tokens, expected):
    assert expected in few_rows_notice(rows, seq_len, tokens)


@pytest.mark.parametrize("rows", [0, FEW_ROWS, 10_000])
def test_enough_rows_say_nothing(rows):
    assert few_rows_notice(rows, 4096, rows * 4096) is None
