"""RowHub and Manifest: the right rows by global index, bounded memory, cheap restarts, clean ends.

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
import json
import threading
import time

import numpy as np
import pytest
from packfeed.client.rows import PAD_SAMPLE_ID, PackedRows, check_rows
from packfeed.service.delivery.assign import num_steps, step_rows
from packfeed.service.delivery.hub import PIECE_ROWS, ConsumerGone, HubClosed, RowHub
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


# -- the end of the stream, errors, shutdown --------------------------------------------------


def test_rows_past_the_end_are_not_returned():
    stream = SyntheticStream()
    hub = make_hub(stream, capacity=256)
    end = stream.total
    with hub.consumer(alive=alive_until()) as consumer:
        rows, total = consumer.rows(range(16))
        assert total is None, "the length is not known before the reader reaches the end"
        for start in range(16, end, 64):
            consumer.rows(range(start, start + 64))
        rows, total = consumer.rows(range(end - 5, end + 20, 3))
        assert total == end
        assert_rows(rows, range(end - 5, end, 3))
        assert consumer.rows(range(end, end + 4)) == (None, end)
        assert consumer.rows(range(end + 100, end + 200, 7)) == (None, end)
    hub.close()
    assert hub.manifest.total_rows == end


def test_empty_stream_ends_at_zero():
    stream = SyntheticStream((0, 0))
    hub = make_hub(stream, capacity=128)
    with hub.consumer(alive=alive_until()) as consumer:
        assert consumer.rows(range(4)) == (None, 0)
    hub.close()


def test_reader_error_reaches_every_waiting_consumer():
    error = ValueError("bad sample 4242 under --strict")
    stream = SyntheticStream(fail_at=400, error=error)
    hub = make_hub(stream, capacity=128)
    with hub.consumer(alive=alive_until()) as consumer:
        rows, _ = consumer.rows(range(64))  # rows before the bad one are served
        assert_rows(rows, range(64))
    # The reader pauses with a full buffer far before the bad row; then consumers ask past it.
    wait_for(lambda: hub.held_rows > 128 - PIECE_ROWS, what="the buffer to fill")
    assert stream.max_row_yielded < 352
    caught: list[BaseException] = []

    def wait_past_the_error(start):
        try:
            with hub.consumer(alive=alive_until()) as c:
                c.rows(range(start, start + 10))
        except BaseException as exc:  # noqa: BLE001
            caught.append(exc)

    # The failing block is rows 352..401 (window 5 from row 252, blocks of 50): never produced.
    threads = [threading.Thread(target=wait_past_the_error, args=(s,)) for s in (400, 450, 600)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    hub.close()
    assert [type(e) for e in caught] == [ValueError] * 3
    assert all(e is error for e in caught), caught


def test_rows_held_before_a_reader_error_are_still_served_and_the_error_is_reported_once():
    error = ValueError("lost a packing worker")
    stream = SyntheticStream(fail_at=400, error=error)
    reported: list[BaseException] = []
    hub = RowHub(stream.open_reader, Manifest("synthetic"), capacity=512, poll_s=0.01, on_error=reported.append)
    hub.start()  # no consumer: the reader fills the buffer up to the failing block
    wait_for(lambda: reported, what="the reader to fail")
    assert reported == [error] and hub.held_rows == 352  # rows 0..351 (blocks of 50 below 400)
    with hub.consumer(alive=alive_until()) as consumer:
        rows, total = consumer.rows(range(0, 352, 3))
        assert_rows(rows, range(0, 352, 3))
        assert total is None
        with pytest.raises(ValueError) as raised:
            consumer.rows(range(350, 360))  # 352.. never came
        assert raised.value is error
    hub.close()
    assert stream.opened == [(0, 0)]  # a failed reader is not restarted behind the server's back


def test_rows_below_the_buffer_after_a_reader_error_get_the_error_not_a_new_reader():
    error = ValueError("bad sample under --strict")
    stream = SyntheticStream(fail_at=400, error=error)
    reported: list[BaseException] = []
    hub = make_hub(stream, capacity=128, on_error=reported.append)  # no catch-up path (the trainer's feeder)
    with hub.consumer(alive=alive_until()) as consumer:
        for start in range(0, 320, 8):  # the buffer moves on: row 0 is evicted
            assert_rows(consumer.rows(range(start, start + 8))[0], range(start, start + 8))
        wait_for(lambda: reported, what="the reader to fail")
    with hub.consumer(alive=alive_until()) as late:
        with pytest.raises(ValueError) as raised:
            late.rows(range(0, 8))
    hub.close()
    assert raised.value is error and reported == [error]
    assert stream.opened == [(0, 0)]  # the failing pipeline is not run again from the start


def test_drain_wakes_waiting_consumers_with_hub_closed():
    gate = threading.Event()  # the reader blocks before its first block: nothing is ever produced
    stream = SyntheticStream(gate=gate)
    hub = make_hub(stream, capacity=128)
    outcome: list[BaseException] = []
    waiting = threading.Event()

    def wait_for_row():
        try:
            with hub.consumer(alive=alive_until()) as c:
                waiting.set()
                c.rows(range(4))
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    threads = [threading.Thread(target=wait_for_row) for _ in range(3)]
    for t in threads:
        t.start()
    waiting.wait(DEADLINE_S)
    wait_for(lambda: stream.opened, what="the reader to start")
    time.sleep(0.1)
    assert not outcome, "a consumer returned before any row was produced"
    hub.drain()
    for t in threads:
        t.join(DEADLINE_S)
    assert [type(e) for e in outcome] == [HubClosed] * 3
    with pytest.raises(HubClosed), hub.consumer() as late:
        late.rows(range(1))
    gate.set()
    hub.close()


def test_consumer_whose_call_ended_gets_consumer_gone():
    gate = threading.Event()
    stream = SyntheticStream(gate=gate)
    hub = make_hub(stream, capacity=128)
    call_active = threading.Event()
    call_active.set()
    outcome: list[BaseException] = []

    def wait_for_row():
        try:
            with hub.consumer(alive=call_active.is_set) as c:
                c.rows(range(4))
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    thread = threading.Thread(target=wait_for_row)
    thread.start()
    wait_for(lambda: stream.opened, what="the reader to start")
    time.sleep(0.1)
    assert thread.is_alive()
    call_active.clear()  # the client cancelled
    thread.join(DEADLINE_S)
    assert [type(e) for e in outcome] == [ConsumerGone]
    gate.set()
    # The hub still serves others.
    with hub.consumer(alive=alive_until()) as other:
        rows, _ = other.rows(range(4))
        assert_rows(rows, range(4))
    hub.close()


def test_capacity_below_two_pieces_is_refused():
    with pytest.raises(ValueError, match="capacity"):
        RowHub(SyntheticStream().open_reader, Manifest("k"), capacity=2 * PIECE_ROWS - 1)


# -- Manifest ---------------------------------------------------------------------------------


def test_manifest_locate_golden():
    m = Manifest("k")
    for window, first in ((2, 37), (5, 188), (3, 150)):
        m.record(window, first)
    assert m.locate(0) == (0, 0)
    assert m.locate(36) == (0, 0)
    assert m.locate(37) == (2, 37)
    assert m.locate(149) == (2, 37)
    assert m.locate(150) == (3, 150)
    assert m.locate(10_000) == (5, 188)


def test_manifest_round_trip_through_its_file(tmp_path):
    path = tmp_path / "state" / "m.json"
    m = Manifest("cfg-abc", path)
    assert m.first_row == {0: 0} and m.total_rows is None
    m.record(3, 120)
    m.record(7, 400)
    m.record_end(555)
    back = Manifest("cfg-abc", path)
    assert back.first_row == {0: 0, 3: 120, 7: 400}
    assert back.total_rows == 555
    assert back.locate(401) == (7, 400)
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.json"], "temporary files left behind"
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"key": "cfg-abc"} and len(lines) == 5  # a line per fact known
    m.record(7, 400)  # known: nothing written
    with open(path, "a") as f:
        f.write('{"w": 9, "r"')  # a server killed mid-line
    back = Manifest("cfg-abc", path)
    assert back.first_row == {0: 0, 3: 120, 7: 400} and back.total_rows == 555
    back.record(9, 700)  # appended after the torn line, read back
    assert Manifest("cfg-abc", path).locate(800) == (9, 700)


def test_a_manifest_of_another_stream_is_replaced_at_the_first_write(tmp_path):
    path = tmp_path / "m.json"
    Manifest("old", path).record(4, 100)
    m = Manifest("new", path)
    assert m.first_row == {0: 0}
    m.record(2, 50)
    assert Manifest("new", path).first_row == {0: 0, 2: 50} and Manifest("old", path).first_row == {0: 0}


def test_manifest_locate_matches_a_scan_over_many_windows():
    rng = np.random.default_rng(0)
    starts = np.concatenate([[0], np.cumsum(rng.integers(0, 5, 2000))])  # empty windows share a start
    m = Manifest("k")
    for window in rng.permutation(len(starts)):
        m.record(int(window), int(starts[window]))
    for row in range(0, int(starts[-1]) + 10, 7):
        window = max(w for w in range(len(starts)) if starts[w] <= row)
        assert m.locate(row) == (window, int(starts[window]))


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(json.dumps({"key": "other-config", "first_row": {"3": 120}, "total_rows": 555}), id="other-key"),
        pytest.param(json.dumps({"first_row": {"3": 120}, "total_rows": 555}), id="no-key"),
        pytest.param("{not json", id="corrupt"),
    ],
)
def test_manifest_file_for_another_stream_is_ignored(tmp_path, content):
    path = tmp_path / "m.json"
    path.write_text(content)
    m = Manifest("cfg-abc", path)
    assert m.first_row == {0: 0} and m.total_rows is None
    assert m.locate(500) == (0, 0)


def test_hub_records_window_starts_in_the_manifest(tmp_path):
    stream = SyntheticStream()
    path = tmp_path / "m.json"
    hub = make_hub(stream, capacity=256, manifest=Manifest("synthetic", path))
    read_ranks(hub, 2, 32, 0)
    hub.close()
    saved = Manifest("synthetic", path)
    # every window, the empty one too (it starts where the next one does)
    assert saved.first_row == dict(enumerate(stream.starts))
    assert saved.total_rows == stream.total


# -- far and idle consumers -----------------------------------------------------------------


def test_a_far_consumer_is_served_apart_and_never_moves_the_main_reader():
    """A peek at row 0 while another consumer reads far ahead: exact rows from the catch-up
    path, packed once and then cached; the main reader is never restarted."""
    stream = SyntheticStream()
    hub = make_hub(stream, capacity=128, pack_window=stream.pack_window)
    with hub.consumer(alive=alive_until()) as near:
        for start in range(0, 400, 16):
            rows, _ = near.rows(range(start, start + 16))
            assert_rows(rows, range(start, start + 16))
        assert hub.snapshot()["floor"] > 0, "the buffer has moved past row 0"
        for _ in range(3):  # three peeks at cursor 0, two ranks each
            for rank in range(2):
                with hub.consumer(alive=alive_until()) as peek:
                    rows, _ = peek.rows(range(rank, rank + 8, 2))
                    assert_rows(rows, range(rank, rank + 8, 2))
            rows, _ = near.rows(range(400, 416))  # the near consumer goes on undisturbed
            assert_rows(rows, range(400, 416))
        for start in range(416, stream.total, 16):
            rows, total = near.rows(range(start, min(start + 16, stream.total)))
            assert_rows(rows, range(start, min(start + 16, stream.total)))
    hub.close()
    assert hub.restarts == 0, "the far consumer moved the main reader"
    assert stream.opened == [(0, 0)]
    assert stream.packed == [0], "row 0's window is packed once, then served from the cache"
    assert hub.catchup_windows == 1


def test_catch_up_crosses_windows_and_learns_the_end():
    stream = SyntheticStream()
    hub = make_hub(stream, capacity=128, pack_window=stream.pack_window)
    with hub.consumer(alive=alive_until()) as near:
        rows, _ = near.rows(range(600, 608))  # the main reader runs past the start
        assert_rows(rows, range(600, 608))
        with hub.consumer(alive=alive_until()) as far:
            rows, _ = far.rows(range(30, 200, 5))  # windows 0 .. 3 (window 1 is empty)
            assert_rows(rows, range(30, 200, 5))
            rows, total = far.rows(range(stream.total - 3, stream.total + 5))
            assert_rows(rows, range(stream.total - 3, stream.total))
            assert total == stream.total
    hub.close()
    assert hub.reader_starts == 1 and hub.restarts == 0


def test_an_idle_consumer_stops_holding_the_reader_back():
    clock = [0.0]
    stream = SyntheticStream()
    hub = make_hub(stream, capacity=128, pack_window=stream.pack_window, idle_timeout_s=60, clock=lambda: clock[0])
    idle = hub.consumer(alive=alive_until())
    rows, _ = idle.rows(range(0, 4))  # then it stops asking
    assert_rows(rows, range(0, 4))
    with hub.consumer(alive=alive_until(3.0)) as busy:
        with pytest.raises(ConsumerGone):  # held back by the idle one: it cannot get past the buffer
            busy.rows(range(300, 304))
    clock[0] = 61.0  # the idle consumer has asked for nothing for longer than the timeout
    with hub.consumer(alive=alive_until()) as busy:
        rows, _ = busy.rows(range(300, 304))
        assert_rows(rows, range(300, 304))
    rows, _ = idle.rows(range(4, 8))  # it comes back: served, from the catch-up path
    assert_rows(rows, range(4, 8))
    idle.__exit__(None, None, None)
    hub.close()


def test_one_consumer_may_wait_in_two_calls_at_once():
    """A restarted trainer rank asks again while its old request still waits."""
    stream = SyntheticStream()
    hub = make_hub(stream, capacity=256)
    consumer = hub.consumer(alive=alive_until())
    results: dict[int, PackedRows] = {}

    def ask(start: int) -> None:
        results[start], _ = consumer.rows(range(start, start + 8))

    threads = [threading.Thread(target=ask, args=(s,)) for s in (100, 40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    consumer.__exit__(None, None, None)
    hub.close()
    for start in (100, 40):
        assert_rows(results[start], range(start, start + 8))


def test_a_step_at_the_end_waits_for_the_length_before_its_cursor_is_given():
    """11 rows, 2 ranks of 3 from cursor 6: rank 0's rows 6, 8, 10 exist before the end is known;
    answered then, its cursor was 12 and a resume from it was refused (past the end). The
    answer waits until row 11 exists or the length is known: 11."""
    stream = SyntheticStream((6, 5))
    reader_done = threading.Event()

    def open_reader(window, first_row):
        yield from stream.open_reader(window, first_row)
        reader_done.wait(DEADLINE_S)  # the last block is out; the end is not known yet

    hub = RowHub(open_reader, Manifest("synthetic"), capacity=128, poll_s=0.02)
    answer: list = []
    with hub.consumer(alive=alive_until()) as near, hub.consumer(alive=alive_until()) as rank0:
        rows, _ = near.rows(range(10, 11))  # every row is out
        assert_rows(rows, [10])
        wanted = step_rows(0, 2, 3, 6, 0)
        asker = threading.Thread(target=lambda: answer.append(rank0.rows(wanted.rows, through=wanted.cursor - 1)))
        asker.start()
        asker.join(0.3)
        assert not answer, "answered before the stream was known to reach row 11"
        reader_done.set()
        asker.join(DEADLINE_S)
    hub.close()
    rows, total = answer[0]
    assert_rows(rows, [6, 8, 10])
    assert total == 11 and step_rows(0, 2, 3, 6, 0, total).cursor == 11


def test_manifest_write_failure_is_logged_and_the_stream_goes_on(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the manifest's directory should be
    stream = SyntheticStream()
    hub = make_hub(stream, capacity=256, manifest=Manifest("synthetic", blocked / "m.json"))
    with pytest.raises(OSError):
        hub.manifest.check_writable()
    with caplog.at_level("WARNING", logger="packfeed"):
        got = read_ranks(hub, 1, 32, 0)
    hub.close()
    assert got[0] == list(range(stream.total))
    assert sum("cannot write the stream manifest" in r.message for r in caplog.records) == 1
