"""Objects: what they are (``stat``), what lies under a prefix (``listing``), whether they
changed, writing them whole, deleting them. glob.py builds on this module, never the reverse.

Costs on an object store (a request is an HTTP round trip, ~10-100 ms on S3):

- ``stat``: one HEAD (size, mtime, ETag, version where the store gives them).
- ``listing``: one LIST per 1,000 keys under the prefix (recursive or one level).
- ``write_bytes_atomic``: one PUT up to a multipart part (measured: 6 MiB is one PUT; larger:
  a multipart upload, completed at close). An object store makes a PUT visible whole or not at
  all. A local file goes to a temporary name in the same directory, then ``os.replace``:
  readers never see half a file either.
- ``delete_prefix``: one LIST pass, then the deletes (its docstring says what they cost).

``check_unchanged`` compares what the plan saw with what a HEAD says now; reads.py runs it on
the HEAD every read opens with, so it costs no request.
"""

from __future__ import annotations

import email.utils
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

import pyarrow as pa
import pyarrow.fs as pafs

from packfeed.service.storage.store_errors import NO_BUCKET, NOT_FOUND, StorageError
from packfeed.service.storage.redact import display
from packfeed.service.storage.retry import COUNTERS, call
from packfeed.service.storage.uri import BUCKET_SCHEMES, is_remote, resolve_bare, scheme_of, split

DELETE_THREADS = 16
CHANGED = "changed"


@dataclass(frozen=True)
class ObjectInfo:
    """A file or object as a listing or a HEAD gives it. ``etag``/``version``: the store's
    ETag and version id or generation, where the call that made this gave them (a HEAD does; an
    S3 listing through pyarrow does not: ``None``). ``size``/``mtime_ns`` are None for a
    directory (on a store: a prefix some keys share)."""

    uri: str
    size: int | None
    mtime_ns: int | None
    etag: str | None = None
    version: str | None = None
    is_dir: bool = False


def stat(uri: str) -> ObjectInfo:
    """What ``uri`` is now (one HEAD on a store). ``StorageError`` when it does not exist."""
    if not is_remote(uri):
        fs, path = resolve_bare(uri)
        info = call(display(uri), "stat", lambda: fs.get_file_info(path), scheme="", remote=False)
        if info.type == pafs.FileType.NotFound:
            raise StorageError(display(uri), "no such file or directory", kind=NOT_FOUND)
        return _from_file_info(uri, info)
    handle = open_native(uri)
    return info_of_open(uri, handle)


def exists(uri: str) -> bool:
    try:
        stat(uri)
    except StorageError as exc:
        if exc.kind in (NOT_FOUND, NO_BUCKET):
            return False
        raise
    return True


