"""Input files: expansion, row counting, and reading the rows of a window.

Stage contract (docs/design.md)::

    paths ──expand_inputs──▶ [(file, kind)]       (driver; each real file once)
    file  ──scan_file──▶ FileScan                  (driver; row count, JSONL seek offsets)
    WindowSpec ──read_window──▶ RawWindow          (in an actor; exactly the window's rows)

Which rows a window holds is decided by ``plan.py``; this module only finds and reads them.

Input kinds (a directory expands to its files sorted by name, not recursively; a glob expands
sorted, ``**`` recursively; symlinks are resolved and every real file is read once):

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

Sample formats, validation rules and skip reasons: see ``records.py``.

Costs: scanning counts JSONL newlines in 8 MiB chunks (``bytes.count``, ~GB/s) and reads only
Parquet/Arrow metadata. Reading a window seeks to each JSONL run of rows (at most ``stride``
lines are skipped after a seek) and decodes each Parquet row group or Arrow batch it touches
once, with only the columns a sample format uses.
"""
from __future__ import annotations

import fnmatch
import glob
import json
import logging
import os
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from packfeed.service.inputs.records import (
    BLANK_LINE,
    EMPTY_FIELD,
    INVALID_UTF8,
    MALFORMED_JSON,
    MISSING,
    NOT_AN_OBJECT,
    RECORD_PARSERS,
    UNREADABLE,
    BadSampleError,
    InvalidRecord,
    Skip,
)
from packfeed.service.packed.writer import read_json_object

logger = logging.getLogger("packfeed")

KIND_EXTENSIONS = {
    "jsonl": (".jsonl", ".ndjson", ".json"),
    "parquet": (".parquet", ".pq"),
    "arrow": (".arrow", ".feather", ".ipc"),
    "text": (".txt", ".md"),
}
_KIND_OF_EXT = {ext: kind for kind, exts in KIND_EXTENSIONS.items() for ext in exts}
_FORMAT_COLUMNS = {
    "text": ("text",),
    "prompt_completion": ("prompt", "completion", "tools"),
    "messages": ("messages", "tools"),
    "auto": ("messages", "prompt", "completion", "text", "tools"),
}
_SCAN_CHUNK = 8 << 20
MAX_SEEK_STRIDE = 4096  # rows between JSONL seek points when blocks are larger (or off)


# ---- data types ------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileScan:
    """A file's row count and, for JSONL, byte offsets of some rows (``seek_rows`` ascending,
    row 0 always among them) so a reader can seek close to any row."""

    path: str
    kind: str
    num_rows: int
    seek_rows: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    seek_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))


@dataclass(frozen=True)
class Piece:
    """A run of consecutive rows of one file that a window holds.

    Row ``start_row + k`` of ``path`` has global sample id ``first_sample_id + k``. JSONL
    pieces carry ``byte_offset``, the offset of row ``seek_row`` <= ``start_row``: a reader
    seeks there and skips ``start_row - seek_row`` lines. A ``text`` piece groups consecutive
    one-document files: its row k is the whole file ``files[k]``.
    """

    path: str
    kind: str
    format: str
    source: int
    start_row: int
    num_rows: int
    first_sample_id: int
    byte_offset: int = 0
    seek_row: int = 0
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class WindowSpec:
    """Window ``index`` (of the whole stream, all epochs) of epoch ``epoch``: its pieces."""

    index: int
    epoch: int
    pieces: tuple[Piece, ...]

    @property
    def num_samples(self) -> int:
        return sum(p.num_rows for p in self.pieces)

    def sample_ids(self) -> np.ndarray:
        """The global ids of the window's rows, in piece order (int64)."""
        parts = [np.arange(p.first_sample_id, p.first_sample_id + p.num_rows, dtype=np.int64) for p in self.pieces]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def piece_of(self, sample_id: int) -> Piece:
        for piece in self.pieces:
            if piece.first_sample_id <= sample_id < piece.first_sample_id + piece.num_rows:
                return piece
        raise KeyError(f"sample {sample_id} is not in window {self.index}")

    def locate(self, sample_id: int) -> tuple[str, int]:
        """(file, 0-based row in it) of a sample of this window."""
        skip = self.skip(sample_id, "", "")
        return skip.source, skip.row

    def skip(self, sample_id: int, reason: str, detail: str) -> Skip:
        """A Skip naming the sample's file, row and (JSONL) line."""
        piece = self.piece_of(sample_id)
        k = sample_id - piece.first_sample_id
        if piece.kind == "text":
            return Skip(sample_id, piece.files[k], 0, reason, detail)
        row = piece.start_row + k
        return Skip(sample_id, piece.path, row, reason, detail, row + 1 if piece.kind == "jsonl" else None)


