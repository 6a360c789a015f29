"""Finding input files: paths, directories and globs to an ordered list of (file, kind).

Order defines the global sample ids (``data/plan.py``). A directory expands to its files sorted
by name, not recursively; a glob expands sorted, ``**`` recursively; symlinks are resolved and
every real file is read once. The kind comes from the extension:

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
"""

from __future__ import annotations

import fnmatch
import glob
import logging
import os
from typing import Sequence

from packfeed.service.packed.writer import read_json_object

logger = logging.getLogger("packfeed")

KIND_EXTENSIONS = {
    "jsonl": (".jsonl", ".ndjson", ".json"),
    "parquet": (".parquet", ".pq"),
    "arrow": (".arrow", ".feather", ".ipc"),
    "text": (".txt", ".md"),
}
_KIND_OF_EXT = {ext: kind for kind, exts in KIND_EXTENSIONS.items() for ext in exts}


def expand_inputs(inputs: Sequence[str] | str) -> list[tuple[str, str]]:
    """Resolve inputs to an ordered list of (file, kind), each real file once.

    Order defines the global sample ids. A file reached twice (listed twice, or through a
    symlinked directory loop under ``**``) is read once, with a warning.
    """
    if isinstance(inputs, (str, bytes, os.PathLike)):
        inputs = [inputs]
    out: list[tuple[str, str]] = []
    seen: dict[str, str] = {}  # real path -> the path it was first listed as
    repeats: list[str] = []
    for item in inputs:
        path = os.fspath(item)
        for file, kind in _expand_one(path):
            real = os.path.realpath(file)
            if real in seen:
                repeats.append(file)
                continue
            seen[real] = file
            out.append((file, kind))
    if repeats:
        logger.warning(
            "%d input path(s) lead to files already listed (a symlink loop, or the same file given twice), "
            "e.g. %s; each file is read once", len(repeats), repeats[0],
        )
    return out


def _expand_one(path: str) -> list[tuple[str, str]]:
    try:
        if os.path.isdir(path):
            return _expand_dir(path)
        if os.path.isfile(path):
            return [(path, _kind_of(path))]
        if glob.has_magic(path):
            matches = sorted(_recursive_glob(path) if "**" in path else glob.glob(path))
            if not matches:
                raise ValueError(f"input {path!r}: the glob matches no file")
            found: list[tuple[str, str]] = []
            for m in matches:
                if os.path.isdir(m):
                    if "**" not in path:
                        found.extend(_expand_dir(m))
                elif os.path.splitext(m)[1].lower() in _KIND_OF_EXT or "**" not in path:
                    found.append((m, _kind_of(m)))
            if not found:
                raise ValueError(f"input {path!r}: the glob matches no supported file ({', '.join(sorted(_KIND_OF_EXT))})")
            return _once_each(path, found)
        if os.path.islink(path):
            os.stat(path)  # raises ELOOP for a loop; a dangling link raises ENOENT below
    except OSError as e:  # ELOOP, EACCES, ...: say which input and why
        raise ValueError(f"input {path!r}: cannot read it ({e.strerror or e})") from None
    if os.path.islink(path):
        raise ValueError(f"input {path!r} is a broken symbolic link (its target does not exist)")
    raise ValueError(f"input {path!r} does not exist")


def _recursive_glob(pattern: str) -> list[str]:
    """``glob.glob(pattern, recursive=True)`` that walks each real directory once.

    The standard glob follows directory symlinks until the OS refuses (ELOOP, ~40 levels): one
    loop lists a file ~40 times, two loops ~2**40 paths (a hang). This walk goes breadth first,
    so each directory is reached by its shortest path, and skips a directory whose real path it
    has already walked. Matching follows glob's rules: ``**`` spans zero or more directories, and
    a name starting with "." matches only a pattern part that starts with "."."""
    parts = pattern.split(os.sep)
    first_magic = next(i for i, part in enumerate(parts) if glob.has_magic(part))
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
            if _glob_match(rest, parts_below):
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


def _glob_match(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """Whether path ``parts`` match glob ``pattern`` parts (``**``: zero or more parts)."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        if _glob_match(pattern[1:], parts):
            return True
        return bool(parts) and not parts[0].startswith(".") and _glob_match(pattern, parts[1:])
    if not parts or (parts[0].startswith(".") and not pattern[0].startswith(".")):
        return False
    return fnmatch.fnmatchcase(parts[0], pattern[0]) and _glob_match(pattern[1:], parts[1:])


def _once_each(pattern: str, found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A glob's files, each real file once under its shortest path (links to one file, or to
    one directory under two names), in the glob's order."""
    best: dict[str, int] = {}  # real path -> index in found of its shortest path
    for i, (file, _) in enumerate(found):
        real = os.path.realpath(file)
        if real not in best or file.count(os.sep) < found[best[real]][0].count(os.sep):
            best[real] = i
    if len(best) < len(found):
        logger.warning(
            "input %r reaches %d file(s) through %d paths (a symlink loop?); each file is read once",
            pattern, len(best), len(found),
        )
    return [found[i] for i in sorted(best.values())]


def _kind_of(path: str) -> str:
    kind = _KIND_OF_EXT.get(os.path.splitext(path)[1].lower())
    if kind is None:
        known = ", ".join(sorted(_KIND_OF_EXT))
        raise ValueError(f"input {path!r}: unknown file type; supported extensions: {known}")
    return kind


def _expand_dir(path: str) -> list[tuple[str, str]]:
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        splits = read_json_object(os.path.join(path, "dataset_dict.json"), fix="re-save it or point at a split").get("splits", [])
        raise ValueError(
            f"input {path!r} is a Hugging Face DatasetDict with splits {splits}; point the input at "
            f"one split directory, e.g. {os.path.join(path, splits[0] if splits else 'train')!r}"
        )
    if os.path.isfile(os.path.join(path, "state.json")):
        state_path = os.path.join(path, "state.json")
        entries = read_json_object(state_path, fix="re-save the dataset with save_to_disk").get("_data_files", [])
        if not isinstance(entries, list) or not all(isinstance(d, dict) and isinstance(d.get("filename"), str)
                                                    for d in entries):
            raise ValueError(f"input {state_path!r}: not a Hugging Face datasets state.json (_data_files should list "
                             "{\"filename\": ...} entries)")
        files = [os.path.join(path, d["filename"]) for d in entries]
        if not files:
            raise ValueError(f"input {path!r}: state.json lists no data files")
        return [(p, "arrow") for p in files]
    names = sorted(n for n in os.listdir(path) if not n.startswith((".", "_")))
    for n in names:  # a data file that is a link loop or dangling link is an error, not ignored
        full = os.path.join(path, n)
        if os.path.splitext(n)[1].lower() in _KIND_OF_EXT and os.path.islink(full) and not os.path.exists(full):
            _expand_one(full)
    found = [
        (os.path.join(path, n), _KIND_OF_EXT[os.path.splitext(n)[1].lower()])
        for n in names
        if os.path.splitext(n)[1].lower() in _KIND_OF_EXT and os.path.isfile(os.path.join(path, n))
    ]
    if not found:
        raise ValueError(f"input directory {path!r} holds no supported file ({', '.join(sorted(_KIND_OF_EXT))})")
    return found
