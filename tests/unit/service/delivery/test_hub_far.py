"""RowHub with far and idle consumers: the catch-up path serves a far consumer apart and never
moves the main reader, an idle consumer stops holding it back, one consumer in two calls, a step
at the end. The synthetic stream and the helpers are test_hub.py's."""

from __future__ import annotations

import threading

import pytest
from packfeed.client.rows import PackedRows
from packfeed.service.delivery.assign import step_rows
from packfeed.service.delivery.hub import ConsumerGone, RowHub
from packfeed.service.delivery.manifest import Manifest
from support.streams import SyntheticStream, assert_rows

from test_hub import DEADLINE_S, alive_until, make_hub


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
