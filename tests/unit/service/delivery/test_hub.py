"""RowHub: the right rows by global index, bounded memory, cheap restarts, clean ends.

The hub is driven by a synthetic reader (support/streams.py) over a deterministic stream whose
every row is a function of its global index (``SyntheticStream.reference``), so any row the hub
returns can be checked against the truth without trusting the hub, ``select_rows`` or
``concat_rows``.
Windows have uneven sizes (an empty one, a one-row one, ones above PIECE_ROWS) and arrive in
blocks of BLOCK_ROWS rows, so reads cross window, block and piece boundaries.

Every wait on the hub has a deadline (``alive()`` turns False): a hub that stops making
progress fails the test with ConsumerGone instead of hanging it.
"""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest
from packfeed.client.rows import PAD_SAMPLE_ID, check_rows
from packfeed.service.delivery.assign import num_steps, step_rows
from packfeed.service.delivery.hub import PIECE_ROWS, RowHub
from packfeed.service.delivery.manifest import Manifest
from support.streams import BLOCK_ROWS, SEQ_LEN, WINDOW_ROWS, SyntheticStream, assert_rows

DEADLINE_S = 20.0  # generous: the machine is shared and noisy


def alive_until(seconds: float = DEADLINE_S):
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() < deadline


def wait_for(predicate, seconds: float = DEADLINE_S, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def make_hub(stream: SyntheticStream, capacity: int, manifest: Manifest | None = None, **kwargs) -> RowHub:
    return RowHub(stream.open_reader, manifest or Manifest("synthetic"), capacity=capacity, poll_s=0.02, **kwargs)


def read_ranks(hub: RowHub, world_size: int, batch_rows: int, cursor: int) -> dict[int, list[int]]:
    """Every rank of a world size read step after step, round robin in one thread, the way the
    server does (rows of a step, truncated at the end once the length is known). Checks every
    answer against the reference, and every step's cursor against the stream's true length;
    returns the real rows each rank got."""
    cursors: list[tuple[int, int, int]] = []  # (rank, step, the cursor its batch carries)
    got: dict[int, list[int]] = {k: [] for k in range(world_size)}
    consumers = [hub.consumer(alive=alive_until()) for _ in range(world_size)]
    done = [False] * world_size
    step = 0
    while not all(done):
        for k, consumer in enumerate(consumers):
            if done[k]:
                continue
            wanted = step_rows(k, world_size, batch_rows, cursor, step)
            rows, total = consumer.rows(wanted.rows, through=wanted.cursor - 1)
            if total is not None and step >= num_steps(world_size, batch_rows, cursor, total):
                done[k] = True
                consumer.__exit__(None, None, None)
                continue
            expected = [g for g in wanted.rows if total is None or g < total]
            assert_rows(rows, expected)
            step_cursor = wanted.cursor if total is None else step_rows(k, world_size, batch_rows, cursor, step, total).cursor
            cursors.append((k, step, step_cursor))
            got[k].extend(expected)
        step += 1
    past = [c for c in cursors if c[2] > hub.total_rows]
    assert not past, f"(rank, step, cursor) past the end {hub.total_rows}: {past[:3]}"
    return got


# -- the synthetic stream itself --------------------------------------------------------------


def test_synthetic_stream_follows_the_row_convention():
    stream = SyntheticStream()
    rows = SyntheticStream.reference(range(stream.total))
    check_rows(rows, SEQ_LEN)
    blocks = list(stream.open_reader(0, 0))
    assert [int(r) for _, b in blocks for r in b.row_index] == list(range(stream.total))
    assert stream.total > 2 * 256 and max(WINDOW_ROWS) > PIECE_ROWS and 0 in WINDOW_ROWS
    assert (rows.sample_ids == PAD_SAMPLE_ID).any() and (np.diff(rows.segment_splits) > 1).any()


# -- the right rows ----------------------------------------------------------------------------


def _live(world_size: int, batch_rows: int, capacity: int) -> bool:
    """Configurations the hub can serve whatever the piece boundaries: a step's rows plus the
    partial pieces at both ends (pieces here have at most BLOCK_ROWS rows) fit in the buffer
    (see test_small_buffer_does_not_deadlock)."""
    return world_size * batch_rows + 2 * (min(BLOCK_ROWS, PIECE_ROWS) - 1) <= capacity


SWEEP = [
    pytest.param(w, b, c, cap, id=f"w{w}-b{b}-c{c}-cap{cap}")
    for w, b, c, cap in itertools.product((1, 2, 3, 5), (1, 4, 16), (0, 7, 130, 701, sum(WINDOW_ROWS)), (128, 256))
    if _live(w, b, cap)
]


@pytest.mark.parametrize("world_size, batch_rows, cursor, capacity", SWEEP)
def test_strided_reads_return_the_stream_rows(world_size, batch_rows, cursor, capacity):
    stream = SyntheticStream()
    hub = make_hub(stream, capacity)
    try:
        got = read_ranks(hub, world_size, batch_rows, cursor)
    finally:
        hub.close()
    every = sorted(g for rows in got.values() for g in rows)
    assert every == list(range(cursor, stream.total)), "not every row from the cursor exactly once"
    for k, rows in got.items():
        assert all(g % world_size == k for g in rows), f"rank {k} got rows of another rank"
    assert hub.total_rows == stream.total
    assert hub.peak_held <= capacity
    assert hub.reader_starts == 1 and stream.opened == [(0, 0)], "one pass needs one reader"
    assert hub.restarts == 0 and hub.snapshot()["restarts"] == 0, "the first reader is no restart"


def test_concurrent_consumers_at_different_positions():
    stream = SyntheticStream()
    hub = make_hub(stream, capacity=512)
    groups = [(2, 8, 0), (3, 4, 96), (1, 16, 304), (4, 2, 640)]  # (world_size, batch_rows, cursor)
    results: dict[tuple[int, int], list[int]] = {}
    errors: list[BaseException] = []

    def run_rank(w, b, c, k):
        try:
            out = []
            with hub.consumer(alive=alive_until()) as consumer:
                for step in itertools.count():
                    wanted = step_rows(k, w, b, c, step)
                    rows, total = consumer.rows(wanted.rows)
                    if total is not None and step >= num_steps(w, b, c, total):
                        break
                    expected = [g for g in wanted.rows if total is None or g < total]
                    assert_rows(rows, expected)
                    out.extend(expected)
            results[(c, k)] = out
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run_rank, args=(w, b, c, k)) for w, b, c in groups for k in range(w)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S * 2)
    hub.close()
    assert not errors, errors
    assert len(results) == len(threads)
    for w, _, c in groups:
        every = sorted(g for k in range(w) for g in results[(c, k)])
        assert every == list(range(c, stream.total)), f"group world_size={w} cursor={c}"
    assert hub.peak_held <= 512


