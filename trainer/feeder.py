"""RowFeeder: the one ordered reader of the packed stream, handing each rank its rows per step.

Ray Train's own dataset sharding (``streaming_split``) hands blocks to whichever worker asks
first, so which rank trains on which row is not reproducible, and a resumed run cannot know
which rows the interrupted one had consumed. packfeed instead reads the ordered Ray dataset
of ``PackedStream`` (packing still runs on its CPU actor pool) in ONE place, this actor, and
cuts it into steps with the pure plan of ``batches.StepLayout``. Every rank asks for
``(rank, step)`` and gets Arrow tables of its micro-batches; the answer is a function of the
stream only, so an interrupted-then-resumed run and an uninterrupted run train on the same
rows, step by step and rank by rank.

Data position: ``{"start_window": K, "rows": R}``: the stream restarted at the K-th window
of the seeded plan order, with its first R rows already consumed. ``position(step)`` gives it
for the end of ``step`` (whole windows behind it are folded into K), so resuming re-packs at
most the windows the step boundary falls in.

Cost: every row passes through this actor once (one Arrow copy into the object store per
micro-batch: ~0.4 MB for 8 rows of 4096 tokens), and a request blocks only until the packers
have produced the step's rows. The actor asks for no CPU.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import pyarrow as pa

from packfeed.service.config import DataConfig
from packfeed.trainer.batches import StepLayout

logger = logging.getLogger(__name__)


class RowFeeder:
    """Plain class (tests drive it directly); ``ray.remote(num_cpus=0)(RowFeeder)`` in a run.

    ``first_step``: the global step the run starts at (0, or the checkpoint's step when
    resuming); ``position``: the data position saved with that checkpoint (None: the start).
    ``tables``: an iterable of Arrow tables to read instead of building a PackedStream (tests).
    """

    def __init__(
        self,
        data: DataConfig,
        layout: StepLayout,
        *,
        packing: Any = None,
        first_step: int = 0,
        position: dict | None = None,
        tables: Any = None,
    ) -> None:
        import time

        self._started = time.perf_counter()
        self.layout = layout
        self.first_step = first_step
        position = position or {"start_window": 0, "rows": 0}
        self.start_window = int(position["start_window"])
        self._skip = int(position["rows"])
        self._stream = None
        if tables is None:
            from packfeed.service.pipeline import PackedStream, Scaling

            self._stream = PackedStream(data, scaling=packing or Scaling(), start_window=self.start_window)
            self._window_position = {w.index: self.start_window + i for i, w in enumerate(self._stream.windows)}
            tables = (
                self._stream.dataset.iter_batches(batch_size=None, batch_format="pyarrow")
                if self._stream.windows else iter(())
            )
        else:
            self._window_position = None
        self._tables = iter(tables)
        self._buffer: collections.deque[pa.Table] = collections.deque()
        self._buffered_rows = 0
        self._exhausted = False
        self._consumed = 0  # rows consumed from the stream start (skipped ones included)
        self._windows: list[list[int]] = []  # [window position, rows] in stream order
        self._consumed_after: dict[int, int] = {}
        self._steps: dict[int, list[list[pa.Table]]] = {}
        self._served: dict[int, set[int]] = {}
        self._next_step = first_step
        if self._skip:
            self._take(self._skip)

    # -- the stream -------------------------------------------------------------------------

    def _pull(self) -> bool:
        """Buffer one more table; False at the end of the stream."""
        if self._exhausted:
            return False
        try:
            table = next(self._tables)
        except StopIteration:
            self._exhausted = True
            return False
        if table.num_rows:
            self._record_windows(table)
            self._buffer.append(table)
            self._buffered_rows += table.num_rows
        return True

    def _record_windows(self, table: pa.Table) -> None:
        if "window" not in table.column_names:
            return
        for window in table.column("window").to_pylist():
            pos = self._window_position[window] if self._window_position else int(window)
            if self._windows and self._windows[-1][0] == pos:
                self._windows[-1][1] += 1
            else:
                self._windows.append([pos, 1])

    def _take(self, num_rows: int) -> pa.Table | None:
        """The next ``num_rows`` rows (fewer at the end of the stream; None when none are left)."""
        while self._buffered_rows < num_rows and self._pull():
            pass
        take = min(num_rows, self._buffered_rows)
        if take == 0:
            return None
        parts = []
        need = take
        while need:
            table = self._buffer.popleft()
            if table.num_rows > need:
                parts.append(table.slice(0, need))
                self._buffer.appendleft(table.slice(need))
                need = 0
            else:
                parts.append(table)
                need -= table.num_rows
        self._buffered_rows -= take
        self._consumed += take
        return pa.concat_tables(parts).combine_chunks()

    # -- steps ------------------------------------------------------------------------------

    def _plan(self, step: int) -> None:
        while self._next_step <= step:
            rows = self._take(self.layout.rows_per_step)
            micro = []
            for rank in range(self.layout.world_size):
                per_rank = []
                for m in range(self.layout.grad_accum):
                    sl = self.layout.micro_slice(rank, m)
                    per_rank.append(None if rows is None else rows.slice(sl.start, sl.stop - sl.start))
                micro.append(per_rank)
            self._steps[self._next_step] = micro if rows is not None else None
            self._served[self._next_step] = set()
            self._consumed_after[self._next_step] = self._consumed
            self._next_step += 1

    def get_step(self, rank: int, step: int) -> list[pa.Table] | None:
        """Rank ``rank``'s micro-batches of global step ``step`` (Arrow tables of at most
        ``micro_rows`` rows; empty or short ones at the end of the stream, to be completed with
        padding rows), or None when the stream has ended before this step."""
        if step < self.first_step:
            raise ValueError(f"step {step} is before this run's first step {self.first_step}")
        if step not in self._steps:
            if step < self._next_step:
                raise ValueError(f"rank {rank} asked for step {step} twice")
            self._plan(step)
        plan = self._steps[step]
        self._served[step].add(rank)
        if len(self._served[step]) == self.layout.world_size:
            del self._steps[step], self._served[step]
        if plan is None:
            return None
        return [t if t is not None and t.num_rows else None for t in plan[rank]]

    def position(self, step: int) -> dict:
        """The data position after global step ``step`` (already planned)."""
        consumed = self._consumed_after[step]
        start_window, before = self.start_window, 0
        for pos, rows in self._windows:
            if before + rows > consumed:
                break
            before += rows
            start_window = pos + 1
        return {"start_window": start_window, "rows": consumed - before}

    def packing_stats(self) -> dict:
        """Packing totals of the windows packed so far (empty for a test feeder)."""
        if self._stream is None:
            return {}
        import time

        seconds = time.perf_counter() - self._started
        return self._stream.stats().to_dict(seq_len=self._stream.config.seq_len, seconds=seconds)
