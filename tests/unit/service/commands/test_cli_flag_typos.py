"""A mistyped flag is named with the flag it is closest to, by the subcommand it was given to,
exit 2, as a typo in a config file's keys is (``check_known_keys``); argparse alone said
``packfeed: error: unrecognized arguments: --seq_len 2048`` (issue: "newcomer round")."""

from __future__ import annotations

import pytest

from packfeed.service.cli import build_parser

GOOD = ["a.jsonl", "--tokenizer", "t", "--seq-len", "64"]


def parse_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("argv, expected", [
    pytest.param(["pack", "a.jsonl", "--tokenizer", "t", "--seq_len", "2048", "--output", "o"],
                 "packfeed pack: error: unrecognized arguments: --seq_len (did you mean --seq-len?)", id="underscore"),
    pytest.param(["pack", *GOOD, "--output", "o", "--seq_len=2048"],
                 "packfeed pack: error: unrecognized arguments: --seq_len (did you mean --seq-len?)", id="with-equals"),
    pytest.param(["serve", *GOOD, "--max_batch_rows", "8"],
                 "packfeed serve: error: unrecognized arguments: --max_batch_rows (did you mean --max-batch-rows?)",
                 id="serve-flag"),
    pytest.param(["train", "--config", "x.toml", "--mdoel", "tiny-llama"],
                 "packfeed train: error: unrecognized arguments: --mdoel (did you mean --model?)", id="train-flag"),
    pytest.param(["pack", *GOOD, "--ouput", "o"],
                 "packfeed pack: error: unrecognized arguments: --ouput (did you mean --output?)",
                 id="typo-of-a-required-flag-is-the-error-not-the-missing-flag"),
    pytest.param(["pack", *GOOD, "--output", "o", "--tokenizr", "t", "--epocs", "2"],
                 "packfeed pack: error: unrecognized arguments: --tokenizr (did you mean --tokenizer?), --epocs (did "
                 "you mean --epochs?)", id="two-typos"),
    pytest.param(["pack", *GOOD, "--output", "o", "--port", "5"],
                 "packfeed pack: error: unrecognized arguments: --port (--port is a flag of packfeed serve)",
                 id="another-subcommands-flag"),
    pytest.param(["pack", *GOOD, "--output", "o", "--xyzzy"], "packfeed pack: error: unrecognized arguments: --xyzzy",
                 id="nothing-close"),
    pytest.param(["inspect", "runs/x", "extra"], "packfeed inspect: error: unrecognized arguments: extra",
                 id="stray-value-keeps-argparses-words"),
])
def test_an_unknown_flag_is_named_with_the_closest_one(capsys, argv, expected):
    assert parse_error(capsys, argv) == expected


def test_known_flags_and_negative_values_still_parse():
    args = build_parser().parse_args(["pack", *GOOD, "--output", "o", "--seq=128", "--seed", "3"])  # an abbreviation
    assert (args.seq_len, args.seed, args.output) == (128, 3, "o")
