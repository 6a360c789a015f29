"""RowFeeder: the serve contract for Ray Train ranks, deterministic and resumable.

The feeder reads a synthetic stream (windows of known rows; every row's tokens encode its
global index) through the same RowHub as the server. Checked: every row exactly once per
world size with the k mod N rule and the tail padded; a resume from ``state(step)`` serves
exactly the rows an uninterrupted run serves, also with another world size or batch size; a
restarted rank that asks an earlier step again gets the same rows (Ray Train's restart after a
worker died); the state record is the client's ``state_dict()`` format; a stop (SIGTERM to the
driver) ends every rank after the same step, whichever steps the ranks had asked for.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from packfeed.client.rows import PAD_SAMPLE_ID, PackedRows
from packfeed.client.state import STATE_VERSION
from packfeed.service.delivery.assign import num_steps
from packfeed.service.delivery.manifest import Manifest
from packfeed.service.delivery.feeder import STOP, RowFeeder

SEQ_LEN, PAD_ID, HASH = 4, 0, "cafe"
# Rows per window, in stream order; window 2 is empty (every sample dropped).
WINDOW_ROWS = [5, 3, 0, 7, 1, 6]
TOTAL = sum(WINDOW_ROWS)


def rows_of(first: int, n: int) -> PackedRows:
    """n one-segment rows whose tokens are their global index + 1."""
    ids = np.repeat(np.arange(first + 1, first + n + 1, dtype=np.int32)[:, None], SEQ_LEN, axis=1)
    return PackedRows(
        input_ids=ids, labels=ids.copy(), position_ids=np.tile(np.arange(SEQ_LEN, dtype=np.int32), (n, 1)),
        seq_lens=np.full(n, SEQ_LEN, np.int32), sample_ids=np.arange(first, first + n, dtype=np.int64),
        segment_splits=np.arange(n + 1, dtype=np.int64), row_index=np.arange(first, first + n, dtype=np.int64),
    )


def open_reader(window: int, first_row: int):
    starts = np.concatenate(([0], np.cumsum(WINDOW_ROWS)))
    assert first_row == starts[window], "the hub opens windows at their first row"
    for w in range(window, len(WINDOW_ROWS)):
        yield w, rows_of(int(starts[w]), WINDOW_ROWS[w])


def feeder(world: int, accum: int, micro: int, state: dict | None = None, manifest: Manifest | None = None) -> RowFeeder:
    return RowFeeder(open_reader, manifest or Manifest("synthetic"), world_size=world, grad_accum=accum,
                     micro_rows=micro, seq_len=SEQ_LEN, pad_id=PAD_ID, config_hash=HASH, state=state, capacity=128)


def served(f: RowFeeder, first: int, last: int) -> dict:
    """(step, rank) -> the global rows it got, -1 for padding rows; None after the end."""
    out = {}
    for step in range(first, last):
        for rank in range(f.world_size):
            micro = f.get_step(rank, step)
            if micro is None:
                out[(step, rank)] = None
                continue
            assert len(micro) == f.grad_accum and all(m.num_rows == f.micro_rows for m in micro)
            rows = []
            for m in micro:
                for r in range(m.num_rows):
                    real = m.row_sample_ids(r)[0] != PAD_SAMPLE_ID
                    rows.append(int(m.input_ids[r, 0]) - 1 if real else -1)
                    if not real:
                        assert m.row_index[r] >= TOTAL, "a padding row carries an index past the end"
            out[(step, rank)] = rows
    return out


@pytest.mark.parametrize("world,accum,micro", [(2, 2, 1), (1, 1, 3), (3, 1, 2), (2, 3, 2)])
def test_every_row_once_by_index_mod_world_then_none(world, accum, micro):
    f = feeder(world, accum, micro)
    steps = num_steps(world, accum * micro, 0, TOTAL)
    out = served(f, 0, steps + 1)
    real = [g for step in range(steps) for rank in range(world) for g in out[(step, rank)] if g >= 0]
    assert sorted(real) == list(range(TOTAL)), "every row exactly once"
    for (step, rank), got in out.items():
        if got is not None:
            assert all(g % world == rank for g in got if g >= 0), "rank k gets the rows k mod N"
            assert got == sorted(got, key=lambda g: (g < 0, g)), "real rows first, in order, then padding"
    assert all(out[(steps, rank)] is None for rank in range(world)), "after the end every rank gets None"


@pytest.mark.parametrize("interrupt", range(1, 6))
def test_resume_from_state_serves_the_same_rows(interrupt):
    full = served(feeder(2, 1, 2), 0, 8)
    first = feeder(2, 1, 2)
    served(first, 0, interrupt)
    state = first.state(interrupt)
    assert set(state["stream"]) == {"version", "cursor", "step", "config_hash", "seq_len"}
    assert state["stream"]["version"] == STATE_VERSION and state["stream"]["step"] == interrupt
    manifest = Manifest("synthetic")
    for w, r in state["manifest"]["first_row"].items():
        manifest.record(int(w), r)
    resumed = feeder(2, 1, 2, state=state["stream"], manifest=manifest)
    assert served(resumed, interrupt, 8) == {k: v for k, v in full.items() if k[0] >= interrupt}


@pytest.mark.parametrize("world2,accum2,micro2", [(3, 1, 1), (1, 2, 2), (4, 1, 3)])
def test_resume_with_another_world_and_batch_size_is_exact(world2, accum2, micro2):
    first = feeder(2, 1, 2)
    before = served(first, 0, 2)
    got = [g for v in before.values() for g in v if g >= 0]
    resumed = feeder(world2, accum2, micro2, state=first.state(2)["stream"])
    after = served(resumed, 2, 2 + num_steps(world2, accum2 * micro2, first.state(2)["stream"]["cursor"], TOTAL) + 1)
    got += [g for v in after.values() if v is not None for g in v if g >= 0]
    assert sorted(got) == list(range(TOTAL)), "no row lost or repeated across the resume"


def test_a_restarted_rank_gets_the_same_rows_again():
    f = feeder(2, 1, 2)
    first = served(f, 0, 6)
    again = served(f, 2, 6)  # the worker group restarted from the checkpoint of step 2
    assert again == {k: v for k, v in first.items() if k[0] >= 2}


def test_state_caps_the_cursor_at_the_end():
    f = feeder(2, 2, 2)
    served(f, 0, 3)
    assert f.state(3)["stream"]["cursor"] == TOTAL


@pytest.mark.parametrize("field,value,message", [
    ("config_hash", "other", "trained on data config other, this run's is cafe"),
    ("seq_len", 8, "trained on rows of 8 tokens, this run's seq_len is 4"),
    ("version", 2, "unknown stream state version 2"),
    ("cursor", -1, "'cursor' must be an integer >= 0"),
])
def test_a_state_of_another_stream_or_a_bad_record_is_refused(field, value, message):
    state = {"version": STATE_VERSION, "cursor": 4, "step": 1, "config_hash": HASH, "seq_len": SEQ_LEN}
    feeder(2, 1, 1, state=state)  # the record itself resumes
    with pytest.raises(ValueError, match=message):
        feeder(2, 1, 1, state={**state, field: value})


def test_a_stop_ends_every_rank_after_the_same_step_whichever_steps_they_asked_for():
    """Ranks ask one step ahead, and not in step: the stop lands one past the highest step asked,
    so every rank still gets the rows of every step below it (the same rows as without a stop)
    and STOP from it on: all stop with the same completed-step count."""
    f, plain = feeder(3, 1, 2), served(feeder(3, 1, 2), 0, 3)
    asked = {0: 3, 1: 2, 2: 1}  # rank 0 holds steps 0-2, rank 1 steps 0-1, rank 2 step 0
    for rank, steps in asked.items():
        for step in range(steps):
            assert f.get_step(rank, step) not in (None, STOP)
    assert f.request_stop() == 3
    assert f.request_stop() == 3, "asking again moves nothing"
    for rank, steps in asked.items():
        rows = served_rank(f, rank, steps, 3)
        assert rows == {step: plain[(step, rank)] for step in range(steps, 3)}, "below the stop: rows, as before"
        assert f.get_step(rank, 3) == STOP and f.get_step(rank, 4) == STOP
    assert f.state(3)["stream"]["cursor"] == 3 * 3 * 2, "the checkpoint of the stop step resumes after it"


def test_a_stop_before_any_step_stops_every_rank_at_the_first_step():
    f = feeder(2, 1, 2, state=feeder(2, 1, 2).state(2)["stream"])  # a resumed run, first step 2
    assert f.request_stop() == 2
    assert [f.get_step(rank, 2) for rank in range(2)] == [STOP, STOP]


def test_a_step_being_fetched_when_the_stop_comes_is_still_served():
    """The feeder answers ranks concurrently: a request waiting for its rows has counted as
    asked, so the stop cannot fall below it (that rank would train a step the others skip)."""
    opened, gate = threading.Event(), threading.Event()

    def gated_reader(window: int, first_row: int):
        opened.set()
        gate.wait(30)
        yield from open_reader(window, first_row)

    f = RowFeeder(gated_reader, Manifest("synthetic"), world_size=2, grad_accum=1, micro_rows=2, seq_len=SEQ_LEN,
                  pad_id=PAD_ID, config_hash=HASH, capacity=128)
    got = {}
    waiting = threading.Thread(target=lambda: got.setdefault("rows", f.get_step(0, 0)))
    waiting.start()
    assert opened.wait(30), "rank 0's request reached the reader"
    assert f.request_stop() == 1
    gate.set()
    waiting.join(30)
    assert got["rows"] not in (None, STOP) and f.get_step(1, 0) not in (None, STOP)
    assert f.get_step(0, 1) == STOP and f.get_step(1, 1) == STOP


def served_rank(f: RowFeeder, rank: int, first: int, last: int) -> dict:
    """step -> the global rows rank ``rank`` got (as ``served``)."""
    out = {}
    for step in range(first, last):
        out[step] = [int(m.input_ids[r, 0]) - 1 if m.row_sample_ids(r)[0] != PAD_SAMPLE_ID else -1
                     for m in f.get_step(rank, step) for r in range(m.num_rows)]
    return out


@pytest.mark.parametrize("cursor,window", [(0, 0), (6, 1), (15, 4), (20, 5)])
def test_the_reader_starts_at_the_cursors_window_before_any_rank_asks(cursor, window):
    """The ranks take seconds to start (processes, imports, the model): the feeder packs meanwhile."""
    manifest = Manifest("synthetic")
    for w, first in enumerate(np.concatenate(([0], np.cumsum(WINDOW_ROWS)))[:-1]):
        manifest.record(w, int(first))
    opened = threading.Event()
    at: list[tuple[int, int]] = []

    def recording_reader(w: int, first_row: int):
        at.append((w, first_row))
        opened.set()
        yield from open_reader(w, first_row)

    state = {"version": STATE_VERSION, "cursor": cursor, "step": 1, "config_hash": HASH, "seq_len": SEQ_LEN}
    f = RowFeeder(recording_reader, manifest, world_size=1, grad_accum=1, micro_rows=1, seq_len=SEQ_LEN,
                  pad_id=PAD_ID, config_hash=HASH, state=state, capacity=128)
    assert opened.wait(10), "no rank asked, yet the reader started"
    assert at == [(window, int(np.cumsum([0] + WINDOW_ROWS)[window]))]
    assert served(f, 1, 2)[(1, 0)] == [cursor], "the first step's row, from the reader already running"
    assert f.hub.reader_starts == 1 and f.hub.restarts == 0, "the first request used the running reader"