@dataclass
class RawWindow:
    """The good samples of one window, in piece order, and the skipped ones.

    ``records[i]`` (a ``str``, ``PromptCompletion`` or ``Conversation``: the type is the
    format) is sample ``sample_ids[i]`` of source ``sources[i]``. Every row of the window is in
    exactly one of ``records`` and ``skips`` (a sample repeated in the window counts each time).
    """

    spec: WindowSpec
    sample_ids: np.ndarray  # int64 [n]
    records: list[Any]
    skips: list[Skip] = field(default_factory=list)
    sources: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # int64 [n]

    def __len__(self) -> int:
        return len(self.records)

    def bad_sample_error(self, skip: Skip) -> BadSampleError:
        """The strict-mode error for a skip found after reading (e.g. by the tokenizer)."""
        return BadSampleError(skip)

    def select(self, positions: Sequence[int]) -> "RawWindow":
        """The records at ``positions`` (no skips): a sub-window for one tokenizer setting."""
        pos = np.asarray(positions, dtype=np.int64)
        return RawWindow(self.spec, self.sample_ids[pos], [self.records[i] for i in pos], [], self.sources[pos])


# ---- input expansion -------------------------------------------------------------------------
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


def plan_windows(inputs: Sequence[str] | str, *, window_samples: int, format: str = "auto") -> list[WindowSpec]:
    """The windows of ``inputs`` read in file order: one source, no shuffle, one epoch (the
    simple form, for tests and tools; runs plan mixtures with ``plan.build_plan``)."""
    from packfeed.service.data.config import DataConfig
    from packfeed.service.data.plan import build_plan

    paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    config = DataConfig.from_inputs(paths, tokenizer="-", seq_len=2, window_samples=window_samples, block_samples=0,
                        format=format)
    plan = build_plan(config)
    return [plan.window(k) for k in range(plan.num_windows)]


# ---- scanning --------------------------------------------------------------------------------
def scan_file(path: str, kind: str, *, first_row: int = 0, stride: int = MAX_SEEK_STRIDE) -> FileScan:
    """Count a file's rows; for JSONL also note the byte offsets of the rows r with
    (first_row + r) % stride == 0 (``first_row``: the file's first row within its source, so
    seek points fall on the source's block boundaries). Errors name the file."""
    try:
        if kind == "jsonl":
            num_rows, offsets = _scan_jsonl(path, (-first_row) % stride, stride)
            offsets.setdefault(0, 0)
            rows = np.asarray(sorted(offsets), dtype=np.int64)
            return FileScan(path, kind, num_rows, rows, np.asarray([offsets[r] for r in rows.tolist()], np.int64))
        if os.path.getsize(path) == 0:  # an export never finished: no rows (the plan warns), not a corrupt file
            return FileScan(path, kind, 0)
        return FileScan(path, kind, _count_rows(path, kind))
    except Exception as e:
        # pyarrow's errors (ArrowInvalid, ...; a plain OSError without errno for a truncated
        # stream) mean a corrupt or truncated file; an OSError with an errno is the filesystem's.
        if type(e).__module__.startswith("pyarrow") or (isinstance(e, OSError) and e.errno is None):
            raise ValueError(f"input {path!r}: not a readable {kind} file ({e}); re-export it or leave it out") from None
        if isinstance(e, OSError):
            raise ValueError(f"input {path!r}: cannot read it ({e.strerror or e})") from None
        raise


