"""The gRPC servicer in-process: ``PackFeedService`` over a RowHub of a synthetic stream.

Its handlers are called as gRPC calls them (raw request bytes, a ServicerContext), with a fake
context whose ``abort`` raises as gRPC's does; no server, no socket (a real server on
127.0.0.1 is driven by tests/integration). Checked:

* every step it streams, for every rank, is the train feeder's answer for the same stream and
  the stream's true rows (assign.py's rule), over world sizes, batch sizes and cursors, with
  the cursor and step the client resumes from;
* each status code a user can act on: INVALID_ARGUMENT (malformed or impossible requests),
  OUT_OF_RANGE (a cursor past the end, known before the call or found during it),
  FAILED_PRECONDITION (another data config or seq_len), RESOURCE_EXHAUSTED (too many
  consumers), INTERNAL (the pipeline failed), UNAVAILABLE (draining), UNAUTHENTICATED (token);
* a consumer that goes away ends its call quietly and frees its place.
"""

from __future__ import annotations

import itertools
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from packfeed.client.rows import ROW_COLUMNS, PackedRows, concat_rows, select_rows
from packfeed.client.state import StreamState
from packfeed.client.transport import AUTH_HEADER
from packfeed.client.v1 import packfeed_pb2
from packfeed.client.wire import WIRE_VERSION, DecodedBatch, decode_batch_bytes
from packfeed.service.delivery.assign import num_steps, step_rows
from packfeed.service.delivery.hub import RowHub
from packfeed.service.delivery.manifest import Manifest
from packfeed.service.delivery.server import BearerTokenInterceptor, PackFeedService
from packfeed.service.delivery.row_stream import RowStream
from packfeed.service.delivery.feeder import RowFeeder
from support.streams import SEQ_LEN, WINDOW_ROWS, SyntheticStream, assert_rows

PAD_ID, HASH = 0, "cafe"
TOTAL = sum(WINDOW_ROWS)
CAPACITY = 128  # the hub's buffer: far below the stream, so readers restart and far consumers catch up
DEADLINE_S = 30.0  # a call waiting longer for rows than this ends (ConsumerGone) and fails its test


