"""Every path a URI: which filesystem serves it, and the path inside that filesystem.

``resolve(uri) -> (pyarrow.fs.FileSystem, path)``:

| URI | filesystem | path |
| --- | --- | --- |
| ``data/a.jsonl``, ``/abs/a.jsonl``, ``file:///abs/a.jsonl`` | ``LocalFileSystem`` | the local path |
| ``s3://bucket/key`` (``s3a://``) | ``S3FileSystem`` | ``bucket/key`` |
| ``gs://bucket/key`` (``gcs://``) | ``GcsFileSystem`` | ``bucket/key`` |
| ``abfs[s]://container@account.dfs.core.windows.net/p``, ``abfs[s]://account.blob.core.windows.net/container/p`` | ``AzureFileSystem`` (Arrow's URI forms) | ``container/p`` |
| ``az://container/p``, ``abfs://container/p`` (account: ``AZURE_STORAGE_ACCOUNT_NAME``) | ``AzureFileSystem`` | ``container/p`` |
| ``hdfs://namenode:port/p`` | ``HadoopFileSystem`` (needs Java and libhdfs) | ``/p`` |
| any other protocol fsspec knows (``memory://``, ``https://``, ...) | ``PyFileSystem(FSSpecHandler(...))`` | fsspec's path |

Credentials come the standard way of each store: for S3 the AWS chain (``AWS_ACCESS_KEY_ID``
..., ``AWS_PROFILE`` and its files, the instance role), ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL`` for an S3-compatible store (MinIO, R2, moto), the region from
``AWS_REGION``/``AWS_DEFAULT_REGION``, else asked of AWS for the bucket, else the profile's;
for GCS ``GOOGLE_APPLICATION_CREDENTIALS`` or the instance's account; for Azure the
``AZURE_STORAGE_*`` variables or the default credential chain. A ``KEY:SECRET@`` in an S3 URI
works too, and ``display`` keeps it out of every message.

On an object store ``?`` is a glob wildcard like on disk, not a query: ``s3://b/part-?.jsonl``
matches ``part-1.jsonl``. Only fsspec's URL protocols (``https://``) have query strings.

Filesystems are cached per process, per (scheme, bucket or authority) and the environment
they were built from; each comes in two flavours (retry.py says why): the one ``resolve``
returns retries inside pyarrow, the ``bare`` one this package uses does not.
"""

from __future__ import annotations

import datetime
import functools
import os
import re
import threading
import urllib.parse

import pyarrow.fs as pafs

from packfeed.service.storage.store_errors import INVALID, StorageError
from packfeed.service.storage.redact import display

CONNECT_TIMEOUT_S = 2.0  # a TCP+TLS connect to a store; a black-holed endpoint fails in 3 x 2 s
REQUEST_TIMEOUT_S = 20.0  # no byte moving for this long fails the request (then it is retried)
PYARROW_S3_ATTEMPTS = 6  # pyarrow's own retries, for the filesystem handed out by resolve()
GCS_RETRY_TIME_LIMIT_S = 60
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
_FAMILY = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "abfs": "az", "abfss": "az", "az": "az"}
BUCKET_SCHEMES = {scheme for scheme, family in _FAMILY.items() if family in ("s3", "gs")}  # authority: a bucket
_ENV = {  # what a filesystem is built from, beside the URI: a change gives a new one
    "s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE",
           "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE",
           "AWS_SHARED_CREDENTIALS_FILE"),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS",),
    "az": ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN"),
}
_cache: dict[tuple, pafs.FileSystem] = {}
_cache_lock = threading.Lock()


def scheme_of(uri: str) -> str:
    """The URI's protocol, lower case; "" for a local path (``file://`` included)."""
    m = _SCHEME.match(os.fspath(uri))
    scheme = m.group(1).lower() if m else ""
    return "" if scheme == "file" else scheme


def is_remote(uri: str) -> bool:
    return scheme_of(uri) != ""


def split(uri: str) -> tuple[str, str, str]:
    """``(scheme, authority, path)``: ``s3://KEY:SECRET@b/k/x`` -> ``("s3", "KEY:SECRET@b", "k/x")``;
    a local path -> ``("", "", path)``. The path keeps ``?`` (a wildcard) and has no leading "/"."""
    uri = os.fspath(uri)
    scheme = scheme_of(uri)
    if not scheme:
        return "", "", uri[len("file://"):] if uri.lower().startswith("file://") else uri
    rest = uri[_SCHEME.match(uri).end():]
    authority, _, path = rest.partition("/")
    return scheme, authority, path


def join(uri: str, *parts: str) -> str:
    """``uri`` with ``parts`` below it: ``join("s3://b/run", "x", "y.parquet")`` -> ``s3://b/run/x/y.parquet``."""
    if not is_remote(uri):
        return os.path.join(uri, *parts)
    inner = [p.strip("/") for p in parts if p.strip("/")]
    return "/".join([uri.rstrip("/"), *inner]) if inner else uri


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem serving ``uri`` and the path inside it (module docstring). Raises
    ``StorageError`` for a protocol nothing here can serve, or a store that cannot be set up."""
    return _resolve(uri, bare=False)


def resolve_bare(uri: str) -> tuple[pafs.FileSystem, str]:
    """``resolve`` with pyarrow's own S3 retries off: for calls that ``retry.call`` retries."""
    return _resolve(uri, bare=True)


