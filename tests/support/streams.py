"""A synthetic packed stream for the delivery tests (hub, servicer): every row a function of its
global index, so any row delivered can be checked against the truth.

``SyntheticStream.reference(indices)`` builds the true rows one by one (no ``select_rows``, no
``concat_rows``); ``open_reader`` and ``pack_window`` are the hub's reader and catch-up path
over the same rows; ``assert_rows`` compares delivered rows with the truth.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading

import numpy as np
from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID, PackedRows, positions_from_seq_lens

SEQ_LEN = 8
BLOCK_ROWS = 50  # the synthetic reader yields a window in blocks of this many rows
# 704 rows in 9 windows: one empty, one of a single row, several above PIECE_ROWS.
WINDOW_ROWS = (37, 0, 150, 1, 64, 203, 90, 129, 30)


class SyntheticStream:
    """A deterministic packed stream split into windows, and an ``open_reader`` over it.

    Row g has tokens g*L+1 .. g*L+L (unique across the stream), 1 to 3 segments of sizes drawn
    from a generator seeded by g, sometimes a padding tail, sample ids 10*g + k.

    ``opened`` lists every (window, first_row) the hub opened a reader at; ``max_row_yielded``
    is the highest global row any reader handed over (how far the hub pulled the pipeline);
    ``closed`` counts readers closed. ``fail_at`` raises ``error`` instead of yielding the block
    that holds that row; ``gate`` (an Event) holds every block back until it is set.

    The reader yields the window's true rows whatever ``first_row`` it is given: a hub that
    opens a window at the wrong row fails its own row_index check, and the test with it.
    """

    def __init__(self, window_rows=WINDOW_ROWS, *, block_rows=BLOCK_ROWS, fail_at: int | None = None,
                 error: BaseException | None = None, gate: threading.Event | None = None) -> None:
        self.window_rows = list(window_rows)
        self.starts = [0, *itertools.accumulate(self.window_rows)][:-1]
        self.total = sum(self.window_rows)
        self.block_rows = block_rows
        self.fail_at, self.error, self.gate = fail_at, error, gate
        self.opened: list[tuple[int, int]] = []
        self.packed: list[int] = []  # windows packed by the catch-up path
        self.max_row_yielded = -1
        self.closed = 0
        self._lock = threading.Lock()

    def window_of(self, row: int) -> int:
        """The (non-empty) window holding ``row``."""
        return max(w for w, (s, n) in enumerate(zip(self.starts, self.window_rows)) if n and s <= row)

    @staticmethod
    @functools.cache
    def reference_row(g: int) -> dict:
        rng = np.random.default_rng(g)
        k = int(rng.integers(1, 4))
        cuts = np.sort(rng.choice(np.arange(1, SEQ_LEN), size=k - 1, replace=False))
        lens = np.diff(np.concatenate([[0], cuts, [SEQ_LEN]])).astype(np.int32)
        ids = np.arange(g * SEQ_LEN + 1, (g + 1) * SEQ_LEN + 1, dtype=np.int32)
        labels = ids.copy()
        labels[np.cumsum(lens) - lens] = IGNORE_INDEX
        sample_ids = 10 * g + np.arange(k, dtype=np.int64)
        if k > 1 and g % 3 == 0:  # padding tail
            ids[SEQ_LEN - lens[-1]:] = 0
            labels[SEQ_LEN - lens[-1]:] = IGNORE_INDEX
            sample_ids[-1] = PAD_SAMPLE_ID
        return {
            "input_ids": ids,
            "labels": labels,
            "position_ids": positions_from_seq_lens(lens),
            "seq_lens": lens,
            "sample_ids": sample_ids,
            "row_index": g,
        }

    @classmethod
    def reference(cls, indices) -> PackedRows:
        """The rows ``indices`` built row by row (no select_rows, no concat_rows)."""
        per_row = [cls.reference_row(int(g)) for g in indices]
        return PackedRows.from_columns({name: [r[name] for r in per_row] for name in per_row[0]})

    def open_reader(self, window: int, first_row: int):
        with self._lock:
            self.opened.append((window, first_row))
        return self._read(window)

    def pack_window(self, window: int) -> PackedRows | None:
        """The catch-up path: one window's rows (row_index local), None past the last."""
        if window >= len(self.window_rows):
            return None
        with self._lock:
            self.packed.append(window)
        start, n = self.starts[window], self.window_rows[window]
        if n == 0:
            return PackedRows.from_columns(EMPTY_ROWS)
        rows = self.reference(range(start, start + n))
        return dataclasses.replace(rows, row_index=np.arange(n, dtype=np.int64))

    def _read(self, window: int):
        try:
            for w in range(window, len(self.window_rows)):
                start, stop = self.starts[w], self.starts[w] + self.window_rows[w]
                for a in range(start, stop, self.block_rows):
                    b = min(a + self.block_rows, stop)
                    if self.fail_at is not None and a <= self.fail_at < b:
                        raise self.error
                    if self.gate is not None:
                        self.gate.wait()
                    with self._lock:
                        self.max_row_yielded = max(self.max_row_yielded, b - 1)
                    yield w, self.reference(range(a, b))
                if start == stop:
                    yield w, PackedRows.from_columns(EMPTY_ROWS)  # an empty block
        finally:
            with self._lock:
                self.closed += 1


