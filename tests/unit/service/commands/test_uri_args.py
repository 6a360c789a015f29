"""Every path flag takes a URI as it is: ``--output``, ``--state-dir``, the inputs (a ``Path``
would fold ``s3://b/x`` into ``s3:/b/x``), while a relative local path is still made absolute
from where the user ran the command."""

import os

import pytest

from packfeed.service.cli import build_parser
from packfeed.service.commands.args import data_config_from_args, resolve_output

URIS = ["s3://bucket/runs/x", "s3://KEY:SECRET@bucket/x/", "gs://b/p", "abfss://c@acct.dfs.core.windows.net/p",
        "memory://b/p"]


@pytest.mark.parametrize("uri", URIS)
@pytest.mark.parametrize(("command", "flag"), [("pack", "--output"), ("serve", "--state-dir"), ("train", "--output")])
def test_a_uri_flag_reaches_the_command_as_given(command, flag, uri):
    argv = [command, f"{uri}/in/*.jsonl", "--tokenizer", "t", "--seq-len", "8", flag, uri]
    args = build_parser().parse_args(argv)
    given = getattr(args, flag.lstrip("-").replace("-", "_"))
    assert resolve_output(given, flag) == uri
    assert data_config_from_args(args).inputs == (f"{uri}/in/*.jsonl",)


@pytest.mark.parametrize("relative", ["out", "runs/a b", "./x/../y"])
def test_a_relative_path_is_still_taken_from_the_current_directory(relative, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert os.path.normpath(resolve_output(relative)) == os.path.normpath(tmp_path / relative)