class Aborted(Exception):
    """What the fake context's ``abort`` raises (gRPC's raises too, ending the handler)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


class FakeContext:
    """The part of grpc.ServicerContext the servicer uses; ``alive()`` says whether the client
    is still there."""

    def __init__(self, alive=lambda: True) -> None:
        self._alive = alive

    def abort(self, code: grpc.StatusCode, details: str):
        raise Aborted(code, details)

    def is_active(self) -> bool:
        return self._alive()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:40000"


def alive_until(seconds: float = DEADLINE_S):
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() < deadline


def wait_until(predicate, what: str) -> None:
    alive = alive_until()
    while not predicate():
        assert alive(), f"timed out waiting until {what}"
        time.sleep(0.01)


@pytest.fixture
def hubs():
    """Every hub a test builds, closed after it (no reader thread outlives its test)."""
    made: list[RowHub] = []
    yield made
    for hub in made:
        hub.close()


def make_service(hubs: list, stream: SyntheticStream | None = None, *, manifest: Manifest | None = None,
                 max_batch_rows: int = 64, max_consumers: int = 64) -> PackFeedService:
    stream = stream or SyntheticStream()
    source = RowStream(
        config_hash=HASH, seq_len=SEQ_LEN, tokenizer_name="synthetic", vocab_size=SEQ_LEN * TOTAL + 1,
        pad_id=PAD_ID, epochs=1, windows_per_epoch=len(WINDOW_ROWS),
        sources=[{"name": "synthetic", "rows": TOTAL, "samples_per_epoch": 2 * TOTAL, "planned_share": 1.0}],
        samples_per_epoch=2 * TOTAL, manifest_key="synthetic", open_reader=stream.open_reader,
        pack_window=stream.pack_window,
    )
    hub = RowHub(stream.open_reader, manifest or Manifest("synthetic"), capacity=CAPACITY,
                 pack_window=stream.pack_window, poll_s=0.01)
    hubs.append(hub)
    return PackFeedService(hub, source, max_batch_rows=max_batch_rows, max_consumers=max_consumers)


def request(**fields) -> bytes:
    return packfeed_pb2.StreamRequest(**{"rank": 0, "world_size": 1, "batch_rows": 4, **fields}).SerializeToString()


def call(service: PackFeedService, context: FakeContext | None = None, **fields):
    """A StreamBatches call: the generator of its serialized messages."""
    return service.stream_batches(request(**fields), context or FakeContext())


def streamed(service: PackFeedService, **fields) -> list[DecodedBatch]:
    return [decode_batch_bytes(message) for message in call(service, **fields)]


def aborted(calling) -> Aborted:
    """The abort ``calling()`` ends with."""
    with pytest.raises(Aborted) as caught:
        calling()
    return caught.value


def assert_same_rows(got: PackedRows, want: PackedRows, what: str) -> None:
    for name in ROW_COLUMNS:
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=f"{what}: {name}")


# -- the rows: every step the feeder's answer ------------------------------------------------------

SWEEP = [
    pytest.param(world, accum, micro, cursor, id=f"w{world}-b{accum}x{micro}-c{cursor}")
    for world, (accum, micro), cursor in itertools.product(
        (1, 2, 3), ((1, 3), (2, 2), (4, 4)), (0, 7, 130, 701, TOTAL)
    )
]


@pytest.mark.parametrize("world,accum,micro,cursor", SWEEP)
def test_every_step_streamed_is_the_feeders_and_the_streams_rows(hubs, world, accum, micro, cursor):
    """One thread per rank, as gRPC and Ray Train run them: each takes its call's steps and the
    feeder's answer for the same steps, to the end of the stream."""
    batch_rows = accum * micro
    service = make_service(hubs)
    state = StreamState(cursor=cursor, step=5, config_hash=HASH, seq_len=SEQ_LEN)  # a resumed run, at step 5
    feeder = RowFeeder(SyntheticStream().open_reader, Manifest("synthetic"), world_size=world, grad_accum=accum,
                       micro_rows=micro, seq_len=SEQ_LEN, pad_id=PAD_ID, config_hash=HASH, state=state.to_dict())
    hubs.append(feeder.hub)  # its default buffer holds the whole stream: the servicer's hub is the small one

    def rank_steps(rank: int) -> tuple[list, object, object]:
        """(served, fed) of every step, then what the call and the feeder give past the end."""
        stream = call(service, FakeContext(alive_until()), rank=rank, world_size=world, batch_rows=batch_rows,
                      cursor=cursor)
        steps = [(decode_batch_bytes(message), feeder.get_step(rank, state.step + step))
                 for step, message in enumerate(stream)]
        return steps, feeder.get_step(rank, state.step + len(steps)), service.streams

    with ThreadPoolExecutor(max_workers=world) as pool:
        ranks = [f.result(timeout=DEADLINE_S) for f in [pool.submit(rank_steps, rank) for rank in range(world)]]
    steps = num_steps(world, batch_rows, cursor, TOTAL)
    for rank, (served, fed_past_end, _) in enumerate(ranks):
        assert len(served) == steps and fed_past_end is None, "the call and the feeder end after the same step"
        for step, (got, micro_batches) in enumerate(served):
            what = f"rank {rank} step {step}"
            wanted = step_rows(rank, world, batch_rows, cursor, step, TOTAL)
            assert [m.num_rows for m in micro_batches] == [micro] * accum, what
            assert_same_rows(got.rows, concat_rows(micro_batches), what)
            assert_rows(real_rows_of(got), wanted.rows)  # the stream's truth, not only the feeder's
            assert got.padding_rows.tolist() == wanted.padding_mask.tolist(), what
            assert got.step == step and got.cursor == feeder.state(state.step + step + 1)["stream"]["cursor"], what
    tokens = SyntheticStream.reference(range(cursor, TOTAL)).num_real_tokens if cursor < TOTAL else 0
    assert (service.streams, service.batches_sent, service.rows_sent, service.tokens_sent) == (
        0, steps * world, TOTAL - cursor, tokens)