def _scan_jsonl(path: str, first_boundary: int, step: int) -> tuple[int, dict[int, int]]:
    """Count the rows of a JSONL file and find the byte offsets of rows first_boundary + k*step.

    A row is a line: n newlines give n rows, plus one if the file does not end with a newline.
    Offsets are found with numpy only in the chunks that hold a wanted line start.
    """
    offsets: dict[int, int] = {}
    want = first_boundary  # next row whose start offset we need
    if want == 0:
        offsets[0] = 0
        want += step
    newlines = 0  # newlines seen before the current chunk
    pos = 0
    last = b""
    with open(path, "rb") as f:
        while chunk := f.read(_SCAN_CHUNK):
            c = chunk.count(b"\n")
            # row r (r >= 1) starts right after newline number r - 1 (0-based)
            if newlines <= want - 1 < newlines + c:
                nl = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10)
                while want - 1 < newlines + c:
                    offsets[want] = pos + int(nl[want - 1 - newlines]) + 1
                    want += step
            newlines += c
            pos += len(chunk)
            last = chunk[-1:]
    num_rows = newlines + (1 if pos > 0 and last != b"\n" else 0)
    return num_rows, {r: o for r, o in offsets.items() if r < num_rows}


def _count_rows(path: str, kind: str) -> int:
    if kind == "text":
        return 1
    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    return sum(b.num_rows for b in _arrow_batches(path))


# ---- columnar helpers ------------------------------------------------------------------------
def _arrow_batches(path: str) -> Iterator[Any]:
    """Record batches of an Arrow IPC file (random access) or stream, memory-mapped (zero copy)."""
    import pyarrow as pa

    with pa.memory_map(path, "r") as source:
        try:
            reader = pa.ipc.open_file(source)
        except pa.ArrowInvalid:
            source.seek(0)
            try:
                stream = pa.ipc.open_stream(source)
            except pa.ArrowInvalid as e:
                raise ValueError(f"input {path!r}: not an Arrow IPC file or stream ({e})") from None
            yield from stream
        else:
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def _read_columnar(path: str, kind: str, ranges: list[tuple[int, int]], fmt: str) -> list[Any]:
    """One table per row range [lo, hi) of a Parquet/Arrow file, decoding every row group or
    batch the ranges touch once, with only the columns the format reads."""
    import pyarrow as pa

    if kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
        names = pf.schema_arrow.names
        columns = [c for c in _FORMAT_COLUMNS[fmt] if c in names]
        starts = np.concatenate(([0], np.cumsum(sizes)))
        needed = sorted({g for lo, hi in ranges for g in range(_group_of(starts, lo), _group_of(starts, hi - 1) + 1)})
        table = pf.read_row_groups(needed, columns=columns)
        # The needed groups sit back to back in ``table``: file row r of group g is table row
        # r - starts[g] + (rows of the needed groups before g).
        before = dict(zip(needed, np.cumsum([0] + [sizes[g] for g in needed[:-1]]).tolist()))

        def table_row(r: int) -> int:
            g = _group_of(starts, r)
            return before[g] + r - int(starts[g])

        return [table.slice(table_row(lo), hi - lo) for lo, hi in ranges]
    batches: list[Any] = []
    row = 0
    last = max(hi for _, hi in ranges)
    for batch in _arrow_batches(path):
        n = batch.num_rows
        if any(lo < row + n and hi > row for lo, hi in ranges):
            batches.append((row, batch))
        row += n
        if row >= last:
            break
    names = batches[0][1].schema.names if batches else []
    columns = [c for c in _FORMAT_COLUMNS[fmt] if c in names]
    out = []
    for lo, hi in ranges:
        parts = [b.select(columns).slice(max(lo - r, 0), min(hi, r + b.num_rows) - max(lo, r))
                 for r, b in batches if lo < r + b.num_rows and hi > r]
        out.append(pa.Table.from_batches(parts) if parts else None)
    return out


