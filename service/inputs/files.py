"""Finding input files: paths, URIs, directories and globs to an ordered list of input files.

Order defines the global sample ids (``data/plan.py``). An input is a local path or a URI
(``s3://bucket/prefix/*.jsonl``, ``gs://b/dir/``, any protocol ``service.storage`` serves).
A directory expands to its files sorted by name, not recursively; a glob expands sorted, ``**``
recursively, with one meaning on disk and on a store (``storage.glob``); on disk symlinks are
resolved and every real file is read once. The kind comes from the extension:

=========  =============================  ===============================================
kind       files                          a row is
=========  =============================  ===============================================
jsonl      .jsonl .ndjson .json           one line (blank lines are rows, skipped)
parquet    .parquet .pq                   one table row; counts from the footer
arrow      .arrow .feather .ipc           one table row (IPC file or stream format)
text       .txt .md                       the whole file (one document per file)
=========  =============================  ===============================================

A directory saved by ``datasets.Dataset.save_to_disk`` (it holds ``state.json``) is read as
its arrow files in the order ``state.json`` lists them, with pyarrow only. A ``DatasetDict``
directory (``dataset_dict.json``) is refused with the list of its splits: point at one split.

Requests on a store: a glob is ONE listing (``storage.expand``: put the literal part first),
plus one listing per directory it matches when it has no ``**``; a URI without wildcards one
HEAD, and when it names no object (a directory: ``s3://b/dir`` or ``s3://b/dir/``) one
listing; a saved dataset one GET of its ``state.json``. Each file comes with what the listing
said of it (``InputFile.info``: size and mtime, the ETag where the call gave one), so the scan
need not ask again. Every failure is one line naming the input (``storage.StorageError``, a
``ValueError``: exit 2).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
from dataclasses import dataclass
from typing import Sequence

from packfeed.service import storage
from packfeed.service.storage.store_errors import NO_MATCH, NOT_FOUND
from packfeed.service.storage.objects import missing

logger = logging.getLogger("packfeed")

KIND_EXTENSIONS = {
    "jsonl": (".jsonl", ".ndjson", ".json"),
    "parquet": (".parquet", ".pq"),
    "arrow": (".arrow", ".feather", ".ipc"),
    "text": (".txt", ".md"),
}
_KIND_OF_EXT = {ext: kind for kind, exts in KIND_EXTENSIONS.items() for ext in exts}
_SUPPORTED = ", ".join(sorted(_KIND_OF_EXT))


@dataclass(frozen=True)
class InputFile:
    """One input file: ``path`` as listed (a local path or a URI), its ``kind``, and ``info``
    (``storage.ObjectInfo``: size, mtime, ETag where known) as the listing or a stat gave it."""

    path: str
    kind: str
    info: storage.ObjectInfo


def list_inputs(inputs: Sequence[str] | str) -> list[InputFile]:
    """Resolve inputs to an ordered list of files, each real file once.

    Order defines the global sample ids. A file reached twice (listed twice, or through a
    symlinked directory loop under ``**``) is read once, with a warning.
    """
    if isinstance(inputs, (str, bytes, os.PathLike)):
        inputs = [inputs]
    out: list[InputFile] = []
    seen: set[str] = set()  # real paths (URIs on a store)
    repeats: list[str] = []
    for item in inputs:
        path = os.fspath(item)
        remote = storage.is_remote(path)
        for file in _expand_uri(path) if remote else _expand_local(path):
            real = file.path if remote else os.path.realpath(file.path)
            if real in seen:
                repeats.append(storage.display(file.path))
                continue
            seen.add(real)
            out.append(file)
    if repeats:
        logger.warning(
            "%d input path(s) lead to files already listed (a symlink loop, or the same file given twice), "
            "e.g. %s; each file is read once", len(repeats), repeats[0],
        )
    return out


# ---- local paths -------------------------------------------------------------------------------
def _expand_local(path: str) -> list[InputFile]:
    try:
        if os.path.isdir(path):
            return _expand_local_dir(path)
        if os.path.isfile(path):
            return [InputFile(path, _kind_of(path), _local_info(path))]
        if storage.has_magic(path):
            files = _glob_files(path)
            return _once_each(path, files)
        if os.path.islink(path):
            os.stat(path)  # raises ELOOP for a loop; a dangling link raises ENOENT below
    except OSError as e:  # ELOOP, EACCES, ...: say which input and why
        raise ValueError(f"input {path!r}: cannot read it ({e.strerror or e})") from None
    if os.path.islink(path):
        raise ValueError(f"input {path!r} is a broken symbolic link (its target does not exist)")
    raise ValueError(f"input {path!r} does not exist")


def _expand_local_dir(path: str) -> list[InputFile]:
    names = sorted(n for n in os.listdir(path) if not n.startswith((".", "_")))
    for n in names:  # a data file that is a link loop or dangling link is an error, not ignored
        full = os.path.join(path, n)
        if _ext(n) in _KIND_OF_EXT and os.path.islink(full) and not os.path.exists(full):
            _expand_local(full)
    entries = {n: _local_info(os.path.join(path, n)) for n in names
               if _ext(n) in _KIND_OF_EXT and os.path.isfile(os.path.join(path, n))}
    return _dir_files(path, entries)


def _local_info(path: str) -> storage.ObjectInfo:
    st = os.stat(path)
    return storage.ObjectInfo(path, st.st_size, st.st_mtime_ns)


def _once_each(pattern: str, found: list[InputFile]) -> list[InputFile]:
    """A glob's files, each real file once under its shortest path (links to one file, or to
    one directory under two names), in the glob's order."""
    best: dict[str, int] = {}  # real path -> index in found of its shortest path
    for i, file in enumerate(found):
        real = os.path.realpath(file.path)
        if real not in best or file.path.count(os.sep) < found[best[real]].path.count(os.sep):
            best[real] = i
    if len(best) < len(found):
        logger.warning(
            "input %r reaches %d file(s) through %d paths (a symlink loop?); each file is read once",
            pattern, len(best), len(found),
        )
    return [found[i] for i in sorted(best.values())]


