"""Which packed rows each rank trains on at each step: a pure, deterministic plan.

The packed stream is ordered (``PackedStream`` preserves the plan order), so a step is a run
of consecutive rows: step j of a run takes the next ``world_size * grad_accum * micro_rows``
rows, and rank k's micro-batch m is the ``micro_rows`` rows at offset
``(k * grad_accum + m) * micro_rows`` of that run. Which row lands on which rank at which step
depends only on the stream and these three numbers, so a run resumed from "C rows consumed"
sees exactly the rows an uninterrupted run sees.

At the end of the stream the last step is completed with all-padding rows (labels all
IGNORE_INDEX, sample id PAD_SAMPLE_ID): every rank runs the same number of micro-batches (DDP
needs it), no row is dropped and nothing hangs.

Worked example, world 2, grad_accum 2, micro_rows 3: a step is 12 rows; rank 1's micro-batch
0 is rows 6..8 of the step, micro-batch 1 rows 9..11.
"""

from __future__ import annotations

from dataclasses import dataclass

from packfeed.client.rows import PackedRows, concat_rows, padding_rows


@dataclass(frozen=True, kw_only=True)
class StepLayout:
    world_size: int
    grad_accum: int
    micro_rows: int

    def __post_init__(self) -> None:
        for name in ("world_size", "grad_accum", "micro_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def rows_per_step(self) -> int:
        return self.world_size * self.grad_accum * self.micro_rows

    def micro_slice(self, rank: int, micro: int) -> slice:
        """Rows of (rank, micro) within the step's run of rows."""
        start = (rank * self.grad_accum + micro) * self.micro_rows
        return slice(start, start + self.micro_rows)


def fill_micro_batch(rows: PackedRows | None, micro_rows: int, seq_len: int, pad_id: int) -> PackedRows:
    """``rows`` completed to exactly ``micro_rows`` rows with padding rows."""
    have = 0 if rows is None else rows.num_rows
    if have > micro_rows:
        raise ValueError(f"a micro-batch holds {micro_rows} rows, got {have}")
    if have == micro_rows:
        return rows
    pad = padding_rows(micro_rows - have, seq_len, pad_id)
    return pad if rows is None or have == 0 else concat_rows([rows, pad])