def _group_of(starts: np.ndarray, row: int) -> int:
    return int(np.searchsorted(starts, row, side="right")) - 1


# ---- reading ---------------------------------------------------------------------------------
def read_window(spec: WindowSpec, *, strict: bool = False) -> RawWindow:
    """Read exactly the rows of ``spec``: good records with their ids, and a Skip for the rest.

    With ``strict=True`` the first bad row raises ``BadSampleError`` naming file, row and line.
    Rows of a Parquet/Arrow file the reader cannot decode are skipped as ``unreadable``.
    """
    ids: list[int] = []
    records: list[Any] = []
    sources: list[int] = []
    skips: list[Skip] = []
    columnar = _columnar_tables(spec)
    for index, piece in enumerate(spec.pieces):
        parse = RECORD_PARSERS[piece.format]
        if piece.kind == "jsonl":
            rows = _jsonl_rows(piece, parse)
        elif piece.kind == "text":
            rows = _text_rows(piece)
        else:
            rows = _columnar_rows(piece, parse, columnar[index])
        got = 0
        for k, record, bad in rows:
            sid = piece.first_sample_id + k
            got += 1
            if bad is None:
                ids.append(sid)
                records.append(record)
                sources.append(piece.source)
                continue
            skip = spec.skip(sid, bad.reason, bad.detail)
            if strict:
                raise BadSampleError(skip)
            skips.append(skip)
        if got != piece.num_rows:
            raise RuntimeError(
                f"{piece.path}: expected {piece.num_rows} rows from row {piece.start_row}, read {got}; "
                "did the file change after the windows were planned?"
            )
    return RawWindow(spec, np.asarray(ids, dtype=np.int64), records, skips, np.asarray(sources, dtype=np.int64))


Row = tuple[int, Any, "InvalidRecord | None"]


def _columnar_tables(spec: WindowSpec) -> dict[int, Any]:
    """piece position -> its table (or an InvalidRecord when its rows could not be decoded).

    The pieces of one file (and format) are read in one call; when that fails, piece by piece,
    so a corrupt row group costs its own rows only. An operating-system error (a missing file,
    no permission, an I/O error) is raised: it is not bad data."""
    by_file: dict[tuple[str, str], list[int]] = {}
    for i, p in enumerate(spec.pieces):
        if p.kind in ("parquet", "arrow"):
            by_file.setdefault((p.path, p.format), []).append(i)
    out: dict[int, Any] = {}
    for (path, fmt), positions in by_file.items():
        pieces = [spec.pieces[i] for i in positions]
        try:
            out.update(zip(positions, _read_pieces(path, fmt, pieces)))
        except _Undecodable as first:
            for i, piece in zip(positions, pieces):
                try:
                    out[i] = _read_pieces(path, fmt, [piece])[0] if len(pieces) > 1 else first.record
                except _Undecodable as e:
                    out[i] = e.record
    return out


class _Undecodable(Exception):
    def __init__(self, record: InvalidRecord) -> None:
        self.record = record


def _read_pieces(path: str, fmt: str, pieces: list[Piece]) -> list[Any]:
    try:
        return _read_columnar(path, pieces[0].kind, [(p.start_row, p.start_row + p.num_rows) for p in pieces], fmt)
    except Exception as e:  # a corrupt row group or batch: these rows are unreadable, not a crash
        if isinstance(e, OSError) and e.errno is not None:
            raise
        if not type(e).__module__.startswith("pyarrow") and not isinstance(e, (OSError, ValueError)):
            raise
        raise _Undecodable(InvalidRecord(UNREADABLE, f"{type(e).__name__}: {str(e)[:200]}")) from None