EMPTY_ROWS = {"input_ids": np.zeros((0, SEQ_LEN), np.int32), "labels": np.zeros((0, SEQ_LEN), np.int32),
              "position_ids": np.zeros((0, SEQ_LEN), np.int32), "seq_lens": [], "sample_ids": [], "row_index": []}


def assert_rows(got: PackedRows | None, indices) -> None:
    """``got`` holds exactly the reference rows ``indices``, in that order."""
    indices = list(indices)
    if not indices:
        assert got is None
        return
    assert got is not None, f"expected rows {indices[0]}..{indices[-1]}, got none"
    want = SyntheticStream.reference(indices)
    for name in ("row_index", "input_ids", "labels", "position_ids", "seq_lens", "sample_ids", "segment_splits"):
        a, b = getattr(got, name), getattr(want, name)
        if a.shape != b.shape or not np.array_equal(a, b):  # the fast check; the message on failure
            np.testing.assert_array_equal(a, b, err_msg=name)


def plain_rows(first: int, n: int, seq_len: int = 8) -> PackedRows:
    """Rows ``first`` .. ``first + n - 1`` of a simple stream: one sample per row, row r's ids
    r * seq_len + 1 ...: tests of what stores and reads rows (packed directories, streams)."""
    ids = np.arange(first * seq_len, (first + n) * seq_len, dtype=np.int32).reshape(n, seq_len) + 1
    return PackedRows(input_ids=ids, labels=ids.copy(),
                      position_ids=np.tile(np.arange(seq_len, dtype=np.int32), (n, 1)),
                      seq_lens=np.full(n, seq_len, np.int32), sample_ids=np.arange(first, first + n, dtype=np.int64),
                      segment_splits=np.arange(n + 1, dtype=np.int64), row_index=np.arange(first, first + n))


def write_plain_packed_dir(out, groups=(5, 3, 4), seq_len: int = 8) -> int:
    """A finished packed directory at ``out`` (a path or URI) of ``plain_rows``, one row group per
    write of ``groups`` rows; returns its number of rows."""
    from packfeed.service.packed.writer import ParquetRowWriter

    writer = ParquetRowWriter(out, seq_len=seq_len, config_hash="abc")
    first = 0
    for n in groups:
        writer.write(plain_rows(first, n, seq_len))
        first += n
    config = {"data": {"seq_len": seq_len, "tokenizer": "tok"}, "config_hash": "abc",
              "tokenizer": {"name": "tok", "pad_id": 0, "vocab_size": 99}, "plan": {"epochs": 1}}
    writer.close(config=config, stats={"rows": first, "epoch_rows": [first]}, status="complete")
    return first