# -- memory bound -----------------------------------------------------------------------------


def test_stalled_consumer_stalls_the_reader_not_the_memory():
    stream = SyntheticStream()
    capacity = 128
    hub = make_hub(stream, capacity)
    stalled = hub.consumer()
    rows, _ = stalled.rows(range(1))  # registered at row 0, then never asks again
    assert_rows(rows, [0])
    fast_got: list[int] = []
    fast_error: list[BaseException] = []

    def fast():
        try:
            with hub.consumer(alive=alive_until()) as consumer:
                for start in range(0, stream.total, 16):
                    wanted = range(start, min(start + 16, stream.total))
                    rows, _ = consumer.rows(wanted)
                    assert_rows(rows, wanted)
                    fast_got.extend(wanted)
        except BaseException as exc:  # noqa: BLE001
            fast_error.append(exc)

    thread = threading.Thread(target=fast)
    thread.start()
    # The reader fills the buffer (no further piece fits) and pauses: nothing moves any more.
    wait_for(lambda: hub.held_rows > capacity - PIECE_ROWS, what="the buffer to fill")
    last = (hub.held_rows, stream.max_row_yielded)
    time.sleep(0.3)
    assert (hub.held_rows, stream.max_row_yielded) == last, "the reader kept going past a stalled consumer"
    assert capacity - PIECE_ROWS < hub.held_rows <= capacity
    assert hub.peak_held <= capacity
    # The pipeline was pulled at most one block past what the buffer holds.
    assert stream.max_row_yielded < capacity + BLOCK_ROWS
    assert max(fast_got, default=-1) < capacity, "the fast consumer got rows the buffer cannot hold"
    assert thread.is_alive() and not fast_error

    stalled.__exit__(None, None, None)  # the stalled consumer leaves: the fast one runs to the end
    thread.join(DEADLINE_S)
    hub.close()
    assert not fast_error, fast_error
    assert fast_got == list(range(stream.total))
    assert hub.peak_held <= capacity
    assert hub.reader_starts == 1 and hub.restarts == 0


