"""``packfeed serve --balance compute`` in-process: ``PackFeedService`` over a RowHub of the
synthetic stream (rows of 1 to 3 segments, so of different attention work), one thread per
rank as gRPC runs them.

Checked: each step's ranks together receive exactly the step's rows of balance "off" (same
cursor, same padding count), every row of the stream exactly once; each rank's batch is the
train feeder's answer for the same (N, B, grad_accum) (one function, two callers); the rows
served and resent are counted per world size group; a batch_rows that does not split into the
server's micro-batches is refused.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from packfeed.client.rows import concat_rows
from packfeed.client.state import StreamState
from packfeed.client.v1 import packfeed_pb2
from packfeed.client.wire import decode_batch_bytes
from packfeed.service.delivery.assign import num_steps, step_rows
from packfeed.service.delivery.feeder import RowFeeder
from packfeed.service.delivery.hub import RowHub
from packfeed.service.delivery.manifest import Manifest
from packfeed.service.delivery.row_stream import RowStream
from packfeed.service.delivery.server import PackFeedService
from support.streams import SEQ_LEN, WINDOW_ROWS, SyntheticStream

PAD_ID, HASH, TOTAL = 0, "cafe", sum(WINDOW_ROWS)
TIMEOUT_S = 60.0


class Context:
    def abort(self, code, details):
        raise grpc.RpcError(f"{code.name}: {details}")

    def is_active(self) -> bool:
        return True

    def peer(self) -> str:
        return "ipv4:127.0.0.1:40000"


@pytest.fixture
def service_of():
    hubs = []

    def make(balance: str, micro_batches: int = 1) -> PackFeedService:
        stream = SyntheticStream()
        meta = RowStream(
            config_hash=HASH, seq_len=SEQ_LEN, tokenizer_name="synthetic", vocab_size=SEQ_LEN * TOTAL + 1,
            pad_id=PAD_ID, epochs=1, windows_per_epoch=len(WINDOW_ROWS),
            sources=[{"name": "synthetic", "rows": TOTAL, "samples_per_epoch": 2 * TOTAL, "planned_share": 1.0}],
            samples_per_epoch=2 * TOTAL, manifest_key="synthetic", open_reader=stream.open_reader,
            pack_window=stream.pack_window)
        hub = RowHub(stream.open_reader, Manifest("synthetic"), capacity=256, pack_window=stream.pack_window,
                     poll_s=0.01)
        hubs.append(hub)
        return PackFeedService(hub, meta, max_batch_rows=64, balance=balance, micro_batches=micro_batches)

    yield make
    for hub in hubs:
        hub.close()


def streamed(service: PackFeedService, world: int, batch_rows: int, cursor: int) -> list[list]:
    """[rank][step] decoded batches, every rank a thread."""
    def one(rank: int) -> list:
        req = packfeed_pb2.StreamRequest(rank=rank, world_size=world, batch_rows=batch_rows, cursor=cursor)
        return [decode_batch_bytes(m) for m in service.stream_batches(req.SerializeToString(), Context())]

    with ThreadPoolExecutor(max_workers=world) as pool:
        return [f.result(timeout=TIMEOUT_S) for f in [pool.submit(one, rank) for rank in range(world)]]


def real_indices(batch) -> list[int]:
    return [int(i) for i, pad in zip(batch.rows.row_index, batch.padding_rows) if not pad]


@pytest.mark.parametrize("world,micro_batches,batch_rows,cursor", [(3, 1, 2, 0), (4, 2, 2, 7), (2, 2, 4, 130),
                                                                   (5, 1, 1, 0)])
def test_compute_serves_the_steps_of_off_exactly_once(service_of, world, micro_batches, batch_rows, cursor):
    on = streamed(service_of("compute", micro_batches), world, batch_rows, cursor)
    off = streamed(service_of("off"), world, batch_rows, cursor)
    steps = num_steps(world, batch_rows, cursor, TOTAL)
    every = []
    for step in range(steps):
        got = sorted(i for rank in range(world) for i in real_indices(on[rank][step]))
        assert got == list(step_rows(0, 1, world * batch_rows, cursor, step, TOTAL).rows), step
        assert {on[r][step].cursor for r in range(world)} == {off[0][step].cursor}
        assert sum(on[r][step].padding_rows.sum() for r in range(world)) == sum(
            off[r][step].padding_rows.sum() for r in range(world))
        every += got
    assert all(len(on[r]) == steps for r in range(world))
    assert every == list(range(cursor, TOTAL)), "every row exactly once"
    truth = SyntheticStream.reference(range(cursor, TOTAL))
    for rank in range(world):
        for batch in on[rank]:
            for pos, index in enumerate(batch.rows.row_index):
                if not batch.padding_rows[pos]:
                    assert (batch.rows.input_ids[pos] == truth.input_ids[index - cursor]).all()


def test_each_rank_gets_the_feeders_answer(service_of):
    world, accum, micro, cursor = 3, 2, 2, 11
    served = streamed(service_of("compute", accum), world, accum * micro, cursor)
    feeder = RowFeeder(SyntheticStream().open_reader, Manifest("synthetic"), world_size=world, grad_accum=accum,
                       micro_rows=micro, seq_len=SEQ_LEN, pad_id=PAD_ID, config_hash=HASH,
                       state=StreamState(cursor=cursor).to_dict(), balance="compute")
    try:
        for rank in range(world):
            for step, batch in enumerate(served[rank]):
                fed = concat_rows(feeder.get_step(rank, step))
                np.testing.assert_array_equal(batch.rows.row_index, fed.row_index)
                np.testing.assert_array_equal(batch.rows.input_ids, fed.input_ids)
    finally:
        feeder.hub.close()


def test_rows_served_once_per_group_then_resent(service_of):
    service = service_of("compute")
    streamed(service, 3, 2, 0)
    assert (service.rows_served, service.rows_resent) == (TOTAL, 0)
    streamed(service, 3, 2, 0)  # the group read it all again (a restart from cursor 0)
    assert (service.rows_served, service.rows_resent) == (TOTAL, TOTAL)
    streamed(service, 2, 2, 100)  # another world size is another group
    assert (service.rows_served, service.rows_resent) == (2 * TOTAL - 100, TOTAL)


def test_a_batch_that_does_not_split_into_the_micro_batches_is_refused(service_of):
    service = service_of("compute", 2)
    req = packfeed_pb2.StreamRequest(rank=0, world_size=1, batch_rows=3, cursor=0)
    with pytest.raises(grpc.RpcError, match="INVALID_ARGUMENT: batch_rows 3 does not split into this server's 2"):
        next(service.stream_batches(req.SerializeToString(), Context()))
