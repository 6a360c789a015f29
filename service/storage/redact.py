"""URIs and messages without credentials, for logs, stats.json, config.json and errors.

A URI can carry secrets two ways: a user-info part (``s3://KEY:SECRET@bucket/...``,
``hdfs://user:password@namenode/...``) and query parameters (a presigned URL's
``X-Amz-Signature``, an Azure SAS ``sig``, ``?secret_key=`` in an Arrow URI). ``display``
removes both; ``scrub`` does the same to any text that may quote a URI (a backend's error
message). A user-info part without a password stays where it addresses something
(``abfs://container@account...``, ``hdfs://user@namenode``), and goes on S3 and GCS, where it
can only be a credential.

    display("s3://AKIA:wJalr@bucket/a.jsonl")             -> "s3://bucket/a.jsonl"
    display("https://h/x.jsonl?X-Amz-Signature=abc&v=1")  -> "https://h/x.jsonl?X-Amz-Signature=***&v=1"
"""

from __future__ import annotations

import re

_SECRET_PARAMS = (
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature", "x-goog-credential",
    "signature", "sig", "token", "access_token", "sas_token", "session_token", "security_token", "secret",
    "secret_key", "secret_access_key", "access_key", "access_key_id", "account_key", "client_secret",
    "password", "passwd", "pwd", "key", "api_key", "apikey", "code", "credential", "credentials",
    "awsaccesskeyid", "googleaccessid", "authorization", "auth",
)
# A parameter follows a query separator, a space or the text's start, never a "/": a Hive-style
# partition folder (``data/key=1/``) is a path, not a secret.
_SECRET_QUERY = re.compile(r"(?i)(?<![\w/.-])(" + "|".join(map(re.escape, _SECRET_PARAMS)) + r")=([^&;\s#'\"]*)")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*)://([^/@\s?#'\"]*)@")
_CREDENTIAL_ONLY_SCHEMES = {"s3", "s3a", "s3n", "gs", "gcs"}
MASK = "***"


def display(uri: str) -> str:
    """``uri`` with its credentials removed, fit to show anywhere."""
    return scrub(str(uri))


def scrub(text: str) -> str:
    """``text`` with the credentials of every URI in it removed."""
    text = _USERINFO.sub(_keep_address, text)
    return _SECRET_QUERY.sub(lambda m: f"{m.group(1)}={MASK}", text)


def _keep_address(m: re.Match) -> str:
    scheme, userinfo = m.group(1), m.group(2)
    if scheme.lower() in _CREDENTIAL_ONLY_SCHEMES:
        return f"{scheme}://"
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}@" if user else f"{scheme}://"
