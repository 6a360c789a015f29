"""Packing actors that write their windows' Parquet part files themselves (``packfeed pack``).

::

    window k packed (rows local to k)  ->  its first global row, from the row ledger
                                       ->  part-<k>.parquet (rows numbered from it), by the actor
                                       ->  the driver gets (k, rows, file, stats), never rows

No single process touches every row: the actors write in parallel, each its own part files
(one per window that has rows, ``part_name``), and the driver only counts and writes the
metadata. A part file is a function of its window alone (its rows and its first global row),
so the output is byte-identical whatever the number of actors.

The row ledger: a window's first global row is the sum of the rows of the windows before it,
known only once they are packed. Each actor publishes, in Ray's GCS key-value store (no extra
process: a lookup is one GCS request), the end row of every window it packed (``end/<k>`` =
first row of k + its rows) and waits for ``end/<k-1>`` to number window k. Ray Data hands the
windows out in stream order, and an actor that writes holds one call at a time
(``max_tasks_in_flight_per_actor=1``: with several in flight an actor may start them in any
order, and window k could wait on k-1 queued behind it: measured, a hang), so every window
before a waiting one has started on some actor: the wait always ends, and lasts about as long
as the rest of a window started before its own. A
window a restarted actor packs again publishes the same value (the rows are deterministic).
When the driver packs windows too (its head start, head_start.py), each window is claimed
there first (``RowLedger.claim``: the first claim wins), the driver publishes the end of each
window it packed, and ``fail`` ends the wait on a window its packer could not pack. The keys
carry the run's id and are deleted at the end (``RowLedger.close``).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass

from packfeed.client.rows import PackedRows, check_rows, renumber_rows
from packfeed.service import storage
from packfeed.service.packed.writer import write_part

_NAMESPACE = "packfeed-row-ledger"
_FAILED = "failed: "  # a window's end key when its packer failed (``RowLedger.fail``)
_POLL_SECONDS = (0.001, 0.002, 0.005, 0.01, 0.02)  # then 0.02 s between looks


def part_name(window: int, num_windows: int) -> str:
    """The part file of ``window``: zero-padded to the width of the last window's number (at
    least 5 digits), so the files sort in stream order."""
    width = max(5, len(str(max(num_windows - 1, 0))))
    return f"part-{window:0{width}d}.parquet"


@dataclass(frozen=True)
class RowLedger:
    """The first global row of each window of one run (module docstring). ``first_window``
    starts at ``first_row``."""

    run_id: str
    first_window: int
    first_row: int

    @classmethod
    def new(cls, first_window: int = 0, first_row: int = 0) -> "RowLedger":
        return cls(uuid.uuid4().hex, first_window, first_row)

    def number(self, window: int, num_rows: int, *, timeout_s: float = 3600.0) -> int:
        """The first global row of ``window`` (of ``num_rows`` rows), once every window before
        it has been numbered; publishes where ``window`` ends for the next."""
        first = self.first_row
        if window > self.first_window:
            first = self._wait_for(self._key(window - 1), timeout_s)
        self.publish(window, first + num_rows)
        return first

    def claim(self, window: int, who: str) -> bool:
        """Whether ``who`` ("driver" or "actors") packs ``window``: the first to claim it does
        (head_start.py); the actors' claim holds for every actor (a retried window)."""
        from ray.experimental import internal_kv

        key = f"{self.run_id}/claim/{window}"
        if not internal_kv._internal_kv_put(key, who, overwrite=False, namespace=_NAMESPACE):
            return True  # no one had
        return internal_kv._internal_kv_get(key, namespace=_NAMESPACE) == who.encode()

    def publish(self, window: int, end_row: int) -> None:
        """Say that ``window`` ends at global row ``end_row`` (also the driver, for the windows
        it packed itself: head_start.py)."""
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(self._key(window), str(end_row), namespace=_NAMESPACE)

    def fail(self, window: int, why: str) -> None:
        """Say that ``window`` will never be numbered (its packer failed with ``why``): the
        window after it stops waiting, with an error naming it."""
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(self._key(window), _FAILED + why, namespace=_NAMESPACE)

    def _wait_for(self, key: str, timeout_s: float) -> int:
        from ray.experimental import internal_kv

        deadline, look = time.monotonic() + timeout_s, 0
        while (value := internal_kv._internal_kv_get(key, namespace=_NAMESPACE)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"packing: the window before {key} was not numbered in {timeout_s:g} s")
            time.sleep(_POLL_SECONDS[min(look, len(_POLL_SECONDS) - 1)])
            look += 1
        if value.startswith(_FAILED.encode()):
            raise RuntimeError(f"packing: the window before {key} failed: {value[len(_FAILED):].decode()}")
        return int(value)

    def _key(self, window: int) -> str:
        return f"{self.run_id}/end/{window}"

    def close(self) -> None:
        """Delete this run's keys (the driver, at the end of the run, also of a failed one: a
        failure to delete is left unsaid, the run's own error is the one to report)."""
        from ray.experimental import internal_kv

        with contextlib.suppress(Exception):
            if internal_kv._internal_kv_initialized():
                internal_kv._internal_kv_del(f"{self.run_id}/", del_by_prefix=True, namespace=_NAMESPACE)


@dataclass(frozen=True)
class PartSink:
    """Where and how the packing actors write their part files: the output ``out_dir`` (a path
    or a URI), the part files' metadata, the run's ``ledger`` and whether every row is checked
    against the row convention first (``validate``)."""

    out_dir: str
    seq_len: int
    config_hash: str
    num_windows: int
    ledger: RowLedger
    validate: bool = False
    driver_claims: bool = False  # the driver packs windows too: an actor claims each (head_start.py)

    def write(self, window: int, rows: PackedRows) -> tuple[str | None, tuple[float, float]]:
        """Number ``rows`` (window-local) globally and write them to the window's part file:
        (its name, None for a window without rows; the seconds spent numbering them, wall clock
        and this process's CPU: most of it waiting for the window before to be numbered)."""
        asked, asked_cpu = time.perf_counter(), time.process_time()
        first = self.ledger.number(window, rows.num_rows)
        numbering = (time.perf_counter() - asked, time.process_time() - asked_cpu)
        if not rows.num_rows:
            return None, numbering
        rows = renumber_rows(rows, first)
        if self.validate:
            check_rows(rows, self.seq_len)
        name = part_name(window, self.num_windows)
        write_part(storage.join(self.out_dir, name), rows, seq_len=self.seq_len, config_hash=self.config_hash)
        return name, numbering
