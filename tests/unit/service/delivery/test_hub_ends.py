"""RowHub at its ends: rows past the end, an empty stream, a reader error reaching every consumer
(once), the drain and a consumer whose call ended. The synthetic stream and the helpers are
test_hub.py's."""

from __future__ import annotations

import threading
import time

import pytest
from packfeed.service.delivery.hub import PIECE_ROWS, ConsumerGone, HubClosed, RowHub
from packfeed.service.delivery.manifest import Manifest
from support.streams import SyntheticStream, assert_rows

from test_hub import DEADLINE_S, alive_until, make_hub, wait_for


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
