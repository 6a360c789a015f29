"""Globs with one meaning everywhere: on disk, and on a store listed once.

The rules are the standard glob's (and packfeed's before URIs): ``*`` any run of characters
within one path segment, ``?`` one character, ``[..]`` a class, ``**`` as a whole segment zero
or more segments; a name starting with "." matches only a pattern segment that starts with "."
(and ``**`` does not descend into such a directory). ``match`` is that rule on segments, shared
by both sides.

On disk, ``local_glob`` walks as packfeed always has: ``glob.glob`` without ``**``, else a
breadth-first walk that reaches each real directory once (a symlink loop is walked once, with a
warning). On a store there are no directories to walk: ``expand`` lists the keys under the
literal prefix before the first wildcard segment in ONE listing (recursive unless the wildcard
is in the last segment), and matches each key's segments below it. Requests: one LIST per 1,000
keys under the prefix, whatever the pattern; so put the literal part first
(``s3://b/corpus/2024-*/**/*.jsonl`` lists ``corpus/``, not the bucket).

Both return matches sorted by their URI (on a store: by key), directories included (marked
``is_dir``; on a store a directory is a prefix some keys share), as today's glob does.
"""

from __future__ import annotations

import fnmatch
import glob as std_glob
import logging
import os
from typing import Sequence

from packfeed.service.storage.store_errors import INVALID, NO_MATCH, NOT_FOUND, StorageError
from packfeed.service.storage.objects import ObjectInfo, listing, missing, stat
from packfeed.service.storage.redact import display
from packfeed.service.storage.uri import is_remote, split

logger = logging.getLogger(__name__)


def has_magic(pattern: str) -> bool:
    return std_glob.has_magic(pattern)


def match(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """Whether path segments ``parts`` match glob segments ``pattern`` (``**``: zero or more).

    ``match(["**", "*.jsonl"], ["a", "b", "x.jsonl"])`` is True; ``match(["*"], [".hidden"])`` False."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        if match(pattern[1:], parts):
            return True
        return bool(parts) and not parts[0].startswith(".") and match(pattern, parts[1:])
    if not parts or (parts[0].startswith(".") and not pattern[0].startswith(".")):
        return False
    return fnmatch.fnmatchcase(parts[0], pattern[0]) and match(pattern[1:], parts[1:])


def expand(pattern: str) -> list[ObjectInfo]:
    """The files and directories ``pattern`` matches, sorted by URI. ``StorageError`` when it
    matches nothing (on a store: naming a missing bucket when that is why). A pattern without
    wildcards gives what it names."""
    if not has_magic(pattern):
        return [stat(pattern)]
    if not is_remote(pattern):
        found = [_local_info(path) for path in local_glob(pattern)]
    else:
        found = _remote_glob(pattern)
    if not found:
        if is_remote(pattern):
            error = missing(_base_of(pattern)[0], named=pattern)
            if error.kind != NOT_FOUND:
                raise error
        raise StorageError(display(pattern), "the glob matches nothing", kind=NO_MATCH)
    return found


def _base_of(pattern: str) -> tuple[str, list[str]]:
    """``s3://b/corpus/2024-*/**/*.jsonl`` -> (``s3://b/corpus``, ``["2024-*", "**", "*.jsonl"]``)."""
    scheme, authority, path = split(pattern)
    if has_magic(authority):
        raise StorageError(display(pattern), "a wildcard in the bucket or host is not supported; list the "
                           "buckets one by one", kind=INVALID)
    parts = path.split("/")
    first = next(i for i, part in enumerate(parts) if has_magic(part))
    return "/".join([f"{scheme}://{authority}", *parts[:first]]), parts[first:]


def _remote_glob(pattern: str) -> list[ObjectInfo]:
    base, rest = _base_of(pattern)
    recursive = len(rest) > 1 or "**" in rest
    return [info for info in listing(base, recursive=recursive, named=pattern)
            if match(rest, info.uri[len(base) + 1:].split("/"))]


def _local_info(path: str) -> ObjectInfo:
    try:
        st = os.stat(path)
    except OSError:  # a dangling link matches as glob matches it; reading it will say why
        return ObjectInfo(path, None, None)
    if os.path.isdir(path):
        return ObjectInfo(path, None, None, is_dir=True)
    return ObjectInfo(path, st.st_size, st.st_mtime_ns)


def local_glob(pattern: str) -> list[str]:
    """The local paths ``pattern`` matches, sorted: ``glob.glob``, or with ``**`` a walk that
    visits each real directory once."""
    return sorted(_recursive_glob(pattern) if "**" in pattern else std_glob.glob(pattern))


def _recursive_glob(pattern: str) -> list[str]:
    """``glob.glob(pattern, recursive=True)`` that walks each real directory once.

    The standard glob follows directory symlinks until the OS refuses (ELOOP, ~40 levels): one
    loop lists a file ~40 times, two loops ~2**40 paths (a hang). This walk goes breadth first,
    so each directory is reached by its shortest path, and skips a directory whose real path it
    has already walked."""
    parts = pattern.split(os.sep)
    first_magic = next(i for i, part in enumerate(parts) if has_magic(part))
    root = os.sep.join(parts[:first_magic]) or (os.sep if pattern.startswith(os.sep) else "")
    rest = parts[first_magic:]
    if not os.path.isdir(root or os.curdir):
        return []
    matches: list[str] = []
    walked = {os.path.realpath(root or os.curdir)}
    skipped_links: list[str] = []
    queue = [(root, ())]  # (directory, its parts below root)
    while queue:
        directory, below = queue.pop(0)
        try:
            entries = sorted(os.scandir(directory or os.curdir), key=lambda e: e.name)
        except OSError:
            continue  # unreadable, as glob ignores it
        for entry in entries:
            parts_below = (*below, entry.name)
            full = os.path.join(directory, entry.name)
            if match(rest, parts_below):
                matches.append(full)
            if not entry.is_dir():  # follows symlinks
                continue
            real = os.path.realpath(full)
            if real in walked:
                skipped_links.append(full)
            elif not entry.name.startswith(".") or any(p.startswith(".") for p in rest):
                walked.add(real)
                queue.append((full, parts_below))
    if skipped_links:
        logger.warning("input %r: %d directory link(s) lead back to directories already walked (a symlink loop?), "
                       "e.g. %s; each directory is walked once", pattern, len(skipped_links), skipped_links[0])
    return matches