class EndHeldBack(SyntheticStream):
    """Every row comes at once; the stream's end (its length) only once ``end`` is set."""

    def __init__(self, window_rows) -> None:
        super().__init__(window_rows)
        self.end = threading.Event()

    def open_reader(self, window: int, first_row: int):
        yield from super().open_reader(window, first_row)
        self.end.wait(DEADLINE_S)


@pytest.mark.parametrize("caller", ["servicer", "feeder"])
def test_the_last_steps_cursor_waits_until_the_stream_is_known_to_reach_it(hubs, caller):
    """11 rows, 2 ranks of 3 from cursor 6: rank 0's rows 6, 8, 10 exist before the length is
    known. Answered then, its cursor was 12, past the end, and a resume from it was refused
    (b8b0e12, fixed in both loops once). Both wait for the length: cursor 11."""
    stream = EndHeldBack((6, 5))
    answer: list[tuple[PackedRows, int]] = []
    if caller == "servicer":
        service = make_service(hubs, stream)
        first_step = call(service, FakeContext(alive_until()), rank=0, world_size=2, batch_rows=3, cursor=6)

        def ask() -> None:
            got = decode_batch_bytes(next(first_step))
            answer.append((got.rows, got.cursor))
    else:
        feeder = RowFeeder(stream.open_reader, Manifest("synthetic"), world_size=2, grad_accum=1, micro_rows=3,
                           seq_len=SEQ_LEN, pad_id=PAD_ID, config_hash=HASH, state=StreamState(cursor=6).to_dict())
        hubs.append(feeder.hub)

        def ask() -> None:
            micro_batches = feeder.get_step(0, 0)
            answer.append((concat_rows(micro_batches), feeder.state(1)["stream"]["cursor"]))

    asker = threading.Thread(target=ask)
    asker.start()
    asker.join(0.3)
    assert not answer, "answered before the stream was known to reach row 11"
    stream.end.set()
    asker.join(DEADLINE_S)
    rows, cursor = answer[0]
    assert_rows(rows, [6, 8, 10])
    assert cursor == 11


def real_rows_of(batch: DecodedBatch) -> PackedRows | None:
    """The batch's real rows (padding rows dropped), None when it has none."""
    keep = np.flatnonzero(~batch.padding_rows)
    return select_rows(batch.rows, keep) if len(keep) else None



# -- status codes ----------------------------------------------------------------------------------


def refused(calling, code: grpc.StatusCode, match: str) -> Aborted:
    """The abort ``calling()`` ends with: ``code``, details matching ``match``."""
    with pytest.raises(Aborted, match=match) as caught:
        calling()
    assert caught.value.code == code, caught.value
    return caught.value


@pytest.mark.parametrize("fields,match", [
    pytest.param({"world_size": 0}, "world_size must be >= 1", id="no-world"),
    pytest.param({"rank": 2, "world_size": 2}, r"rank must be in \[0, world_size=2\), got 2", id="rank-outside-world"),
    pytest.param({"batch_rows": 0}, "batch_rows must be >= 1", id="no-rows"),
    pytest.param({"batch_rows": 65}, "batch_rows 65 is above this server's limit of 64", id="above-max-batch-rows"),
    pytest.param({"world_size": 5, "batch_rows": 13}, "world_size x batch_rows = 65 rows does not fit in half",
                 id="step-above-half-the-buffer"),
])
def test_an_impossible_request_is_invalid_argument(hubs, fields, match):
    service = make_service(hubs)
    refused(lambda: streamed(service, **fields), grpc.StatusCode.INVALID_ARGUMENT, match)
    assert service.streams == 0 and service.hub.reader_starts == 0, "refused before it holds a place or reads"


