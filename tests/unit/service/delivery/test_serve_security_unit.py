"""``packfeed serve``'s start-up gate: who may listen where, where the token comes from, and
every flag a user can get wrong, refused before anything starts.

The refusal itself (exit status 2 before Ray starts) is tested end to end in
tests/integration/serve/test_serve_security.py; here the accepted cases and the token sources.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from packfeed.client.transport import TOKEN_ENV
from packfeed.service.commands import serve
from packfeed.service.commands.serve import check_args, is_loopback, read_token
from packfeed.service.delivery.server import check_tls_files


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(["data.jsonl", *argv])


def check_security(host, token, insecure, cert, key):
    argv = ["--host", host] + (["--insecure"] if insecure else [])
    argv += ["--tls-cert", str(cert)] if cert else []
    argv += ["--tls-key", str(key)] if key else []
    check_args(serve_args(*argv), token)

NON_LOOPBACK = ["0.0.0.0", "::", "[::]", "10.1.2.3", "192.168.0.7", "example.org"]
LOOPBACK = ["127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost"]


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_hosts(host):
    assert is_loopback(host)
    check_security(host, None, False, None, None)  # no token needed on this machine only


@pytest.mark.parametrize("host", NON_LOOPBACK)
def test_non_loopback_without_token_is_refused(host):
    assert not is_loopback(host)
    with pytest.raises(ValueError, match="--auth-token-file") as err:
        check_security(host, None, False, None, None)
    assert "--insecure" in str(err.value) and host in str(err.value)


@pytest.mark.parametrize("host", NON_LOOPBACK)
def test_non_loopback_with_token_or_insecure_is_accepted(host):
    check_security(host, "tok", False, None, None)
    check_security(host, None, True, None, None)
    check_security(host, "tok", False, Path("c.pem"), Path("k.pem"))


@pytest.mark.parametrize("cert, key", [(Path("c.pem"), None), (None, Path("k.pem"))], ids=["cert-only", "key-only"])
def test_tls_cert_and_key_go_together(cert, key):
    with pytest.raises(ValueError, match="--tls-cert and --tls-key"):
        check_security("127.0.0.1", "tok", False, cert, key)


def test_token_from_file_wins_over_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    path = tmp_path / "token"
    path.write_text("  from-file\n")
    assert read_token(path) == "from-file"
    assert read_token(None) == "from-env"


@pytest.mark.parametrize("value", [None, "", "   \n"], ids=["unset", "empty", "blank"])
def test_no_token_when_the_environment_has_none(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(TOKEN_ENV, value)
    assert read_token(None) is None


def test_empty_token_file_is_an_error(tmp_path):
    path = tmp_path / "token"
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_token(path)


@pytest.mark.parametrize("argv, message", [
    pytest.param(("--port", "70000"), "--port must be in 0..65535", id="port-too-large"),
    pytest.param(("--port", "-1"), "--port must be in 0..65535", id="port-negative"),
    pytest.param(("--metrics-port", "65536"), "--metrics-port", id="metrics-port"),
    pytest.param(("--max-consumers", "0"), "--max-consumers must be >= 1", id="no-consumers"),
    pytest.param(("--max-batch-rows", "0"), "--max-batch-rows must be >= 1", id="no-batch-rows"),
    pytest.param(("--buffer-rows", "64"), "--buffer-rows must be >= 128", id="tiny-buffer"),
    pytest.param(("--grace-seconds", "0"), "--grace-seconds must be a finite number > 0", id="no-grace"),
    pytest.param(("--progress-seconds", "inf"), "--progress-seconds must be a finite number > 0", id="inf-progress"),
    pytest.param(("--idle-timeout-seconds", "-5"), "--idle-timeout-seconds must be a finite number > 0", id="idle-timeout"),
])
def test_bad_flags_are_refused_with_the_flag_named(argv, message):
    with pytest.raises(ValueError, match=message):
        check_args(serve_args(*argv), None)


def test_batches_above_grpcs_message_limit_are_refused_naming_the_largest_that_fits():
    """1,024 rows of 131,072 tokens overflowed gRPC's int32 message limit: an OverflowError
    traceback after Ray had started. serve checks it before Ray, once seq_len is known."""
    from packfeed.client.transport import MAX_MESSAGE_BYTES, batch_message_limit

    with pytest.raises(ValueError, match=r"--max-batch-rows 1024 x seq_len 131,072 makes batches above gRPC's 2 GiB "
                                         r"message limit: at most (\d+) rows") as err:
        serve._check_batch_bytes(1024, 131072)
    most = int(re.search(r"at most (\d+)", str(err.value)).group(1))
    assert batch_message_limit(most, 131072) <= MAX_MESSAGE_BYTES < batch_message_limit(most + 1, 131072)
    serve._check_batch_bytes(most, 131072)
    serve._check_batch_bytes(256, 8192)  # the defaults pass


def test_defaults_pass_and_show_in_help(capsys):
    check_args(serve_args(), None)
    from packfeed.service.commands.args import HelpFormatter

    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    serve.add_arguments(parser)
    text = " ".join(parser.format_help().split())
    for flag, default in (("--buffer-rows", 2048), ("--max-batch-rows", 256), ("--max-consumers", 64),
                          ("--grace-seconds", 10.0), ("--idle-timeout-seconds", 120.0)):
        assert f"(default: {default})" in text.split(flag, 2)[-1].split("--", 1)[0], flag


def test_tls_files_are_checked_and_the_bad_one_named(tmp_path):
    from support.tls import self_signed_cert

    cert, key = (p.read_bytes() for p in self_signed_cert(tmp_path, "server"))
    other_key = self_signed_cert(tmp_path, "other")[1].read_bytes()
    check_tls_files(cert, key, "c.pem", "k.pem")
    with pytest.raises(ValueError, match="--tls-key k.pem is not the private key of --tls-cert c.pem"):
        check_tls_files(cert, other_key, "c.pem", "k.pem")
    with pytest.raises(ValueError, match="--tls-cert c.pem is not a PEM certificate"):
        check_tls_files(b"garbage", key, "c.pem", "k.pem")
    with pytest.raises(ValueError, match="--tls-key k.pem is not a PEM private key"):
        check_tls_files(cert, cert, "c.pem", "k.pem")
    from cryptography.hazmat.primitives import serialization

    encrypted = serialization.load_pem_private_key(key, None).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw"))
    with pytest.raises(ValueError, match="--tls-key k.pem is encrypted"):  # never a passphrase prompt
        check_tls_files(cert, encrypted, "c.pem", "k.pem")