def test_reader_without_consumers_fills_the_buffer_and_pauses():
    stream = SyntheticStream()
    hub = make_hub(stream, capacity=128)
    hub.start()
    wait_for(lambda: hub.held_rows > 128 - PIECE_ROWS, what="the buffer to fill")
    time.sleep(0.3)
    assert hub.held_rows <= 128 and hub.peak_held <= 128
    assert stream.max_row_yielded < 128 + BLOCK_ROWS
    hub.close()


def test_small_buffer_does_not_deadlock():
    # Steps straddling piece boundaries used to need more than capacity rows held: eviction
    # now trims the piece holding the lowest needed row. Windows of 70 and 200 rows: pieces [0,64) [64,70) [70,134) [134,198) [198,262) [262,270)
    # [270,334) ... A consumer of world size 1, batch_rows 64 (allowed by the server at
    # --buffer-rows 128) needs rows 256..319 at step 4: pieces [198,262) (still needed: it holds
    # 256..261), [262,270) and [270,334) = 136 rows > 128.
    stream = SyntheticStream((70, 200, 200), block_rows=1000)
    hub = make_hub(stream, capacity=128)
    try:
        with hub.consumer(alive=alive_until(2.0)) as consumer:
            for step in range(7):
                wanted = range(64 * step, min(64 * step + 64, stream.total))
                rows, _ = consumer.rows(wanted)
                assert_rows(rows, wanted)
    finally:
        hub.close()


