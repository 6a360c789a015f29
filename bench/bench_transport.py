"""Transport alone: packed batches already in memory, one gRPC server -> one client on loopback.

    python bench/bench_transport.py [--seconds 2] [--batch-rows 1 4 16 32 64] [--server-process]

Measures MB/s of row payload (the raw bytes fields of PackedBatch: ids, labels, positions,
segments, sample ids, row indices, flags), rows/s and CPU seconds per GB at seq_len 4096, the
client decoding every batch two ways: ``decode_batch_bytes`` as the stub's deserializer (views
into the buffer gRPC received) and the generated stub + ``decode_batch`` (views into
protobuf's bytes). Every batch is asserted to be a view (no copy). Reference, measured
in the same run on the same channel settings: a plain stream of opaque 1 MiB and 32 KiB bytes
messages. Goal (issue 4): >= 1 GB/s of row payload with batches of >= 16 rows.

The server (127.0.0.1, port 0, grpc.server + ThreadPoolExecutor) serves the generated
PackFeed service; by default in this process, with ``--server-process`` in a child process
(like ``packfeed serve`` and a trainer: two processes, no shared GIL). Rows are synthetic but
well-formed (random ids, 1-8 segments per row); the server pre-serialises one message per
batch size and sends it repeatedly, so what is timed is gRPC + (protobuf parse) + decode.
The host's other load skews MB/s; CPU s/GB does not depend on it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from concurrent import futures

import grpc
import numpy as np
from packfeed.client.rows import PackedRows, positions_from_seq_lens
from packfeed.client.transport import channel_options
from packfeed.client.v1 import packfeed_pb2, packfeed_pb2_grpc
from packfeed.client.wire import decode_batch, decode_batch_bytes, encode_batch

SEQ_LEN = 4096
MAX_MESSAGE = 256 * 1024 * 1024
# The channel settings packfeed's server and client use (large HTTP/2 frames and TCP reads:
# fewer slices per MiB; worth ~+10-30% on this box for 1 MiB+ messages, noisy).
OPTIONS = channel_options(max_receive=MAX_MESSAGE, max_send=MAX_MESSAGE)
RAW_METHOD = "/bench.Raw/Stream"
# The row payload: every raw-bytes column of PackedBatch (ids, labels, positions, segments, ...).
PAYLOAD_FIELDS = tuple(f.name for f in packfeed_pb2.PackedBatch.DESCRIPTOR.fields if f.type == f.TYPE_BYTES)


def synthetic_rows(num_rows: int, seq_len: int = SEQ_LEN, seed: int = 0) -> PackedRows:
    rng = np.random.default_rng(seed)
    lens_all, splits = [], [0]
    positions = np.empty((num_rows, seq_len), np.int32)
    for r in range(num_rows):
        cuts = np.sort(rng.choice(np.arange(1, seq_len), size=rng.integers(0, 8), replace=False))
        lens = np.diff(np.concatenate([[0], cuts, [seq_len]])).astype(np.int32)
        positions[r] = positions_from_seq_lens(lens)
        lens_all.append(lens)
        splits.append(splits[-1] + len(lens))
    ids = rng.integers(0, 50_000, size=(num_rows, seq_len), dtype=np.int32)
    k = splits[-1]
    return PackedRows(
        input_ids=ids,
        labels=np.where(positions == 0, -100, ids).astype(np.int32),
        position_ids=positions,
        seq_lens=np.concatenate(lens_all),
        sample_ids=rng.integers(0, 10**9, size=k, dtype=np.int64),
        segment_splits=np.array(splits, np.int64),
        row_index=np.arange(num_rows, dtype=np.int64),
    )


def payload_bytes(msg: packfeed_pb2.PackedBatch) -> int:
    return sum(len(getattr(msg, f)) for f in PAYLOAD_FIELDS)


STREAM_METHOD = "/packfeed.v1.PackFeed/StreamBatches"
PAYLOAD: dict[int, int] = {}  # batch rows -> row payload bytes per message


class _Servicer(packfeed_pb2_grpc.PackFeedServicer):
    """Streams one pre-serialised batch of request.batch_rows rows, request.cursor times."""

    def __init__(self):
        self._wire: dict[int, bytes] = {}

    def wire(self, batch_rows: int) -> bytes:
        if batch_rows not in self._wire:
            msg = encode_batch(synthetic_rows(batch_rows), cursor=batch_rows)
            self._wire[batch_rows] = msg.SerializeToString()
        return self._wire[batch_rows]

    def StreamBatches(self, request, context):
        data = self.wire(request.batch_rows)
        for _ in range(request.cursor):  # bench abuse: cursor = number of messages
            yield data


def _raw_stream(request: bytes, context):
    size, count = (int(x) for x in request.decode().split(","))
    data = b"\x01" * size
    for _ in range(count):
        yield data


def build_server(port: int = 0, options=None) -> tuple[grpc.Server, int]:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4), options=OPTIONS if options is None else options
    )
    servicer = _Servicer()
    # The generated add_PackFeedServicer_to_server serialises PackedBatch messages; here the
    # batches are already bytes, so the same method is registered with an identity serializer.
    handler = grpc.method_handlers_generic_handler(
        "packfeed.v1.PackFeed",
        {
            "StreamBatches": grpc.unary_stream_rpc_method_handler(
                servicer.StreamBatches,
                request_deserializer=packfeed_pb2.StreamRequest.FromString,
                response_serializer=None,
            )
        },
    )
    raw = grpc.method_handlers_generic_handler(
        "bench.Raw", {"Stream": grpc.unary_stream_rpc_method_handler(_raw_stream)}
    )
    server.add_generic_rpc_handlers((handler, raw))
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, port


def _serve_child(conn, options=None):
    server, port = build_server(options=options)
    conn.send(port)
    conn.recv()  # until the parent says stop
    server.stop(0)


SERVER_PID: list[int] = []  # the child server's pid, when --server-process


def cpu_seconds() -> np.ndarray:
    """[CPU time of this process (all threads), of the child server (Linux /proc) or 0]."""
    server = 0.0
    for pid in SERVER_PID:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        server += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return np.array([time.process_time(), server])


def time_rows(
    channel, batch_rows: int, seconds: float, *, from_bytes: bool
) -> tuple[float, float, np.ndarray]:
    """(payload MB/s, rows/s, CPU seconds per GB of payload [this process, child server]) for about
    ``seconds`` of streaming, decode included. The CPU figure does not depend on how busy
    the host is, the MB/s does.

    ``from_bytes``: the stub's deserializer is ``decode_batch_bytes`` (arrays are views into
    the buffer gRPC received); else the generated stub parses PackedBatch and ``decode_batch``
    views protobuf's bytes.
    """
    if from_bytes:
        call = channel.unary_stream(
            STREAM_METHOD,
            request_serializer=packfeed_pb2.StreamRequest.SerializeToString,
            response_deserializer=decode_batch_bytes,
        )
    else:
        stub_call = packfeed_pb2_grpc.PackFeedStub(channel).StreamBatches

        def call(request):
            return (decode_batch(msg) for msg in stub_call(request))

    per_msg = PAYLOAD[batch_rows]
    list(call(packfeed_pb2.StreamRequest(batch_rows=batch_rows, cursor=3)))  # warm up
    count = max(4, int(seconds * 1.0e9 / per_msg))
    t0, c0 = time.perf_counter(), cpu_seconds()
    rows = 0
    for batch, padding, _, _ in call(packfeed_pb2.StreamRequest(batch_rows=batch_rows, cursor=count)):
        assert not batch.input_ids.flags.owndata and not batch.labels.flags.writeable  # a view, no copy
        rows += batch.num_rows
    dt, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    return count * per_msg / dt / 1e6, rows / dt, cpu / (count * per_msg / 1e9)


def time_raw(channel, size: int, seconds: float) -> tuple[float, float]:
    """(MB/s, messages/s) of a plain stream of opaque ``size``-byte messages."""
    call = channel.unary_stream(RAW_METHOD)
    list(call(f"{size},3".encode()))
    count = max(4, int(seconds * 0.4e9 / size))
    t0 = time.perf_counter()
    nbytes = sum(len(m) for m in call(f"{size},{count}".encode()))
    dt = time.perf_counter() - t0
    return nbytes / dt / 1e6, count / dt


def _cpu(per_gb: np.ndarray) -> str:
    return f"{per_gb[0]:.2f} / {per_gb[1]:.2f}" if SERVER_PID else f"{per_gb.sum():.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="gRPC transport of packed batches, loopback")
    parser.add_argument("--seconds", type=float, default=2.0, help="target duration of each measurement")
    parser.add_argument("--batch-rows", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    parser.add_argument("--server-process", action="store_true", help="serve from a child process")
    args = parser.parse_args(argv)

    child = conn = None
    if args.server_process:
        conn, child_conn = mp.Pipe()
        child = mp.get_context("spawn").Process(target=_serve_child, args=(child_conn,), daemon=True)
        child.start()
        port, server = conn.recv(), None
        SERVER_PID.append(child.pid)
    else:
        server, port = build_server()
    where = "child process" if args.server_process else "same process"
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS) as channel:
            print(
                f"seq_len {SEQ_LEN}, server in {where}, loopback 127.0.0.1:{port}, ~{args.seconds:g}s per line"
            )
            print("| reference | msg size | MB/s | msgs/s |")
            print("| --- | ---: | ---: | ---: |")
            for size in (1 << 20, 32 << 10):
                mbs, mps = time_raw(channel, size, args.seconds)
                print(f"| opaque bytes | {size // 1024} KiB | {mbs:,.0f} | {mps:,.0f} |")
            print()
            print(
                "| batch rows | payload/msg | MB/s decode_batch_bytes | rows/s | CPU s/GB | MB/s pb stub + decode_batch | rows/s | CPU s/GB | goal (>= 1 GB/s at B >= 16) |"
            )
            print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
            for b in args.batch_rows:
                PAYLOAD[b] = payload_bytes(encode_batch(synthetic_rows(b), cursor=0))
                mbs, rps, cpu = time_rows(channel, b, args.seconds, from_bytes=True)
                mbs_pb, rps_pb, cpu_pb = time_rows(channel, b, args.seconds, from_bytes=False)
                goal = ("met" if max(mbs, mbs_pb) >= 1000 else "not met") if b >= 16 else "-"
                print(
                    f"| {b} | {PAYLOAD[b] / 2**20:.2f} MiB | {mbs:,.0f} | {rps:,.0f} | {_cpu(cpu)} "
                    f"| {mbs_pb:,.0f} | {rps_pb:,.0f} | {_cpu(cpu_pb)} | {goal} |"
                )
            print("\ndecode: zero-copy views (owndata False, read-only), asserted on every batch")
            print(
                "CPU s/GB: CPU seconds per GB of row payload, "
                + (
                    "client / server process; below 1.0 on each side, one free core each sustains >= 1 GB/s"
                    if args.server_process
                    else "client + server (one process)"
                )
            )
            print(
                f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other work on the box skews these numbers)"
            )
    finally:
        if server is not None:
            server.stop(0)
        if child is not None:
            conn.send("stop")
            child.join(5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
