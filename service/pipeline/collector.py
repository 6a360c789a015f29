"""Python's garbage collector around a packing process's windows.

A window allocates millions of small objects (the records' dicts and strings, quicktok's
pieces, the masks' lists) that reference counting frees; few of them form cycles. The
collector's automatic passes still run every 700 net allocations, and each full pass walks
every tracked object of the process (the tokenizers' tables, Ray's and the imported modules'
objects): for a window of 8,192 short chats, dozens of passes over hundreds of thousands of
objects, a fifth of the window's time.

So a packing process freezes what its set-up built (``freeze_setup``: those objects are never
walked again) and runs each window with the collector off (``collector_paused``); on the way
out one collection of the young generation frees the cycles the window left, so memory stays
what a window needs (a cycle through an older object waits for the next automatic full pass,
which still runs between windows).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


def freeze_setup() -> None:
    """Collect the set-up's garbage, then move every object alive (imports, tokenizers, plan)
    to the permanent generation, which no collection walks."""
    gc.collect()
    gc.freeze()


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside; on exit (an exception too) the collector is as it was
    and, if it was on, the objects allocated inside and still tracked are collected once
    (generation 0 holds them all: no pass ran to promote them)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)