def test_a_reader_waiting_for_room_goes_on_when_a_consumer_moves_on():
    # The reader of a full buffer must wake when a consumer's next request frees rows, not at
    # its next poll: with a poll of 60 s, one missed wake-up would outlast the deadline.
    stream = SyntheticStream((200,) * 8, block_rows=1000)
    hub = RowHub(stream.open_reader, Manifest("synthetic"), capacity=2 * PIECE_ROWS, poll_s=60.0)
    try:
        with hub.consumer(alive=alive_until()) as consumer:
            deadline = time.monotonic() + DEADLINE_S
            for start in range(0, stream.total, PIECE_ROWS // 2):
                wanted = range(start, min(start + PIECE_ROWS // 2, stream.total))
                rows, _ = consumer.rows(wanted)
                assert_rows(rows, wanted)
                assert time.monotonic() < deadline, f"stalled at row {start}: the reader missed a wake-up"
    finally:
        hub.close()


# -- restarts ---------------------------------------------------------------------------------


def test_rows_below_the_buffer_restart_the_reader_at_their_window(tmp_path):
    stream = SyntheticStream()
    manifest = Manifest("synthetic", tmp_path / "manifest.json")
    hub = make_hub(stream, capacity=192, manifest=manifest)
    with hub.consumer(alive=alive_until()) as first:
        for start in range(0, 608, 32):
            rows, _ = first.rows(range(start, start + 32))
            assert_rows(rows, range(start, start + 32))
    assert hub.reader_starts == 1 and hub.restarts == 0 and stream.opened == [(0, 0)]

    late_row = 300  # long evicted (the buffer holds 192 rows)
    window = stream.window_of(late_row)
    assert stream.starts[window] > 0 and window > 0, "the test needs a late window"
    with hub.consumer(alive=alive_until()) as late:
        rows, _ = late.rows(range(late_row, late_row + 24, 3))
        assert_rows(rows, range(late_row, late_row + 24, 3))
    assert hub.reader_starts == 2 and hub.restarts == 1 and hub.snapshot()["restarts"] == 1
    assert stream.opened == [(0, 0), (window, stream.starts[window])]
    wait_for(lambda: stream.closed >= 1, what="the superseded reader to be closed")
    hub.close()

    # A new hub (a restarted server) reading the persisted manifest starts there too, not at 0.
    stream2 = SyntheticStream()
    hub2 = make_hub(stream2, capacity=128, manifest=Manifest("synthetic", tmp_path / "manifest.json"))
    with hub2.consumer(alive=alive_until()) as resumed:
        rows, _ = resumed.rows(range(late_row, late_row + 2))
        assert_rows(rows, range(late_row, late_row + 2))
    hub2.close()
    assert stream2.opened == [(window, stream.starts[window])]
    assert hub2.reader_starts == 1 and hub2.restarts == 0, "a restarted server's first reader is no restart"


def test_a_consumer_ahead_of_the_reader_jumps_to_a_known_window(tmp_path):
    stream = SyntheticStream()
    path = tmp_path / "manifest.json"
    warm = make_hub(stream, capacity=512, manifest=Manifest("synthetic", path))
    read_ranks(warm, 1, 64, 0)  # learns every window's first row
    warm.close()

    stream2 = SyntheticStream()
    hub = make_hub(stream2, capacity=128, manifest=Manifest("synthetic", path))
    hub.start()  # the reader starts at row 0 and pauses with a full buffer
    wait_for(lambda: hub.held_rows > 128 - PIECE_ROWS, what="the buffer to fill")
    far = 600
    with hub.consumer(alive=alive_until()) as consumer:
        rows, total = consumer.rows(range(far, far + 8))
        assert_rows(rows, range(far, far + 8))
    hub.close()
    assert total == stream.total  # the manifest remembered the length
    window = stream2.window_of(far)
    assert stream2.opened == [(0, 0), (window, stream2.starts[window])]
    assert hub.reader_starts == 2 and hub.restarts == 1


# -- the snapshot (metrics and the status line) ----------------------------------------------


def test_a_consumer_ahead_of_the_reader_has_a_negative_lag_and_is_said_to_wait():
    """The lag (reader position - the consumer's first row) is negative while a consumer waits
    for rows not made yet: the status line must not call it "-40 rows behind"."""
    from packfeed.service.delivery.serve_run import consumers_status

    gate = threading.Event()  # holds the reader's first block back: nothing is produced yet
    stream = SyntheticStream(gate=gate)
    hub = make_hub(stream, capacity=128)
    assert hub.snapshot()["attached"] == 0 and consumers_status(0, 0) == "no consumer reading the buffer"
    got: list = []
    with hub.consumer(alive=alive_until()) as c:
        thread = threading.Thread(target=lambda: got.append(c.rows(range(40, 48))))
        thread.start()
        wait_for(lambda: hub.snapshot()["attached"] == 1, what="the consumer to wait")
        snap = hub.snapshot()
        assert snap["produced"] == 0 and snap["lags"] == {0: -40} and snap["max_lag"] == -40
        assert consumers_status(snap["attached"], snap["max_lag"]) == \
            "every consumer waiting for the reader (the nearest needs 41 more rows)"  # rows 0..40
        gate.set()
        thread.join(DEADLINE_S)
        assert_rows(got[0][0], range(40, 48))
        wait_for(lambda: hub.snapshot()["max_lag"] > 0, what="the reader to pass the consumer")
        snap = hub.snapshot()
        assert consumers_status(snap["attached"], snap["max_lag"]) == \
            f"slowest consumer {snap['produced'] - 40:,} rows behind the reader"
    hub.close()
