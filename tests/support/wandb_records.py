"""What a W&B run wrote to its ``run-<id>.wandb`` file, read with wandb's own record messages.

wandb 0.31 ships no Python reader of that file (its old ``sdk.internal.datastore`` is gone; the
Go service writes it). The format is LevelDB's log: a 7-byte header (``:W&B``, magic 0xBEE1,
version 0), then 32 KiB blocks of chunks, each ``crc32 (4) | length (2) | type (1) | data``,
type 1 a whole record, 2/3/4 its first, middle and last pieces. Each record is a
``wandb.proto.wandb_internal_pb2.Record``: a history row (``history``: the step and each
value as JSON under its key path), a summary update, the config, the run's exit.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

HEADER = struct.Struct("<4sHB")
CHUNK = struct.Struct("<IHB")
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert HEADER.unpack(data[:HEADER.size]) == (b":W&B", 0xBEE1, 0), "a W&B records file"
    records, pieces, pos = [], b"", HEADER.size
    while pos + CHUNK.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK.size:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = CHUNK.unpack(data[pos:pos + CHUNK.size])
        chunk = data[pos + CHUNK.size:pos + CHUNK.size + length]
        pos += CHUNK.size + length
        if kind == FULL:
            records.append(chunk)
        elif kind == FIRST:
            pieces = chunk
        elif kind == MIDDLE:
            pieces += chunk
        elif kind == LAST:
            records.append(pieces + chunk)
        else:
            break  # zeros: the end of what was written
    return records


def wandb_run(path: Path) -> dict[str, Any]:
    """{"history": {step: {key: value}}, "summary": {key: value} (the last update of each),
    "config": {key: value}, "exit_code": int or None} of a ``.wandb`` file."""
    from wandb.proto import wandb_internal_pb2 as pb

    run: dict[str, Any] = {"history": {}, "summary": {}, "config": {}, "exit_code": None}
    for raw in raw_records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            run["history"][record.history.step.num] = {
                "/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
        elif kind == "summary":
            run["summary"].update({"/".join(item.nested_key) or item.key: json.loads(item.value_json)
                                   for item in record.summary.update})
        elif kind == "config":
            run["config"].update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "exit":
            run["exit_code"] = record.exit.exit_code
    return run
