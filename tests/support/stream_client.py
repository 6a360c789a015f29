"""One rank of a training loop over ``packfeed serve``, as a process that can be SIGKILLed.

    cd tests && python -m support.stream_client HOST:PORT --rank R --world-size N --batch-rows B --state FILE

Each batch is "processed" (its rows recorded) and then the stream state and everything
processed so far are saved together, atomically (write a temporary file, ``os.replace``), to
FILE, and ``saved <batches>`` is printed. Killed at any instant, FILE holds a consistent pair:
the rows processed and the cursor to resume after them. Started again with the same FILE, it
resumes from that state. When the stream ends the file gets ``"done": true``.

``CLIENT`` is that command line (run it with ``cwd=TESTS``: ``support`` a package there, as under
pytest, and no module of this folder in the way of a top-level import); ``row_records`` and
``row_digest`` are also used in-process by tests/integration/serve/test_serve_failures.py,
serve/test_mixture_online.py and pack/test_mixture_e2e.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from packfeed.client.rows import PAD_SAMPLE_ID, PackedRows
from packfeed.client.stream import Batch, PackedStream

TESTS = Path(__file__).resolve().parents[1]
CLIENT = (sys.executable, "-m", "support.stream_client")


def row_digest(rows: PackedRows, r: int) -> str:
    """Hash of everything row ``r`` carries: tokens, labels, positions and its segments."""
    h = hashlib.sha256()
    for column in (rows.input_ids[r], rows.labels[r], rows.position_ids[r], rows.row_seq_lens(r), rows.row_sample_ids(r)):
        h.update(column.tobytes())
    return h.hexdigest()[:20]


def row_records(batch: Batch) -> tuple[list[list], list[int]]:
    """([row_index, digest, sample ids of its real segments] per real row, row indices of the
    flagged padding rows) of one batch, JSON-able."""
    real, padding = [], []
    for r in range(batch.num_rows):
        index = int(batch.row_index[r])
        if batch.padding_rows[r]:
            padding.append(index)
        else:
            sids = batch.rows.row_sample_ids(r)
            real.append([index, row_digest(batch.rows, r), [int(s) for s in sids if s != PAD_SAMPLE_ID]])
    return real, padding


def save_atomic(path: Path, record: dict) -> None:
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--batch-rows", type=int, required=True)
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--step-seconds", type=float, default=0.0, help="simulated work per batch")
    args = p.parse_args(argv)

    record = {"stream": None, "rows": [], "padding": [], "steps": [], "batches": 0, "done": False, "runs": 0}
    if args.state.exists():
        record = json.loads(args.state.read_text())
    record["runs"] += 1
    stream = PackedStream(args.target, rank=args.rank, world_size=args.world_size, batch_rows=args.batch_rows,
                          state=record["stream"])
    with stream:
        for batch in stream:
            real, padding = row_records(batch)  # the "training step"
            time.sleep(args.step_seconds)
            record["rows"] += real
            record["padding"] += padding
            record["steps"].append([batch.step, batch.cursor])
            record["batches"] += 1
            record["stream"] = stream.state_dict()
            save_atomic(args.state, record)
            print(f"saved {record['batches']}", flush=True)
        record["done"] = True
        save_atomic(args.state, record)
    print(f"done reconnects={stream.reconnects}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
