"""Operations on a tree of files, the same on disk and on an object store: what a run's output
(``packfeed train``'s run directory, a packed output's metadata) needs beyond single objects.

* ``read_if_exists`` / ``read_text``: a file's contents, None when it is not there;
* ``write_json``: a JSON file written whole, credentials scrubbed from the URIs in it;
* ``holds`` / ``remove_names``: whether a name is under a root, and deleting some names under it;
* ``find``: the files under a root whose relative path matches glob parts;
* ``upload_dir`` / ``download_dir``: a local directory to a store and back;
* ``publish_dir``: "write aside, then make it whole": a directory written under another name
  takes its final name, so a reader never sees half of it (on disk a rename; on a store, which
  has no rename, ``copy_tree`` with the file that marks it whole last);
* ``copy_tree``: every object under one prefix to another, one named file last;
* ``remove_dir``: a store's "directory" deleted whole, its own ``name/`` key included.

A failure on a store is one ``StorageError`` line naming the object (``storage.resolve``'s
filesystem retries by itself).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow.fs as pafs

from packfeed.service.storage.glob import match
from packfeed.service.storage.objects import delete_prefix, exists, listing, write_bytes_atomic
from packfeed.service.storage.reads import read_bytes
from packfeed.service.storage.redact import display, scrub
from packfeed.service.storage.store_errors import NO_BUCKET, NOT_FOUND, StorageError, classify
from packfeed.service.storage.uri import is_remote, join, resolve


def read_if_exists(uri: str) -> bytes | None:
    """The bytes of ``uri`` (a path or a URI), None when there is no such file or object (nor
    its bucket)."""
    if not is_remote(uri):
        return Path(uri).read_bytes() if os.path.isfile(uri) else None
    try:
        return read_bytes(uri)
    except StorageError as exc:
        if exc.kind in (NOT_FOUND, NO_BUCKET):
            return None
        raise


def read_text(uri: str) -> str | None:
    """The text of ``uri`` (a path or a URI), None when there is no such file."""
    data = read_if_exists(uri)
    return None if data is None else data.decode()


def write_json(uri: str, value: Any) -> None:
    """``value`` as JSON at ``uri``, whole or not at all, credentials scrubbed from its URIs."""
    write_bytes_atomic(uri, scrub(json.dumps(value, indent=1)).encode())


def holds(root: str | Path, name: str) -> bool:
    """Whether the file or directory ``name`` is under ``root`` (on a store: any key below it)."""
    uri = join(os.fspath(root), name)
    if not is_remote(uri):
        return os.path.exists(uri)
    return exists(uri) or bool(listing(uri, recursive=False))


def remove_names(root: str | Path, names: tuple[str, ...]) -> None:
    """Delete the files and directories ``names`` under ``root`` (on a store: one listing)."""
    if is_remote(os.fspath(root)):
        delete_prefix(os.fspath(root), only=lambda rel: rel.split("/")[0] in names)
        return
    for name in names:
        target = Path(root, name)
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def find(root: str, parts: list[str]) -> list[str]:
    """The files under ``root`` whose path relative to it matches the glob ``parts`` (one per
    level, e.g. ``["checkpoint_*", "trainer_state.json"]``): paths, or URIs (one listing)."""
    if not is_remote(root):
        return [str(p) for p in Path(root).glob("/".join(parts))]
    return [info.uri for info in listing(root, recursive=True)
            if match(parts, info.uri[len(root) + 1:].split("/"))]


def upload_dir(local: Path, uri: str, *, last: str | None = None) -> None:
    """Copy the files under ``local`` to ``uri`` (a store), streamed, ``last`` after the others."""
    files = sorted((p for p in local.rglob("*") if p.is_file()), key=lambda p: (p.name == last, str(p)))
    for file in files:
        target = join(uri, file.relative_to(local).as_posix())
        _on_store(target, "upload", lambda: _upload(file, target))


def _upload(file: Path, target: str) -> None:
    fs, dest = resolve(target)
    pafs.copy_files(str(file), dest, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)


@contextlib.contextmanager
def download_dir(uri: str | Path, *, prefix: str = "packfeed-") -> Iterator[Path]:
    """``uri`` as a local directory: itself on disk; on a store its files downloaded to a
    temporary directory, removed afterwards."""
    if not is_remote(os.fspath(uri)):
        yield Path(uri)
        return
    fs, inside = resolve(os.fspath(uri))
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        _on_store(os.fspath(uri), "download", lambda: pafs.copy_files(
            inside, tmp, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem()))
        yield Path(tmp)


def copy_tree(source: str, target: str, *, last: str | None = None) -> None:
    """Copy every object under ``source`` to the same names under ``target`` (one store), the
    file named ``last`` after the others."""
    fs, _ = resolve(source)
    names = sorted((info.uri[len(source) + 1:] for info in listing(source, recursive=True) if not info.is_dir),
                   key=lambda rel: (rel == last, rel))
    for rel in names:
        src, dst = join(source, rel), join(target, rel)
        _on_store(dst, "copy", lambda: fs.copy_file(resolve(src)[1], resolve(dst)[1]))


def publish_dir(partial: str, final: str, *, marker: str, old: str | None = None) -> None:
    """Make the directory written at ``partial`` the one at ``final``, whole or not at all
    (``marker``: the file whose presence says a directory is whole, written last). On disk a
    rename: a previous ``final`` is renamed to ``old`` first (deleted in place, it would be half
    a directory for a while), then deleted. On a store the previous one's ``marker`` goes first,
    the new one's comes last, and ``partial`` is removed whole."""
    if not is_remote(partial):
        aside = old or f"{final}.old"
        shutil.rmtree(aside, ignore_errors=True)
        if os.path.exists(final):
            os.rename(final, aside)
        os.rename(partial, final)
        shutil.rmtree(aside, ignore_errors=True)
        return
    delete_prefix(final, only=lambda rel: rel == marker)
    delete_prefix(final)
    copy_tree(partial, final, last=marker)
    remove_dir(partial)


def remove_dir(uri: str) -> None:
    """Delete ``uri`` on a store whole: every key under it, then its own ``name/`` key.

    ``delete_prefix`` keeps the "directory": Arrow writes an empty ``name/`` key to keep it in
    being, so a prefix emptied key by key still lists. Arrow's ``delete_dir`` removes it (one
    DELETE, after a LIST) and, as every delete of Arrow's, puts an empty key for the parent
    instead: the parent's own ``name/``, harmless."""
    delete_prefix(uri)
    fs, inside = resolve(uri)

    def delete() -> None:
        try:
            fs.delete_dir(inside)
        except FileNotFoundError:  # no key left, not even its own
            pass

    _on_store(uri, "delete", delete)


def _on_store(uri: str, what: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` on the filesystem of ``resolve``; a failure is one line naming ``uri``."""
    try:
        return fn()
    except OSError as exc:
        raise StorageError(display(uri), f"{what} failed ({classify(exc).detail})") from None
