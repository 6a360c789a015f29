"""Input readers and window planning: source files -> windows of raw, validated samples.

Stage contract (see ../shared/DESIGN.md)::

    inputs ──plan_windows──▶ [WindowSpec]      (driver, once; metadata and byte scans only)
    WindowSpec ──read_window──▶ RawWindow      (in an actor; reads exactly that window's rows)

Global sample ids. Every row of every input gets an id: its 0-based position in the inputs
read in the order given (file order, then row order), COUNTING rows that turn out bad. For
inputs ``a.jsonl`` (3 lines) and ``b.parquet`` (2 rows), the ids are a:0-2 and b:3-4; with
``window_samples=2`` the windows are [0,1], [2,3] (spanning both files) and [4].

Input kinds (a directory expands to its files sorted by name, not recursively; a glob expands
sorted):

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

Costs: planning scans JSONL bytes in 8 MiB chunks (``bytes.count``, ~GB/s) and reads only
Parquet/Arrow metadata; reading a window seeks straight to its first JSONL line or Parquet row
group and converts only the columns its format needs.
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .config import FORMATS
from .records import (
    BLANK_LINE,
    EMPTY_FIELD,
    INVALID_UTF8,
    MALFORMED_JSON,
    MISSING,
    NOT_AN_OBJECT,
    RECORD_PARSERS,
    BadSampleError,
    InvalidRecord,
    Skip,
)

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
}
_DETECT_MAX_LINES = 10_000
_SCAN_CHUNK = 8 << 20
_PARQUET_BATCH = 8192


# ---- data types ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """A run of consecutive rows of one source that falls inside one window.

    Row ``start_row + k`` of ``path`` has global sample id ``first_sample_id + k``. JSONL
    pieces carry the ``byte_offset`` of ``start_row`` so a reader seeks straight to it (-1 for
    other kinds). A ``text`` piece groups consecutive one-document files: its row k is the
    whole file ``files[k]`` (and ``path == files[0]``, ``start_row == 0``).
    """

    path: str
    kind: str
    format: str
    start_row: int
    num_rows: int
    first_sample_id: int
    byte_offset: int = -1
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class WindowSpec:
    """Window ``index`` covers sample ids ``first_sample_id .. first_sample_id + num_samples - 1``."""

    index: int
    first_sample_id: int
    num_samples: int
    pieces: tuple[Piece, ...]

    def piece_of(self, sample_id: int) -> Piece:
        for piece in self.pieces:
            if piece.first_sample_id <= sample_id < piece.first_sample_id + piece.num_rows:
                return piece
        raise KeyError(f"sample {sample_id} is not in window {self.index}")

    def locate(self, sample_id: int) -> tuple[str, int]:
        """(source file, 0-based row in it) of a sample of this window."""
        piece = self.piece_of(sample_id)
        k = sample_id - piece.first_sample_id
        if piece.kind == "text":
            return piece.files[k], 0
        return piece.path, piece.start_row + k


@dataclass
class RawWindow:
    """The good samples of one window, in sample-id order, and the skipped ones.

    ``records[i]`` (a ``str``, ``PromptCompletion`` or ``Conversation``: the type is the
    format) is sample ``sample_ids[i]``. Every id of the window is in exactly one of
    ``sample_ids`` and ``skips``.
    """

    spec: WindowSpec
    sample_ids: np.ndarray  # int64 [n]
    records: list[Any]
    skips: list[Skip] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)

    def bad_sample_error(self, skip: Skip) -> BadSampleError:
        """The strict-mode error for a skip found after reading (e.g. by the tokenizer)."""
        return BadSampleError(skip, line_numbers=self.spec.piece_of(skip.sample_id).kind == "jsonl")


# ---- input expansion -------------------------------------------------------------------------
def expand_inputs(inputs: Sequence[str]) -> list[tuple[str, str]]:
    """Resolve inputs to an ordered list of (file, kind). Order defines the global sample ids."""
    if isinstance(inputs, (str, bytes, os.PathLike)):
        inputs = [inputs]
    out: list[tuple[str, str]] = []
    for item in inputs:
        path = os.fspath(item)
        if os.path.isdir(path):
            out.extend(_expand_dir(path))
        elif os.path.isfile(path):
            out.append((path, _kind_of(path)))
        elif glob.has_magic(path):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                raise ValueError(f"input {path!r}: the glob matches no file")
            for m in matches:
                out.extend(_expand_dir(m) if os.path.isdir(m) else [(m, _kind_of(m))])
        else:
            raise ValueError(f"input {path!r} does not exist")
    return out


def _kind_of(path: str) -> str:
    kind = _KIND_OF_EXT.get(os.path.splitext(path)[1].lower())
    if kind is None:
        known = ", ".join(sorted(_KIND_OF_EXT))
        raise ValueError(f"input {path!r}: unknown file type; supported extensions: {known}")
    return kind


def _expand_dir(path: str) -> list[tuple[str, str]]:
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        with open(os.path.join(path, "dataset_dict.json")) as f:
            splits = json.load(f).get("splits", [])
        raise ValueError(
            f"input {path!r} is a Hugging Face DatasetDict with splits {splits}; point the input at "
            f"one split directory, e.g. {os.path.join(path, splits[0] if splits else 'train')!r}"
        )
    if os.path.isfile(os.path.join(path, "state.json")):
        with open(os.path.join(path, "state.json")) as f:
            state = json.load(f)
        files = [os.path.join(path, d["filename"]) for d in state.get("_data_files", [])]
        if not files:
            raise ValueError(f"input {path!r}: state.json lists no data files")
        return [(p, "arrow") for p in files]
    names = sorted(n for n in os.listdir(path) if not n.startswith((".", "_")))
    found = [
        (os.path.join(path, n), _KIND_OF_EXT[os.path.splitext(n)[1].lower()])
        for n in names
        if os.path.splitext(n)[1].lower() in _KIND_OF_EXT and os.path.isfile(os.path.join(path, n))
    ]
    if not found:
        raise ValueError(f"input directory {path!r} holds no supported file ({', '.join(sorted(_KIND_OF_EXT))})")
    return found


# ---- format detection ------------------------------------------------------------------------
def format_from_keys(keys: Sequence[str], source: str) -> str:
    """"messages" -> messages; "prompt"+"completion" -> prompt_completion; "text" -> text."""
    keys = set(keys)
    if "messages" in keys:
        return "messages"
    if "prompt" in keys and "completion" in keys:
        return "prompt_completion"
    if "text" in keys:
        return "text"
    raise ValueError(
        f"cannot detect the sample format of {source}: its first record has keys {sorted(keys)}; "
        "expected 'messages', 'prompt' + 'completion', or 'text' (or set format explicitly)"
    )


def detect_format(path: str, kind: str) -> str:
    if kind == "text":
        return "text"
    if kind in ("parquet", "arrow"):
        return format_from_keys(_schema_names(path, kind), path)
    with open(path, "rb") as f:
        for line in islice(f, _DETECT_MAX_LINES):
            try:
                obj = json.loads(line.decode("utf-8-sig"))
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict):
                return format_from_keys(list(obj), path)
    raise ValueError(
        f"cannot detect the sample format of {path}: no JSON object in its first "
        f"{_DETECT_MAX_LINES} lines (keys seen: none); a .json input must hold JSON Lines, one "
        "object per line; or set format explicitly"
    )


# ---- planning --------------------------------------------------------------------------------
def plan_windows(inputs: Sequence[str], *, window_samples: int, format: str = "auto") -> list[WindowSpec]:
    """Split the inputs into windows of ``window_samples`` consecutive global sample ids.

    Deterministic: the same files give the same plan. The last window may be shorter. Empty
    inputs contribute no ids. Cost: one byte scan of each JSONL file, metadata reads otherwise.
    """
    if not isinstance(window_samples, int) or window_samples < 1:
        raise ValueError(f"window_samples must be a positive integer, got {window_samples!r}")
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {format!r}")
    w = window_samples
    pieces: list[Piece] = []
    next_id = 0
    for path, kind in expand_inputs(inputs):
        if kind == "text" and format not in ("auto", "text"):
            raise ValueError(f"{path} is a plain-text file; it can only hold format 'text', not {format!r}")
        first_boundary = (-next_id) % w  # first row of this file that starts a window
        if kind == "jsonl":
            num_rows, row_offsets = _scan_jsonl(path, first_boundary, w)
        else:
            num_rows, row_offsets = _count_rows(path, kind), {}
        if num_rows == 0:
            continue
        fmt = format if format != "auto" else detect_format(path, kind)
        start = 0
        while start < num_rows:
            gid = next_id + start
            n = min(num_rows - start, w - gid % w)
            offset = (row_offsets[start] if start else 0) if kind == "jsonl" else -1
            pieces.append(Piece(path, kind, fmt, start, n, gid, offset))
            start += n
        next_id += num_rows
    return _group_windows(pieces, w)


def _group_windows(pieces: list[Piece], w: int) -> list[WindowSpec]:
    by_window: dict[int, list[Piece]] = {}
    for p in pieces:
        by_window.setdefault(p.first_sample_id // w, []).append(p)
    windows = []
    for index in sorted(by_window):
        merged = _merge_text_pieces(by_window[index])
        first = merged[0].first_sample_id
        total = sum(p.num_rows for p in merged)
        windows.append(WindowSpec(index, first, total, tuple(merged)))
    return windows


def _merge_text_pieces(pieces: list[Piece]) -> list[Piece]:
    """Consecutive one-document text files become one piece listing its files."""
    out: list[Piece] = []
    run: list[Piece] = []

    def flush() -> None:
        if run:
            files = tuple(p.path for p in run)
            out.append(Piece(files[0], "text", "text", 0, len(files), run[0].first_sample_id, -1, files))
            run.clear()

    for p in pieces:
        if p.kind == "text":
            run.append(p)
        else:
            flush()
            out.append(p)
    flush()
    return out


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
def _schema_names(path: str, kind: str) -> list[str]:
    import pyarrow as pa

    if kind == "parquet":
        import pyarrow.parquet as pq

        return list(pq.ParquetFile(path).schema_arrow.names)
    with pa.memory_map(path, "r") as source:
        try:
            return list(pa.ipc.open_file(source).schema.names)
        except pa.ArrowInvalid:
            source.seek(0)
            return list(pa.ipc.open_stream(source).schema.names)


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
                raise ValueError(f"{path}: not an Arrow IPC file or stream ({e})") from None
            yield from stream
        else:
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def _columnar_slices(piece: Piece) -> Iterator[Any]:
    """Tables/batches holding exactly rows [start_row, start_row + num_rows) of the piece."""
    lo, hi = piece.start_row, piece.start_row + piece.num_rows
    names = _schema_names(piece.path, piece.kind)
    columns = [c for c in _FORMAT_COLUMNS[piece.format] if c in names]
    if piece.kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(piece.path)
        row = 0
        for i in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(i).num_rows
            if row + n <= lo:  # skipped from the footer, nothing decoded
                row += n
                continue
            # decodes the row group's pages in batches up to the window's last row
            for batch in pf.iter_batches(batch_size=_PARQUET_BATCH, row_groups=[i], columns=columns):
                n = batch.num_rows
                if row + n > lo:
                    yield batch.slice(max(lo - row, 0), min(hi, row + n) - max(lo, row))
                row += n
                if row >= hi:
                    return
    else:
        row = 0
        for batch in _arrow_batches(piece.path):
            n = batch.num_rows
            if row + n > lo and row < hi:
                yield batch.select(columns).slice(max(lo - row, 0), min(hi, row + n) - max(lo, row))
            row += n
            if row >= hi:
                return


# ---- reading ---------------------------------------------------------------------------------
def read_window(spec: WindowSpec, *, strict: bool = False) -> RawWindow:
    """Read exactly the rows of ``spec``: good records with their ids, and a Skip for the rest.

    With ``strict=True`` the first bad row raises ``BadSampleError`` naming file and row.
    """
    ids: list[int] = []
    records: list[Any] = []
    skips: list[Skip] = []
    for piece in spec.pieces:
        parse = RECORD_PARSERS[piece.format]
        if piece.kind == "jsonl":
            rows = _jsonl_rows(piece, parse)
        elif piece.kind == "text":
            rows = _text_rows(piece)
        else:
            rows = _columnar_rows(piece, parse)
        got = 0
        for k, record, bad in rows:
            sid = piece.first_sample_id + k
            got += 1
            if bad is None:
                ids.append(sid)
                records.append(record)
                continue
            source, row = (piece.files[k], 0) if piece.kind == "text" else (piece.path, piece.start_row + k)
            skip = Skip(sid, source, row, bad.reason, bad.detail)
            if strict:
                raise BadSampleError(skip, line_numbers=piece.kind == "jsonl")
            skips.append(skip)
        if got != piece.num_rows:
            raise RuntimeError(
                f"{piece.path}: expected {piece.num_rows} rows from row {piece.start_row}, read {got}; "
                "did the file change after the windows were planned?"
            )
    return RawWindow(spec, np.asarray(ids, dtype=np.int64), records, skips)


Row = tuple[int, Any, "InvalidRecord | None"]


def _jsonl_rows(piece: Piece, parse: Callable[[Callable[[str], Any]], Any]) -> Iterator[Row]:
    with open(piece.path, "rb") as f:
        f.seek(piece.byte_offset)
        for k, line in enumerate(islice(f, piece.num_rows)):
            try:
                yield k, _parse_jsonl_line(line, parse, bom=k == 0 and piece.start_row == 0), None
            except InvalidRecord as bad:
                yield k, None, bad


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
    return parse(lambda key: obj.get(key, MISSING))


def _text_rows(piece: Piece) -> Iterator[Row]:
    for k, path in enumerate(piece.files):
        with open(path, "rb") as f:
            data = f.read()
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


def _columnar_rows(piece: Piece, parse: Callable[[Callable[[str], Any]], Any]) -> Iterator[Row]:
    k = 0
    for part in _columnar_slices(piece):
        values = {name: part.column(name).to_pylist() for name in part.schema.names}
        for i in range(part.num_rows):
            try:
                record = parse(lambda key: values[key][i] if key in values else MISSING)
            except InvalidRecord as bad:
                yield k, None, bad
            else:
                yield k, record, None
            k += 1
