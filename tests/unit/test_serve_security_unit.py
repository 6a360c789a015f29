"""``packfeed serve``'s security gate: who may listen where, and where the token comes from.

The refusal itself (exit status 2 before Ray starts) is tested end to end in
tests/integration/test_serve_security.py; here the accepted cases and the token sources.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packfeed.client.transport import TOKEN_ENV
from packfeed.service.serve import check_security, is_loopback, read_token

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