def _resolve(uri: str, *, bare: bool) -> tuple[pafs.FileSystem, str]:
    uri = os.fspath(uri)
    scheme, authority, path = split(uri)
    if not scheme:
        return _cached(("local",), pafs.LocalFileSystem), path
    family = _FAMILY.get(scheme, scheme)
    key = (family, bare, authority, CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S,
           tuple(os.environ.get(name) for name in _ENV.get(family, ())))
    if family == "s3":
        userinfo, _, bucket = authority.rpartition("@")
        _check_bucket(uri, bucket)
        return _cached(key, lambda: _s3(bucket, userinfo, bare=bare)), f"{bucket}/{path}".rstrip("/")
    if family == "gs":
        _check_bucket(uri, authority)
        return _cached(key, _gcs), f"{authority}/{path}".rstrip("/")
    if family == "az":
        return _azure(uri, authority, path, key)
    if scheme in ("hdfs", "viewfs"):
        fs = _cached(key, lambda: _from_arrow_uri(uri)[0])
        return fs, "/" + path
    return _fsspec(uri, scheme, key)


def _cached(key: tuple, build) -> pafs.FileSystem:
    with _cache_lock:
        fs = _cache.get(key)
    if fs is None:
        fs = build()
        with _cache_lock:
            fs = _cache.setdefault(key, fs)
    return fs


def _check_bucket(uri: str, bucket: str) -> None:
    # Lenient on purpose: old us-east-1 buckets may hold capitals and underscores.
    if not bucket:
        raise StorageError(display(uri), "no bucket in the URI (expected scheme://bucket/key)", kind=INVALID)
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,255}", bucket):
        raise StorageError(display(uri), f"{bucket!r} is not a bucket name", kind=INVALID)


def _s3(bucket: str, userinfo: str, *, bare: bool) -> pafs.S3FileSystem:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region and not endpoint:
        region = _bucket_region(bucket)
    kwargs = {}
    if userinfo:
        access_key, _, secret_key = userinfo.partition(":")
        kwargs.update(access_key=urllib.parse.unquote(access_key), secret_key=urllib.parse.unquote(secret_key))
    return pafs.S3FileSystem(
        region=region, endpoint_override=endpoint or None,
        connect_timeout=CONNECT_TIMEOUT_S, request_timeout=REQUEST_TIMEOUT_S,
        allow_delayed_open=True,  # measured: an object up to a part (>= 6 MiB) is one PUT, not 3 requests
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1 if bare else PYARROW_S3_ATTEMPTS),
        **kwargs,
    )


@functools.lru_cache(maxsize=None)
def _bucket_region(bucket: str) -> str | None:
    """The bucket's region as AWS says it (one unauthenticated HEAD), or None to let the SDK
    take the profile's (or us-east-1) when AWS cannot be asked."""
    try:
        return pafs.resolve_s3_region(bucket)
    except (OSError, ValueError):
        return None


def _gcs() -> pafs.GcsFileSystem:
    return pafs.GcsFileSystem(retry_time_limit=datetime.timedelta(seconds=GCS_RETRY_TIME_LIMIT_S))


def _azure(uri: str, authority: str, path: str, key: tuple) -> tuple[pafs.FileSystem, str]:
    container, at, host = authority.rpartition("@")
    if "." in host:  # an account host: Arrow's own URI forms, container before "@" or first in the path
        return _cached(key, lambda: _from_arrow_uri(uri)[0]), (f"{container}/{path}" if at else path).rstrip("/")
    account = os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    if not account:
        raise StorageError(display(uri), "no storage account: set AZURE_STORAGE_ACCOUNT_NAME or write "
                           "abfss://container@ACCOUNT.dfs.core.windows.net/path", kind=INVALID)
    credentials = {"account_key": os.environ.get("AZURE_STORAGE_ACCOUNT_KEY"),
                   "sas_token": os.environ.get("AZURE_STORAGE_SAS_TOKEN")}
    fs = _cached(key, lambda: pafs.AzureFileSystem(account, **{k: v for k, v in credentials.items() if v}))
    return fs, f"{authority}/{path}".rstrip("/")


def _from_arrow_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    try:
        return pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError) as exc:  # e.g. HDFS without Java: "Unable to load libjvm" + 70 lines
        raise StorageError(display(uri), f"cannot open the store ({exc})", kind=INVALID) from None


def _fsspec(uri: str, scheme: str, key: tuple) -> tuple[pafs.FileSystem, str]:
    import fsspec

    try:
        fsspec.get_filesystem_class(scheme)
    except ValueError:
        raise StorageError(display(uri), f"unknown protocol {scheme!r}: packfeed reads local paths, s3://, gs://, "
                           "abfs://, hdfs:// and the protocols fsspec knows", kind=INVALID) from None
    except ImportError as exc:
        raise StorageError(display(uri), f"protocol {scheme!r} needs a package that is not installed ({exc})",
                           kind=INVALID) from None

    def build() -> pafs.FileSystem:
        return pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem(scheme)))

    fs = _cached(key, build)
    return fs, fs.handler.fs._strip_protocol(uri)
