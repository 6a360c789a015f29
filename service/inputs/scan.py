"""Scanning input files: each file's row count and, for JSONL, the byte offsets to seek to.

Stage contract (docs/design.md)::

    (file, kind) ──scan_file──▶ FileScan      (driver, once per file; see data/plan.py)

Cost: counting JSONL rows reads the file once in 8 MiB chunks (``bytes.count`` on newlines,
~GB/s) and finds seek offsets with numpy only in the chunks that hold a wanted row; Parquet and
Arrow give their counts from metadata (the Parquet footer, the IPC batches' lengths). The
offsets kept are one per ``stride`` rows: 16 bytes per seek point.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from packfeed.service.inputs.columnar import count_columnar_rows
from packfeed.service.inputs.fileio import input_size, open_input

_SCAN_CHUNK = 8 << 20
MAX_SEEK_STRIDE = 4096  # rows between JSONL seek points when blocks are larger (or off)


@dataclass(frozen=True)
class FileScan:
    """A file's row count and, for JSONL, byte offsets of some rows (``seek_rows`` ascending,
    row 0 always among them) so a reader can seek close to any row."""

    path: str
    kind: str
    num_rows: int
    seek_rows: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    seek_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))


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
        if input_size(path) == 0:  # an export never finished: no rows (the plan warns), not a corrupt file
            return FileScan(path, kind, 0)
        return FileScan(path, kind, 1 if kind == "text" else count_columnar_rows(path, kind))
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
    with open_input(path) as f:
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