def test_a_malformed_request_is_invalid_argument(hubs):
    service, garbage = make_service(hubs), b"\xff\xff\xff"  # a truncated varint
    refused(lambda: service.describe(garbage, FakeContext()), grpc.StatusCode.INVALID_ARGUMENT,
            "malformed DescribeRequest")
    refused(lambda: list(service.stream_batches(garbage, FakeContext())), grpc.StatusCode.INVALID_ARGUMENT,
            "malformed StreamRequest")


@pytest.mark.parametrize("end_known", [True, False], ids=["end-known", "end-found-during-the-call"])
@pytest.mark.parametrize("cursor", [TOTAL + 1, TOTAL + 50, 100 * TOTAL])
def test_a_cursor_past_the_end_is_out_of_range(hubs, cursor, end_known):
    manifest = Manifest("synthetic")
    if end_known:
        manifest.record_end(TOTAL)
    service = make_service(hubs, manifest=manifest)
    refused(lambda: streamed(service, cursor=cursor), grpc.StatusCode.OUT_OF_RANGE,
            rf"cursor {cursor} is past the end of the stream \({TOTAL} rows\)")
    assert service.streams == 0 and service.batches_sent == 0
    assert streamed(service, cursor=TOTAL) == [], "the end itself is a stream of no steps"


@pytest.mark.parametrize("fields,match", [
    pytest.param({"expected_config_hash": "other"}, "streams data config cafe, the client expects other", id="hash"),
    pytest.param({"expected_seq_len": 2 * SEQ_LEN}, f"packs rows of {SEQ_LEN} tokens, the client expects {2 * SEQ_LEN}",
                 id="seq-len"),
])
def test_another_stream_than_the_client_expects_is_a_failed_precondition(hubs, fields, match):
    service = make_service(hubs)
    refused(lambda: streamed(service, **fields), grpc.StatusCode.FAILED_PRECONDITION, match)
    same = {name: HASH if name == "expected_config_hash" else SEQ_LEN for name in fields}
    assert len(streamed(service, cursor=TOTAL - 8, **same)) == 2, "the expected stream is served"


def test_a_consumer_beyond_max_consumers_is_resource_exhausted_and_describe_still_answered(hubs):
    service = make_service(hubs, max_consumers=2)
    calls = [call(service, rank=rank, world_size=2) for rank in range(2)]
    for rank_call in calls:
        next(rank_call)  # a call holds its place from its first message on
    refused(lambda: streamed(service, rank=0, world_size=2), grpc.StatusCode.RESOURCE_EXHAUSTED,
            "already streams to 2 consumers")
    assert packfeed_pb2.StreamInfo.FromString(service.describe(b"", FakeContext())).config_hash == HASH
    calls[0].close()  # the client went away: its place is free
    assert service.streams == 1
    calls[0] = call(service, rank=0, world_size=2)
    assert decode_batch_bytes(next(calls[0])).cursor == 2 * 4 and service.streams == 2
    for rank_call in calls:
        rank_call.close()
    assert service.streams == 0


def wrapped(cause: Exception) -> Exception:
    """``cause`` inside a wrapper, as Ray hands a task's error over."""
    wrapper = RuntimeError("ray task failed")
    wrapper.__cause__ = cause
    return wrapper


@pytest.mark.parametrize("error", [ValueError("bad sample at row 300"), wrapped(ValueError("bad sample at row 300"))],
                         ids=["raised", "wrapped"])
def test_a_pipeline_failure_is_internal_with_what_the_data_raised_after_the_rows_before_it(hubs, error):
    service = make_service(hubs, SyntheticStream(fail_at=300, error=error))
    got: list[DecodedBatch] = []

    def consume() -> None:
        for message in call(service, FakeContext(alive_until())):
            got.append(decode_batch_bytes(message))

    refused(consume, grpc.StatusCode.INTERNAL, "packfeed pipeline failed: ValueError: bad sample at row 300")
    assert got, "the steps before the failure were served"
    assert_rows(concat_rows([batch.rows for batch in got]), range(4 * len(got)))
    assert 4 * len(got) <= 300 and service.streams == 0


