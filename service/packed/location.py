"""Where a packed output may go, what of it is packfeed's, and clearing a previous one: on disk
and on an object store alike.

An output is a directory or a key prefix (``s3://bucket/runs/pack``). packfeed owns in it the
part files its ``.packfeed/files.json`` lists and everything under ``.packfeed/``; anything
else there makes the location refused, never deleted. A location holding only ``.packfeed/``
without a ``files.json`` (the scan manifest of a pack that stopped before writing rows) is as
good as empty.

An output may not be, contain or lie inside an input. Locations are compared without
credentials, segment by segment: a local path by its real path (a symlinked input is still
protected), a URI by scheme, bucket and key (``s3://KEY:SECRET@b/x/`` is ``s3://b/x``). A glob
on a store is refused when it would read the output at a later run: its literal prefix lies
inside the output, or the glob matches the output's prefix or part files
(``s3://b/corpus/**/*.parquet`` refuses ``s3://b/corpus/packed``; ``s3://b/corpus/*.jsonl``
allows it).

``kept_scan`` keeps the inputs' scan manifest in ``.packfeed/scan.npz`` across runs without
writing to the output before its checks passed.

Costs on a store: ``check_output`` one HEAD (the location is not an object) and one LIST per
1,000 keys, plus a GET of ``files.json`` and one of ``stats.json`` when there is something (whether that
output finished: the refusal, or ``--overwrite``'s line, says so); ``check_writable`` a PUT
and a delete; ``clear_previous`` two LISTs and a delete per object (objects.delete_prefix).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Sequence

from packfeed.service import storage
from packfeed.service.storage.store_errors import NOT_FOUND
from packfeed.service.storage.tree import read_if_exists
from packfeed.service.storage.uri import split

logger = logging.getLogger("packfeed")

META_DIR = ".packfeed"
SCAN_CACHE = "scan.npz"  # the inputs' scan manifest under META_DIR: kept by an overwrite
FILES = "files.json"
_SAME_SCHEME = {"s3a": "s3", "gcs": "gs", "abfss": "abfs"}
_PART_EXAMPLE = "part-00000.parquet"


def check_output(out: str, *, inputs: Sequence[str], overwrite: bool) -> list[str] | None:
    """The part files of a previous packfeed output at ``out`` that an overwrite replaces (None
    when there is none). ValueError when ``out`` is over an input, is a file, holds anything
    packfeed did not write, or holds an output and ``overwrite`` is not given (saying when that
    output is unfinished: ``previous_output``). Reads only."""
    check_not_over_inputs(out, inputs)
    names = _top_names(out)
    if not names:
        return None
    ours = written_files(out)
    if ours is None and names != [META_DIR]:
        raise ValueError(
            f"--output {storage.display(out)} holds files packfeed did not write ({', '.join(names[:5])}"
            f"{', ...' if len(names) > 5 else ''}): choose a new or empty directory"
        )
    if ours is None:
        return None
    foreign = [e for e in names if e != META_DIR and e not in ours]
    if foreign:
        raise ValueError(
            f"--output {storage.display(out)} holds files packfeed did not write ({', '.join(foreign[:5])}) next to a "
            "previous output: move them away or choose another directory"
        )
    state = previous_output(out, ours)
    unfinished = state is not None and not state[0]
    if not overwrite:
        why = f" (it holds {state[1]}; a pack does not resume: --overwrite packs it again from the start)" \
            if unfinished else ""
        raise ValueError(f"--output {storage.display(out)} already holds packed output; pass --overwrite to replace "
                         f"it{why}")
    if unfinished:
        logger.info("--output %s holds %s; --overwrite replaces it once every check has passed",
                    storage.display(out), state[1])
    return ours


def previous_output(out: str, ours: Sequence[str] | None = None) -> tuple[bool, str] | None:
    """(complete, what it is) of the packfeed output at ``out``, None when there is none:
    ``(True, "a complete pack of 3 part file(s)")``, ``(False, "an interrupted pack: 3 part
    file(s) listed, no .packfeed/stats.json, the marker a pack writes when it ends")`` (killed,
    crashed, the machine lost) or ``(False, "a failed pack: status 'failed: ...'")``.
    ``ours``: its files.json, when read already. Reads files.json and stats.json (a GET each on
    a store)."""
    ours = written_files(out) if ours is None else ours
    if ours is None:
        return None
    parts = f"{len(ours)} part file(s)"
    data = read_if_exists(storage.join(out, META_DIR, "stats.json"))
    if data is None:
        return False, (f"an interrupted pack: {parts} listed, no {META_DIR}/stats.json, the marker a pack "
                       "writes when it ends")
    try:
        status = json.loads(data).get("status")
    except (ValueError, AttributeError, UnicodeDecodeError):
        status = None
    if status == "complete":
        return True, f"a complete pack of {parts}"
    return False, f"a failed pack: status {status!r} in {META_DIR}/stats.json"


def _top_names(out: str) -> list[str]:
    """The entries right under ``out``, sorted (on a store: the first segment of every key
    below it); ValueError when ``out`` is a file (an object)."""
    if not storage.is_remote(out):
        path = Path(os.path.realpath(out))
        if path.exists() and not path.is_dir():
            raise ValueError(f"--output {out} is a file, not a directory")
        return sorted(p.name for p in path.iterdir()) if path.exists() else []
    if split(out)[2].strip("/"):  # a key prefix, which may name an object (a bucket never does)
        try:
            storage.stat(out)
        except storage.StorageError as exc:
            if exc.kind != NOT_FOUND:  # a missing bucket is said now, before any work
                raise
        else:
            raise ValueError(f"--output {storage.display(out)} is an object, not a key prefix")
    base = out.rstrip("/")
    return sorted({info.uri[len(base) + 1:].split("/")[0] for info in storage.listing(base, recursive=True)})


def written_files(out_dir: str | Path) -> list[str] | None:
    """The files a packfeed run listed as written in ``out_dir``, or None if it is not one."""
    data = read_if_exists(storage.join(os.fspath(out_dir), META_DIR, FILES))
    if data is None:
        return None
    try:
        files = json.loads(data)["files"]
    except (ValueError, KeyError, TypeError):
        return None
    return [f for f in files if isinstance(f, str) and "/" not in f and f.startswith("part-")]


def check_writable(out: str) -> None:
    """Create ``out`` (on disk) and write a probe there, so that a read-only location fails
    now, naming it, before any work."""
    if storage.is_remote(out):
        name = f".write-test-{os.getpid()}"
        storage.write_bytes_atomic(storage.join(out, META_DIR, name), b"")
        storage.delete_prefix(storage.join(out, META_DIR), only=lambda rel: rel == name)
        return
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".packfeed-write-test-{os.getpid()}"
    probe.write_text("")
    probe.unlink()


def clear_previous(out: str, ours: Sequence[str]) -> None:
    """Delete a previous packfeed output at ``out``: its ``stats.json`` first (an overwrite cut
    short never leaves an output that looks complete), then the part files ``ours`` and the
    rest of ``.packfeed/`` but the scan manifest. Nothing else."""
    parts = set(ours)
    storage.delete_prefix(storage.join(out, META_DIR), only=lambda rel: rel == "stats.json")
    storage.delete_prefix(out, only=lambda rel: rel in parts or (
        rel.startswith(f"{META_DIR}/") and rel != f"{META_DIR}/{SCAN_CACHE}"))


def check_not_over_inputs(out: str, inputs: Sequence[str]) -> None:
    """ValueError when the output ``out`` is, lies inside or contains one of ``inputs`` (the
    module docstring says how locations compare)."""
    where = segments(out)
    for item in inputs:
        relation = _relation(where, item)
        if relation:
            raise ValueError(f"--output {storage.display(out)} {relation} the input {storage.display(item)}: write the "
                             "rows somewhere else")


def segments(path: str) -> tuple[str, ...]:
    """A location as comparable segments, credential-free: ``s3://K:S@b/x/y/`` -> ("s3", "b",
    "x", "y"); a local path -> ("", *its real path's parts)."""
    if not storage.is_remote(path):
        return ("", *Path(os.path.realpath(path)).parts)
    scheme, authority, key = split(path)
    return (_SAME_SCHEME.get(scheme, scheme), authority.rpartition("@")[2], *(p for p in key.split("/") if p))


def _relation(out: tuple[str, ...], item: str) -> str | None:
    """How the output at ``out`` (``segments``) stands to the input ``item``, or None."""
    at = segments(item)
    if storage.is_remote(item) and storage.has_magic(item):
        first = next((i for i, part in enumerate(at) if i >= 2 and storage.has_magic(part)), len(at))
        base, pattern = at[:first], list(at[first:])
        if out[:len(base)] != base:
            return "contains" if base[:len(out)] == out else None
        below = list(out[len(base):])
        if not below:
            return "contains"
        reads = any(storage.match(pattern, below[:i]) for i in range(1, len(below) + 1))
        return "lies inside" if reads or storage.match(pattern, [*below, _PART_EXAMPLE]) else None
    if out == at:
        return "is"
    if out[:len(at)] == at:
        return "lies inside"
    if at[:len(out)] == out:
        return "contains"
    return None


@contextlib.contextmanager
def kept_scan(out: str) -> Iterator[tuple[str, Callable[[], None]]]:
    """(a local copy of the scan manifest the output ``out`` keeps, a function that writes the
    copy back): ``build_plan`` reads and updates the copy; the caller writes it back once the
    output is being written, so a run refused or failed before then leaves the output as it
    was. Writes back only what changed (a second pack of the same inputs writes nothing)."""
    uri = storage.join(out, META_DIR, SCAN_CACHE)
    before = read_if_exists(uri)
    directory = tempfile.mkdtemp(prefix="packfeed-scan-")
    local = os.path.join(directory, SCAN_CACHE)
    if before is not None:
        Path(local).write_bytes(before)

    def write_back() -> None:
        now = Path(local).read_bytes() if os.path.exists(local) else None
        if now is not None and now != before:
            storage.write_bytes_atomic(uri, now)

    try:
        yield local, write_back
    finally:
        shutil.rmtree(directory, ignore_errors=True)