# ---- URIs ------------------------------------------------------------------------------------
def _expand_uri(uri: str) -> list[InputFile]:
    if storage.has_magic(uri):
        return _glob_files(uri)
    if uri.endswith("/"):
        return _expand_uri_dir(uri.rstrip("/"), named=uri)
    try:
        info = storage.stat(uri)
    except storage.StorageError as e:
        if e.kind != NOT_FOUND:
            raise
        return _expand_uri_dir(uri, named=uri)  # a "directory": a prefix some keys share
    return [InputFile(uri, _kind_of(uri), info)]


def _expand_uri_dir(uri: str, *, named: str) -> list[InputFile]:
    listed = storage.listing(uri, recursive=False, named=named)
    if not listed:
        raise missing(uri, named=named)
    return _dir_files(uri, {info.uri[len(uri) + 1:]: info for info in listed
                            if not info.is_dir and not info.uri[len(uri) + 1:].startswith((".", "_"))})


# ---- both --------------------------------------------------------------------------------------
def _glob_files(pattern: str) -> list[InputFile]:
    """The files a glob gives: its matching files (under ``**`` those of a known kind only),
    and the files of each directory it matches when it has no ``**``."""
    try:
        matches = storage.expand(pattern)
    except storage.StorageError as e:
        if e.kind == NO_MATCH:
            raise ValueError(f"input {storage.display(pattern)!r}: the glob matches no file") from None
        raise
    found: list[InputFile] = []
    for m in matches:
        if m.is_dir:
            if "**" not in pattern:
                found.extend(_expand_local_dir(m.uri) if not storage.is_remote(m.uri)
                             else _expand_uri_dir(m.uri, named=m.uri))
        elif _ext(m.uri) in _KIND_OF_EXT or "**" not in pattern:
            found.append(InputFile(m.uri, _kind_of(m.uri), m))
    if not found:
        raise ValueError(f"input {storage.display(pattern)!r}: the glob matches no supported file ({_SUPPORTED})")
    return found


def _dir_files(path: str, entries: dict[str, storage.ObjectInfo]) -> list[InputFile]:
    """The files of directory ``path`` given its entries (name -> info; names starting with "."
    or "_" left out): a saved dataset's files in ``state.json``'s order, else every file of a
    known kind, sorted by name."""
    if "dataset_dict.json" in entries:
        splits = _json_object(storage.join(path, "dataset_dict.json"),
                              fix="re-save it or point at a split").get("splits", [])
        raise ValueError(
            f"input {storage.display(path)!r} is a Hugging Face DatasetDict with splits {splits}; point the input at "
            f"one split directory, e.g. {storage.display(storage.join(path, splits[0] if splits else 'train'))!r}"
        )
    if "state.json" in entries:
        state_path = storage.join(path, "state.json")
        listed = _json_object(state_path, fix="re-save the dataset with save_to_disk").get("_data_files", [])
        if not isinstance(listed, list) or not all(isinstance(d, dict) and isinstance(d.get("filename"), str)
                                                   for d in listed):
            raise ValueError(f"input {storage.display(state_path)!r}: not a Hugging Face datasets state.json "
                             "(_data_files should list {\"filename\": ...} entries)")
        if not listed:
            raise ValueError(f"input {storage.display(path)!r}: state.json lists no data files")
        return [_listed_file(path, d["filename"], entries) for d in listed]
    found = [InputFile(storage.join(path, n), _KIND_OF_EXT[_ext(n)], entries[n])
             for n in sorted(entries) if _ext(n) in _KIND_OF_EXT]
    if not found:
        raise ValueError(f"input directory {storage.display(path)!r} holds no supported file ({_SUPPORTED})")
    return found


def _listed_file(path: str, filename: str, entries: dict[str, storage.ObjectInfo]) -> InputFile:
    """A file ``state.json`` lists: its listing entry, else (a name in a subdirectory, a file
    the listing did not show) a stat, which names it when it does not exist."""
    full = storage.join(path, filename)
    info = entries.get(filename) or storage.stat(full)
    return InputFile(full, "arrow", info)


def _json_object(uri: str, *, fix: str) -> dict:
    """The JSON object in ``uri``; ValueError naming the file and ``fix`` when it is not one."""
    try:
        value = json.loads(storage.read_bytes(uri))
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        if isinstance(e, storage.StorageError):
            raise
        raise ValueError(f"{storage.display(uri)} is not a valid JSON object ({e}): {fix}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{storage.display(uri)} is not a valid JSON object (it holds a {type(value).__name__}): "
                         f"{fix}")
    return value


def _ext(path: str) -> str:
    return posixpath.splitext(path)[1].lower() if storage.is_remote(path) else os.path.splitext(path)[1].lower()


def _kind_of(path: str) -> str:
    kind = _KIND_OF_EXT.get(_ext(path))
    if kind is None:
        raise ValueError(f"input {storage.display(path)!r}: unknown file type; supported extensions: {_SUPPORTED}")
    return kind