def test_a_drain_ends_a_sending_call_unavailable_after_its_batch(hubs):
    service = make_service(hubs)
    sending = call(service, world_size=2, batch_rows=2)
    next(sending)
    service.draining = True  # what server.drain() does, without a gRPC server
    service.hub.drain()
    refused(lambda: next(sending), grpc.StatusCode.UNAVAILABLE,
            "packfeed server shutting down: reconnect and resume from your cursor")
    refused(lambda: streamed(service), grpc.StatusCode.UNAVAILABLE, "shutting down")
    assert service.streams == 0 and service.batches_sent == 1


def test_a_drain_ends_a_call_waiting_for_rows_unavailable(hubs):
    gate = threading.Event()  # the reader holds its rows back until the end of the test
    service = make_service(hubs, SyntheticStream(gate=gate))
    outcome: list[Aborted] = []
    waiter = threading.Thread(target=lambda: outcome.append(
        refused(lambda: streamed(service, cursor=400), grpc.StatusCode.UNAVAILABLE, "shutting down")))
    waiter.start()
    try:
        wait_until(lambda: service.hub.snapshot()["attached"] == 1, "the call waits for its rows")
        service.hub.drain()
        waiter.join(DEADLINE_S)
    finally:
        gate.set()
    assert len(outcome) == 1 and service.streams == 0 and service.batches_sent == 0


def test_a_consumer_gone_while_waiting_ends_its_call_quietly_and_frees_its_place(hubs):
    gate = threading.Event()  # never set while the call waits: its rows never come
    service = make_service(hubs, SyntheticStream(gate=gate), max_consumers=1)
    try:
        assert list(call(service, FakeContext(alive=lambda: False))) == []
    finally:
        gate.set()
    assert service.streams == 0 and service.batches_sent == 0
    assert len(streamed(service, cursor=TOTAL - 1)) == 1, "its place is free"


@pytest.mark.parametrize("method,kind", [("Describe", "unary_unary"), ("StreamBatches", "unary_stream")])
@pytest.mark.parametrize("metadata,reason", [
    pytest.param((), "missing bearer token", id="no-token"),
    pytest.param(((AUTH_HEADER, "Bearer wrong"),), "wrong bearer token", id="wrong-token"),
    pytest.param(((AUTH_HEADER, "Bearer s3cret"),), None, id="right-token"),
])
def test_a_call_without_the_token_is_unauthenticated_and_counted(hubs, method, kind, metadata, reason):
    service = make_service(hubs)
    handlers = {"Describe": grpc.unary_unary_rpc_method_handler(service.describe),
                "StreamBatches": grpc.unary_stream_rpc_method_handler(service.stream_batches)}
    details = types.SimpleNamespace(method=f"/packfeed.v1.PackFeed/{method}", invocation_metadata=metadata)
    handler = BearerTokenInterceptor("s3cret", service.refused).intercept_service(
        lambda d: handlers[d.method.rsplit("/", 1)[1]], details)
    if reason is None:
        assert handler is handlers[method] and not service.auth_refused
        return
    answer = getattr(handler, kind)  # refuses at once, a streaming call too
    refused(lambda: answer(request(), FakeContext()), grpc.StatusCode.UNAUTHENTICATED, reason)
    assert service.auth_refused == {reason: 1} and service.streams == 0


def test_describe_says_what_is_streamed_and_the_length_once_known(hubs):
    service = make_service(hubs)

    def describe() -> packfeed_pb2.StreamInfo:
        return packfeed_pb2.StreamInfo.FromString(service.describe(packfeed_pb2.DescribeRequest().SerializeToString(),
                                                                   FakeContext()))

    info = describe()
    assert (info.seq_len, info.config_hash, info.pad_id, info.wire_version, info.max_batch_rows) == (
        SEQ_LEN, HASH, PAD_ID, WIRE_VERSION, 64)
    assert not info.HasField("total_rows") and list(info.epoch_rows) == []
    assert [s.name for s in info.sources] == ["synthetic"]
    streamed(service, cursor=TOTAL - 4)  # reads to the end
    info = describe()
    assert info.total_rows == TOTAL and list(info.epoch_rows) == [TOTAL]
