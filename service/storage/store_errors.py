"""What went wrong on a store, in one line a user can act on, and whether to try again.

Every failure of a storage call ends as a ``StorageError`` (a ``ValueError``: a user error,
exit 2, see service/errors.py) whose message is ``<uri>: <problem>``, one line, the URI shown
by ``display`` (no credentials). ``classify`` sorts the exceptions the backends raise into
kinds; retry.py retries the transient ones.

The exceptions differ by backend. pyarrow's S3 filesystem raises ``OSError("... AWS Error
<CODE> during <Operation> operation: ...")`` with the SDK's error code, or
``FileNotFoundError`` for a missing key (and for a key in a missing bucket: a HEAD on a key
cannot tell them apart; ``missing`` asks the bucket). fsspec backends raise the builtin
``FileNotFoundError``/``PermissionError``/``ConnectionError``/``TimeoutError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packfeed.service.storage.redact import scrub

# Kinds of failure. The transient ones are retried (retry.py).
NOT_FOUND = "not found"
NO_BUCKET = "no bucket"
DENIED = "denied"
UNREACHABLE = "unreachable"  # no connection at all: refused, no such host, connect timeout
THROTTLED = "throttled"  # 503 SlowDown and its relatives
SERVER = "server error"  # 5xx
CONNECTION = "connection lost"  # reset, empty reply, stalled transfer
NO_MATCH = "no match"
INVALID = "invalid"
OTHER = "other"
TRANSIENT = frozenset({UNREACHABLE, THROTTLED, SERVER, CONNECTION})


class StorageError(ValueError):
    """A storage call failed: ``<uri>: <problem>``, one line, no credentials (the whole line is
    scrubbed: a backend's detail may quote a presigned URL).

    ``kind`` is one of the kinds above (``NOT_FOUND``, ``DENIED``, ...), for callers that
    react to it (a manifest that does not exist yet is not an error)."""

    def __init__(self, shown_uri: str, problem: str, *, kind: str = OTHER) -> None:
        self.uri = shown_uri
        self.problem = problem
        self.kind = kind
        super().__init__(scrub(one_line(f"{shown_uri}: {problem}")))

    def __reduce__(self):
        # Raised inside Ray actors and tasks: it must unpickle on the driver from its own parts.
        return (_rebuild_storage_error, (self.uri, self.problem, self.kind))


def _rebuild_storage_error(shown_uri: str, problem: str, kind: str) -> StorageError:
    return StorageError(shown_uri, problem, kind=kind)


@dataclass(frozen=True)
class Failure:
    kind: str
    detail: str  # one line, short, for the message

    @property
    def transient(self) -> bool:
        return self.kind in TRANSIENT


# SDK error codes (pyarrow: "AWS Error <CODE> during ...") by kind. INTERNAL_FAILURE is what
# pyarrow reports when a GET's error body (SlowDown XML, AccessDenied XML) does not fit the
# buffer of a short ranged read: it hides the status, so it is taken as a transient server error.
# reads.py asks 4 KiB at least a request so that this is rare (an object smaller than the body).
_AWS_CODES = {
    "SLOW_DOWN": THROTTLED, "THROTTLING": THROTTLED, "REQUEST_LIMIT_EXCEEDED": THROTTLED,
    "SERVICE_UNAVAILABLE": THROTTLED,
    "INTERNAL_FAILURE": SERVER, "REQUEST_TIMEOUT": CONNECTION, "REQUEST_TIME_TOO_SKEWED": DENIED,
    "ACCESS_DENIED": DENIED, "INVALID_ACCESS_KEY_ID": DENIED, "SIGNATURE_DOES_NOT_MATCH": DENIED,
    "MISSING_AUTHENTICATION_TOKEN": DENIED, "UNRECOGNIZED_CLIENT": DENIED, "EXPIRED_TOKEN": DENIED,
    "INVALID_CLIENT_TOKEN_ID": DENIED,
    "NO_SUCH_BUCKET": NO_BUCKET, "NO_SUCH_KEY": NOT_FOUND, "RESOURCE_NOT_FOUND": NOT_FOUND,
    "INVALID_BUCKET_NAME": INVALID,
}
_AWS_ERROR = re.compile(r"AWS Error ([A-Z_]+)(?: \(HTTP status (\d+)\))?")
# curl's codes inside a NETWORK_CONNECTION error: 5/6 no proxy/host, 7 refused, 28 timeout (of the
# connect when the text says so), 52 empty reply, 55/56 send/recv failure (a reset)
_CURL = re.compile(r"curlCode: (\d+)")
_CURL_UNREACHABLE = {5, 6, 7}
_HTTP_STATUS = re.compile(r"\b(?:HTTP status|status code|status)[ =:]*(\d{3})\b", re.IGNORECASE)
_NOISE = [
    re.compile(r"^When [^:]*: "),  # "When reading information for key 'k' in bucket 'b': "
    re.compile(r"\s*\(Request ID: [^)]*\)"),
    re.compile(r"\s*Details?: .*$"),
]
MAX_DETAIL = 240


def classify(exc: BaseException) -> Failure:
    """The kind of a backend's exception, and a short line saying what it was."""
    text = one_line(str(exc)) or type(exc).__name__
    detail = _short(text)
    if isinstance(exc, FileNotFoundError):
        return Failure(NOT_FOUND, "no such object")
    if isinstance(exc, PermissionError):
        return Failure(DENIED, detail)
    if isinstance(exc, ConnectionRefusedError):
        return Failure(UNREACHABLE, detail)
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return Failure(CONNECTION, detail)
    aws = _AWS_ERROR.search(text)
    if aws:
        code, status = aws.group(1), aws.group(2)
        if code == "NETWORK_CONNECTION":
            curl = _CURL.search(text)
            curl_code = int(curl.group(1)) if curl else None
            no_connection = curl_code in _CURL_UNREACHABLE or (curl_code == 28 and "onnect" in text)
            return Failure(UNREACHABLE if no_connection else CONNECTION, _curl_detail(text) or detail)
        if code == "INTERNAL_FAILURE" and "Failed to flush response stream" in text:
            return Failure(SERVER, "the store answered with an error the S3 client could not read: a 5xx or "
                                   "403 to a short ranged read")
        if code in _AWS_CODES:
            return Failure(_AWS_CODES[code], detail)
        if status:
            return Failure(_kind_of_status(int(status)), detail)
    status = _HTTP_STATUS.search(text)
    if status:
        return Failure(_kind_of_status(int(status.group(1))), detail)
    return Failure(OTHER, detail)


def _kind_of_status(status: int) -> str:
    if status in (429, 503):
        return THROTTLED
    if status >= 500:
        return SERVER
    if status in (401, 403):
        return DENIED
    if status == 404:
        return NOT_FOUND
    if status == 408:
        return CONNECTION
    return OTHER


def _curl_detail(text: str) -> str:
    """"curlCode: 7, Could not connect to server; Details: Failed to connect to h:p after 0 ms: ..."
    -> "Could not connect to server: h:p (curl 7)"."""
    m = re.search(r"curlCode: (\d+), ([^;]*)", text)
    if not m:
        return ""
    host = re.search(r"(?:Failed to connect to|Could not resolve host:) ([^\s;]+?)(?: port (\d+))?(?: after|[;\s]|$)", text)
    where = f": {host.group(1)}{':' + host.group(2) if host.group(2) else ''}" if host else ""
    return f"{m.group(2).strip()}{where} (curl {m.group(1)})"


def _short(text: str) -> str:
    for noise in _NOISE:
        text = noise.sub("", text)
    return text[:MAX_DETAIL].rstrip(" :") or "failed"


def one_line(text: str) -> str:
    """``text``'s first non-empty line, whitespace collapsed (HDFS's libjvm error is 70 lines)."""
    for line in text.strip().splitlines():
        if line.strip():
            return " ".join(line.split())
    return ""


_CREDENTIALS_HINT = {
    "s3": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the instance role",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS or the instance's service account",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS or the instance's service account",
    "abfs": "AZURE_STORAGE_ACCOUNT_KEY, a SAS token or the managed identity",
    "abfss": "AZURE_STORAGE_ACCOUNT_KEY, a SAS token or the managed identity",
    "az": "AZURE_STORAGE_ACCOUNT_KEY, a SAS token or the managed identity",
}
_ENDPOINT_HINT = {"s3": "AWS_ENDPOINT_URL"}


def problem(failure: Failure, *, what: str, scheme: str, num_attempts: int, seconds: float | None = None,
            budget_s: float | None = None) -> str:
    """The text after ``<uri>: `` for a failure that ends a call (``seconds``, ``budget_s``: the
    time it retried and its budget, when the budget ended it)."""
    if failure.kind == NOT_FOUND:
        return "no such object"
    if failure.kind == NO_BUCKET:
        return "the bucket does not exist"
    if failure.kind == DENIED:
        hint = _CREDENTIALS_HINT.get(scheme)
        return f"access denied ({failure.detail})" + (f"; check the credentials ({hint})" if hint else "")
    if failure.kind == UNREACHABLE:
        endpoint = _ENDPOINT_HINT.get(scheme)
        return (f"cannot reach the store after {num_attempts} attempt(s) ({failure.detail}); check the endpoint"
                + (f" ({endpoint})" if endpoint else "") + " and the network")
    if failure.transient and seconds is not None and budget_s is not None:
        return (f"{what} failed {num_attempts} times in a row over {seconds:.1f} s, giving up: the retry budget is "
                f"{budget_s:g} s (PACKFEED_STORAGE_RETRY_S) ({failure.detail})")
    if failure.transient:
        return f"{what} failed {num_attempts} times in a row, giving up ({failure.detail})"
    return f"{what} failed ({failure.detail})"
