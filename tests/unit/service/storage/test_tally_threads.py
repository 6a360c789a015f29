"""A window's tally counts the requests made for it on other threads (pyarrow's I/O threads read
the Parquet column chunks of a file the window opened): ``StorageCounters.counting_for``."""

from __future__ import annotations

import threading

from packfeed.service.storage.retry import StorageCounters


def on_thread(fn) -> None:
    thread = threading.Thread(target=fn)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()


def test_a_request_on_another_thread_counts_in_the_tallies_handed_to_it_once():
    counters = StorageCounters()
    with counters.tally() as window, counters.tally() as outer:
        opened = counters.tallies()
        on_thread(lambda: counters.add(requests=1, bytes_read=10))  # not handed: the thread's own only

        def reader() -> None:
            with counters.counting_for(opened):
                counters.add(requests=1, bytes_read=100)
            counters.add(requests=1, bytes_read=1000)  # after the block: no longer for the window

        on_thread(reader)
        with counters.counting_for(opened):  # on the opener's own thread: counted once, not twice
            counters.add(requests=1, bytes_read=5)
    assert (window.counts.requests, window.counts.bytes_read) == (2, 105)
    assert (outer.counts.requests, outer.counts.bytes_read) == (2, 105)
    assert counters.tallies() == ()
    assert (counters.snapshot().requests, counters.snapshot().bytes_read) == (4, 1115)