def check_unchanged(expect: ObjectInfo, now: ObjectInfo) -> None:
    """``StorageError`` (kind ``CHANGED``) naming the object when ``now`` is another version
    than ``expect``: size, then ETag/version where both have one, else mtime (on a store to the
    second: a HEAD's Last-Modified has no fraction, a listing's may)."""
    pairs = [("size", expect.size, now.size), ("ETag", expect.etag, now.etag), ("version", expect.version, now.version)]
    if not (expect.etag and now.etag) and not (expect.version and now.version):
        unit = 10**9 if is_remote(now.uri) else 1
        pairs.append(("mtime", *(None if t is None else t // unit for t in (expect.mtime_ns, now.mtime_ns))))
    for name, before, after in pairs:
        if before is not None and after is not None and before != after:
            raise StorageError(display(now.uri), f"changed since it was planned ({name} {before} -> {after}); "
                               "plan again, or restore the object", kind=CHANGED)


def write_bytes_atomic(uri: str, data: bytes) -> None:
    """Write ``data`` to ``uri`` so that no reader ever sees a part of it (module docstring)."""
    if not is_remote(uri):
        directory = os.path.dirname(os.path.abspath(uri))
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(uri)}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, uri)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return
    fs, path = resolve_bare(uri)

    def put() -> None:
        with fs.open_output_stream(path) as out:
            out.write(data)

    call(display(uri), "write", put, scheme=scheme_of(uri))
    COUNTERS.add(bytes_written=len(data))


def listing(uri: str, *, recursive: bool, named: str | None = None) -> list[ObjectInfo]:
    """What lies under ``uri`` (a directory, or a key prefix without its "/"), sorted by URI:
    one LIST on a store. Empty when nothing does. Errors name ``named`` (default ``uri``)."""
    fs, path = resolve_bare(uri)
    selector = pafs.FileSelector(path, recursive=recursive, allow_not_found=True)
    infos = call(display(named or uri), "list", lambda: fs.get_file_info(selector), scheme=scheme_of(uri),
                 remote=is_remote(uri))
    base = path.rstrip("/")
    out = []
    for info in infos:
        relative = info.path[len(base):].lstrip("/") if info.path.startswith(base) else info.path
        full = "/".join([uri.rstrip("/"), relative]) if is_remote(uri) else os.path.join(uri, relative)
        if info.type == pafs.FileType.Directory:
            out.append(ObjectInfo(full, None, None, is_dir=True))
        else:
            out.append(ObjectInfo(full, info.size, info.mtime_ns))
    return sorted(out, key=lambda info: info.uri)


def delete_prefix(uri: str, *, only: Callable[[str], bool] | None = None) -> list[str]:
    """Delete the files under ``uri`` whose path relative to it (``/``-separated) ``only``
    accepts (every file when ``only`` is None); returns the URIs deleted, sorted. Directories
    stay.

    Cost on S3 (measured, pyarrow 26): one LIST, then per object a HEAD, the DELETE and a PUT
    of an empty ``parent/`` marker (Arrow keeps the parent "directory" in being), run
    ``DELETE_THREADS`` at a time; with ``only=None`` Arrow's batched delete instead: one
    request per 1,000 keys."""
    base = uri.rstrip("/")
    doomed = [info.uri for info in listing(base, recursive=True) if not info.is_dir
              and (only is None or only(info.uri[len(base) + 1:]))]
    if only is None and doomed and is_remote(uri):
        fs, path = resolve_bare(base)
        call(display(uri), "delete", lambda: fs.delete_dir_contents(path, missing_dir_ok=True), scheme=scheme_of(uri))
        return doomed
    with ThreadPoolExecutor(DELETE_THREADS if is_remote(uri) else 1) as pool:
        list(pool.map(_delete_one, doomed))
    return doomed


def _delete_one(uri: str) -> None:
    fs, path = resolve_bare(uri)
    try:
        call(display(uri), "delete", lambda: fs.delete_file(path), scheme=scheme_of(uri), remote=is_remote(uri))
    except StorageError as exc:
        if exc.kind != NOT_FOUND:  # gone already: what we wanted
            raise


def missing(uri: str, *, named: str | None = None) -> StorageError:
    """The error for ``uri`` not found, naming ``named`` (default ``uri``): its bucket's absence
    when that is why (one more request, on this error path only), else no such object."""
    shown = display(named or uri)
    scheme, authority, _ = split(uri)
    if scheme in BUCKET_SCHEMES:
        bucket = authority.rpartition("@")[2]
        bucket_uri = f"{scheme}://{authority}"
        fs, path = resolve_bare(bucket_uri)
        try:
            info = call(display(bucket_uri), "stat", lambda: fs.get_file_info(path), scheme=scheme)
        except StorageError:
            info = None  # cannot tell (no right to HEAD the bucket): say what we know
        if info is not None and info.type == pafs.FileType.NotFound:
            return StorageError(shown, f"the bucket {bucket!r} does not exist", kind=NO_BUCKET)
    return StorageError(shown, "no such object" if scheme else "no such file", kind=NOT_FOUND)


def open_native(uri: str) -> pa.NativeFile:
    """``uri`` opened for random access (one HEAD on a store), under the retry policy; a
    missing object raises ``missing``'s error."""
    fs, path = resolve_bare(uri)
    try:
        return call(display(uri), "open", lambda: fs.open_input_file(path), scheme=scheme_of(uri), remote=is_remote(uri))
    except StorageError as exc:
        if exc.kind == NOT_FOUND:
            raise missing(uri) from None
        raise


def info_of_open(uri: str, handle: pa.NativeFile) -> ObjectInfo:
    """What the open's HEAD said (no request): S3 gives ETag, Last-Modified and VersionId."""
    try:
        meta = {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in (handle.metadata() or {}).items()}
    except (OSError, NotImplementedError):
        meta = {}
    mtime_ns = _parse_http_time(meta.get("last-modified"))
    if mtime_ns is None and not is_remote(uri):
        mtime_ns = os.stat(split(uri)[2]).st_mtime_ns
    return ObjectInfo(uri, handle.size(), mtime_ns, etag=meta.get("etag"),
                      version=meta.get("versionid") or meta.get("version-id") or meta.get("generation"))


def _parse_http_time(text: str | None) -> int | None:
    """Last-Modified as pyarrow gives it (ISO 8601, "...Z") or as HTTP sends it (RFC 1123)."""
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
    return int(when.timestamp()) * 10**9


def _from_file_info(uri: str, info: pafs.FileInfo) -> ObjectInfo:
    if info.type == pafs.FileType.Directory:
        return ObjectInfo(uri, None, None, is_dir=True)
    return ObjectInfo(uri, info.size, info.mtime_ns)
