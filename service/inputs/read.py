"""Reading a window: its pieces (runs of rows of files) to records, and skips for bad rows.

Stage contract (docs/design.md)::

    WindowSpec ──read_window──▶ RawWindow      (in a packing actor; exactly the window's rows)

Which rows a window holds is decided by ``data/plan.py``; this module only reads them. Every
row goes to the parser of its format (records.py), which returns a record or an
``InvalidRecord`` that becomes a ``Skip`` naming the file, row and (JSONL) line; a JSONL line of
one of a format's common shapes is decoded straight into its record first (typed_records.py:
the parser's record, types checked by msgspec as it decodes), the parser taking the others.

Files are local paths or URIs, all read through fileio.py (its docstring gives the requests
and bytes on an object store). Cost: the JSONL pieces of one file are read by one cursor in
ranged chunks from their byte offsets (at most ``stride`` lines are passed over after a seek,
see scan.py), and only their lines are decoded; the Parquet row groups or Arrow batches a
window touches are decoded once for all its pieces of that file (columnar.py); a text piece
reads its files whole.

A piece carries the version of its file the plan saw (size, mtime, ETag; -1/None: unknown).
Reading a file that changed since is an error naming it, never rows of another version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import msgspec
import numpy as np

from packfeed.service import storage
from packfeed.service.inputs.columnar import read_columnar
from packfeed.service.inputs.fileio import LineRun, identity, read_line_runs, read_whole
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
from packfeed.service.inputs.typed_records import TYPED_DECODERS
from packfeed.service.storage.store_errors import DENIED, NOT_FOUND


# JSONL lines: msgspec's decoder, ~2x json.loads on 4 KB lines (bench/bench_tokenize.py's stage
# table: "read"). It gives json.loads's values for every line it accepts (Python ints of any
# size, the same floats and strings, the last of duplicate keys) and refuses the lines json.loads
# either accepts differently (NaN, 1e400, a lone surrogate escape) or refuses: those, and every
# line that is not an object, go through json.loads, so a skip keeps its reason and detail.
_decode_json = msgspec.json.Decoder().decode


@dataclass(frozen=True)
class Piece:
    """A run of consecutive rows of one file that a window holds.

    Row ``start_row + k`` of ``path`` has global sample id ``first_sample_id + k``. JSONL
    pieces carry ``byte_offset``, the offset of row ``seek_row`` <= ``start_row``: a reader
    seeks there and skips ``start_row - seek_row`` lines. A ``text`` piece groups consecutive
    one-document files: its row k is the whole file ``files[k]``.

    ``size``, ``mtime_ns`` and ``etag`` identify the version of ``path`` the plan saw (-1 or
    None: unknown, not compared); a text piece's are compared when it holds one file.
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
    end_offset: int = -1  # JSONL: no row of the piece reaches past this byte (-1: not known)
    files: tuple[str, ...] = ()
    size: int = -1
    mtime_ns: int = -1
    etag: str | None = None

    def expect(self) -> storage.ObjectInfo | None:
        """What ``path`` was when planned, for the read's check (None: nothing known)."""
        return identity(self.path, size=self.size, mtime_ns=self.mtime_ns, etag=self.etag)


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
            return Skip(sample_id, storage.display(piece.files[k]), 0, reason, detail)
        row = piece.start_row + k
        return Skip(sample_id, storage.display(piece.path), row, reason, detail,
                    row + 1 if piece.kind == "jsonl" else None)


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
    lines = _jsonl_lines(spec)
    for index, piece in enumerate(spec.pieces):
        parse = RECORD_PARSERS[piece.format]
        if piece.kind == "jsonl":
            rows = _jsonl_rows(piece, TYPED_DECODERS[piece.format], parse, lines.pop(index))
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
                f"{storage.display(piece.path)}: expected {piece.num_rows} rows from row {piece.start_row}, "
                f"read {got}; "
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
        return read_columnar(path, pieces[0].kind, [(p.start_row, p.start_row + p.num_rows) for p in pieces], fmt,
                             expect=pieces[0].expect())
    except Exception as e:  # a corrupt row group or batch: these rows are unreadable, not a crash
        if isinstance(e, storage.StorageError) or (isinstance(e, OSError) and e.errno is not None):
            raise  # the file is missing, changed or out of reach: not bad data
        if not type(e).__module__.startswith("pyarrow") and not isinstance(e, (OSError, ValueError)):
            raise
        raise _Undecodable(InvalidRecord(UNREADABLE, f"{type(e).__name__}: {str(e)[:200]}")) from None


def _jsonl_lines(spec: WindowSpec) -> dict[int, list[bytes]]:
    """piece position -> its lines, for the JSONL pieces: one cursor per file (fileio.py)."""
    by_file: dict[str, list[int]] = {}
    for i, p in enumerate(spec.pieces):
        if p.kind == "jsonl":
            by_file.setdefault(p.path, []).append(i)
    out: dict[int, list[bytes]] = {}
    for path, positions in by_file.items():
        pieces = [spec.pieces[i] for i in positions]
        runs = [LineRun(p.seek_row, p.byte_offset, p.start_row, p.num_rows, p.end_offset) for p in pieces]
        out.update(zip(positions, read_line_runs(path, runs, expect=pieces[0].expect())))
    return out


# A piece whose first TYPED_TRIAL lines the typed decode mostly refused (another shape, other
# fields beside text that is not ASCII) reads its other lines the general way alone.
TYPED_TRIAL = 16


def _jsonl_rows(piece: Piece, typed: Callable[[bytes], Any], parse: Callable[[Callable[[str], Any]], Any],
                lines: list[bytes]) -> Iterator[Row]:
    """Each line's record: decoded into its format's shape (typed_records.py), else the general
    way (``_parse_jsonl_line``), which gives every skip its reason and detail."""
    refused = 0
    for k, line in enumerate(lines):
        if k == TYPED_TRIAL and 2 * refused > TYPED_TRIAL:
            typed = _refuse
        record = typed(line)
        if record is not None:
            yield k, record, None
            continue
        refused += 1
        try:
            yield k, _parse_jsonl_line(line, parse, bom=k == 0 and piece.start_row == 0), None
        except InvalidRecord as bad:
            yield k, None, bad


def _refuse(line: bytes) -> None:
    return None


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
    try:  # msgspec decodes the bytes as they are; whatever it refuses, json.loads judges below
        obj = _decode_json(line)
    except (msgspec.DecodeError, ValueError, RecursionError):  # ValueError: a string that is not UTF-8
        obj = _json_object(line, bom=bom)
    else:
        if not isinstance(obj, dict):
            obj = _json_object(line, bom=bom)
    return parse(_JsonFields(obj))


def _json_object(line: bytes, *, bom: bool) -> dict:
    """The line's JSON object by the standard library (the reference), or the InvalidRecord that
    says why it is not one."""
    if not line or line.isspace():  # the same ASCII whitespace as bytes.strip, without copying the line
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
    return obj


def _text_rows(piece: Piece) -> Iterator[Row]:
    expect = piece.expect() if piece.files == (piece.path,) else None
    for k, path in enumerate(piece.files):
        try:
            data = read_whole(path, expect=expect)
        except storage.StorageError as e:
            if e.kind not in (NOT_FOUND, DENIED):
                raise  # changed since the plan, or the store out of reach: not bad data
            yield k, None, InvalidRecord(UNREADABLE, str(e).removeprefix(f"{e.uri}: "))
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