def _jsonl_rows(piece: Piece, parse: Callable[[Callable[[str], Any]], Any]) -> Iterator[Row]:
    with open(piece.path, "rb") as f:
        f.seek(piece.byte_offset)
        lines = islice(f, piece.start_row - piece.seek_row, None)
        for k, line in enumerate(islice(lines, piece.num_rows)):
            try:
                yield k, _parse_jsonl_line(line, parse, bom=k == 0 and piece.start_row == 0), None
            except InvalidRecord as bad:
                yield k, None, bad


class _JsonFields:
    """``get(key)`` over one JSON object, with ``keys()`` for messages."""

    def __init__(self, obj: dict) -> None:
        self._obj = obj

    def __call__(self, key: str) -> Any:
        return self._obj.get(key, MISSING)

    def keys(self) -> list[str]:
        return list(self._obj)


class _ColumnFields:
    """``get(key)`` over row ``i`` of decoded columns."""

    def __init__(self, values: dict[str, list], i: int) -> None:
        self._values, self._i = values, i

    def __call__(self, key: str) -> Any:
        value = self._values[key][self._i] if key in self._values else MISSING
        if isinstance(value, _NotUtf8):
            raise InvalidRecord(INVALID_UTF8, f"column {key!r}: {value.reason}")
        return value

    def keys(self) -> list[str]:
        return [k for k, v in self._values.items() if v[self._i] is not None]


class _NotUtf8:
    """A string cell whose bytes are not UTF-8 (Arrow does not check them on write or read)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _column_values(column: Any) -> list:
    """The column as Python values; a cell that is not UTF-8 becomes a ``_NotUtf8`` (its row is
    skipped if the record uses the column) instead of failing the whole piece."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        values = []
        for i in range(len(column)):
            try:
                values.append(column[i].as_py())
            except UnicodeDecodeError as e:
                values.append(_NotUtf8(f"byte {e.start} of a string is not UTF-8"))
        return values


def _parse_jsonl_line(line: bytes, parse: Callable[[Callable[[str], Any]], Any], *, bom: bool) -> Any:
    if not line.strip():
        raise InvalidRecord(BLANK_LINE, "blank line")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRecord(INVALID_UTF8, f"byte {e.start} of the line is not UTF-8") from None
    if bom and text.startswith("\ufeff"):
        text = text[1:]  # UTF-8 byte order mark at the start of the file
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InvalidRecord(MALFORMED_JSON, str(e)[:200]) from None
    if not isinstance(obj, dict):
        raise InvalidRecord(NOT_AN_OBJECT, f"a JSON {type(obj).__name__}, expected an object")
    return parse(_JsonFields(obj))


def _text_rows(piece: Piece) -> Iterator[Row]:
    for k, path in enumerate(piece.files):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            yield k, None, InvalidRecord(UNREADABLE, e.strerror or str(e))
            continue
        try:
            yield k, _parse_text_file(data), None
        except InvalidRecord as bad:
            yield k, None, bad


def _parse_text_file(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRecord(INVALID_UTF8, f"byte {e.start} of the file is not UTF-8") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text or text.isspace():
        raise InvalidRecord(EMPTY_FIELD, "the file holds no text")
    return text


def _columnar_rows(piece: Piece, parse: Callable[[Callable[[str], Any]], Any], table: Any) -> Iterator[Row]:
    if isinstance(table, InvalidRecord):
        for k in range(piece.num_rows):
            yield k, None, table
        return
    if table is None:
        return
    values = {name: _column_values(table.column(name)) for name in table.schema.names}
    for i in range(table.num_rows):
        try:
            yield i, parse(_ColumnFields(values, i)), None
        except InvalidRecord as bad:
            yield i, None, bad
