"""PackedStream: one rank's packed batches from a ``packfeed serve`` server, exactly once.

    stream = PackedStream("127.0.0.1:50051", rank=0, world_size=2, batch_rows=8)
    for batch in stream:
        loss = model(**to_model_inputs(batch.rows)).loss   # batch.input_ids etc. are numpy [B, L]
        ...
        save({"model": ..., "stream": stream.state_dict()})
    # later, or after a crash:
    stream = PackedStream("127.0.0.1:50051", rank=0, world_size=2, batch_rows=8, state=saved["stream"])

The stream runs through every epoch of the server's data config, one after the other, with
global row indices that keep counting. Rank k of N gets the rows whose global index is k mod
N, B per step; every rank gets the same number of steps, the last ones padded with flagged
all-padding rows (``batch.padding_rows``; they carry no trained token). ``state_dict()``
(``StreamState``, client/state.py) holds the cursor after the last batch YIELDED (not the last
one prefetched), so resuming from it neither skips nor repeats a row, also with another world
size or batch size (the cursor is a step boundary of the global stream).

A background thread keeps ``prefetch`` batches ready. When the server goes away (restart,
SIGTERM, a dropped connection) it reconnects with exponential backoff and resumes from the
cursor of the last batch it received; it gives up after ``retry_timeout_s`` without progress.
The ``packfeed.client`` logger warns when retrying starts (with the status the server gave)
and again once the stream is back (after how long, from which cursor).
``set_mixture(weights)`` changes the server's mixture from the first window at or after this
rank's cursor (on every rank at the same step: one change), dropping what was read ahead;
``state_dict()`` records it for the resume.
Errors that retrying cannot fix (bad token, bad request, another data config) are raised to
the caller as ``StreamError`` with the server's status code and message.

Arrays are read-only views of the received message (no copy; see client/wire.py). Imports
grpcio, protobuf and numpy only.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import grpc
import numpy as np
from packfeed.client.mixture_record import change_message, change_record
from packfeed.client.rows import PackedRows
from packfeed.client.state import StreamState
from packfeed.client.transport import (
    MAX_MESSAGE_BYTES,
    MAX_REQUEST_BYTES,
    SERVICE_NAME,
    auth_metadata,
    batch_message_limit,
    channel_options,
    diagnose_tls,
    resolve_token,
)
from packfeed.client.v1 import packfeed_pb2
from packfeed.client.stream_info import SourceInfo, StreamInfo, stream_info
from packfeed.client.wire import WIRE_VERSION, DecodedBatch, decode_batch_bytes

__all__ = ["Batch", "PackedStream", "SourceInfo", "StreamError", "StreamInfo"]

logger = logging.getLogger("packfeed.client")
MAX_BATCH_ROWS = 1 << 16  # rows per batch a client may ask for at all (a server's own limit is lower)

# Worth retrying from the cursor: the server restarts, drains, is briefly overloaded, or the
# connection dropped. Everything else (UNAUTHENTICATED, INVALID_ARGUMENT, OUT_OF_RANGE,
# FAILED_PRECONDITION, INTERNAL, ...) needs a human and is raised.
RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,  # the server's stop grace ran out; our own cancel is not retried
    }
)


class StreamError(RuntimeError):
    """The server refused the stream for a reason retrying cannot fix."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


@dataclass(frozen=True)
class Batch:
    """One step's rows for this rank: B packed rows of length L plus where the stream is.

    ``padding_rows``: bool [B], True for all-padding filler rows at the end of the stream.
    ``cursor``: rows of the global stream consumed after this step (what state_dict saves).
    ``step``: 0-based step number of this stream, counted across resumes.
    """

    rows: PackedRows
    padding_rows: np.ndarray
    cursor: int
    step: int

    input_ids = property(lambda self: self.rows.input_ids)  # int32 [B, L]
    labels = property(lambda self: self.rows.labels)  # int32 [B, L], -100 where not trained
    position_ids = property(lambda self: self.rows.position_ids)  # int32 [B, L]
    seq_lens = property(lambda self: self.rows.seq_lens)  # int32 [K] segment lengths, row after row
    segment_splits = property(lambda self: self.rows.segment_splits)  # int64 [B+1] row offsets into seq_lens
    sample_ids = property(lambda self: self.rows.sample_ids)  # int64 [K], -1 for padding
    pair_roles = property(lambda self: self.rows.pair_roles)  # int8 [K]: 1 chosen, 0 rejected, -1 other
    row_index = property(lambda self: self.rows.row_index)  # int64 [B] global row indices

    @property
    def num_rows(self) -> int:
        return self.rows.num_rows


_END = object()


class PackedStream:
    """Iterator of :class:`Batch` for one rank (see the module docstring).

    ``target``: "host:port". ``token``: the server's bearer token (default $PACKFEED_AUTH_TOKEN).
    ``tls_ca``: PEM file (or bytes) of the CA that signed the server's certificate: use TLS.
    ``state``: a ``state_dict()`` (or a :class:`StreamState`) to resume from; ValueError naming
    the field at fault when it is not one. ``prefetch``: batches kept ready.
    ``retry_timeout_s``: give up reconnecting after this long without a batch.
    ``tls_server_name``: the name the server's certificate must carry, when it differs from the
    host dialled (a port-forward to localhost, an IP). ``progress_timeout_s``: raise a
    DEADLINE_EXCEEDED ``StreamError`` when a connected stream
    delivers no batch for this long (a server whose packing is stuck). A TLS mismatch (a
    plaintext client against a TLS server, another CA) is diagnosed at once, not retried.
    """

    def __init__(
        self,
        target: str,
        *,
        rank: int = 0,
        world_size: int = 1,
        batch_rows: int = 8,
        state: StreamState | dict | None = None,
        token: str | None = None,
        tls_ca: str | Path | bytes | None = None,
        prefetch: int = 4,
        retry_timeout_s: float = 300.0,
        max_backoff_s: float = 5.0,
        progress_timeout_s: float = 900.0,
        tls_server_name: str | None = None,
    ) -> None:
        for name, value, low in (("rank", rank, 0), ("world_size", world_size, 1), ("batch_rows", batch_rows, 1),
                                 ("prefetch", prefetch, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if rank >= world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if batch_rows > MAX_BATCH_ROWS:
            raise ValueError(f"batch_rows {batch_rows:,} is above {MAX_BATCH_ROWS:,} (servers accept at most their "
                             "--max-batch-rows, 256 by default): use fewer rows per batch")
        for name, value in (("retry_timeout_s", retry_timeout_s), ("max_backoff_s", max_backoff_s),
                            ("progress_timeout_s", progress_timeout_s)):
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        if not isinstance(target, str) or ":" not in target:
            raise ValueError(f"target must be 'host:port', got {target!r}")
        self.target, self.rank, self.world_size, self.batch_rows = target, rank, world_size, batch_rows
        self.retry_timeout_s, self.max_backoff_s = retry_timeout_s, max_backoff_s
        self.progress_timeout_s = progress_timeout_s
        self._metadata = auth_metadata(resolve_token(token))
        if isinstance(tls_ca, (str, Path)):
            tls_ca = Path(tls_ca).read_bytes()
        self._tls_ca = tls_ca
        self._tls_server_name = tls_server_name
        self._tls_checked = False
        self._credentials = None if tls_ca is None else grpc.ssl_channel_credentials(root_certificates=tls_ca)
        self._state = StreamState.resume_from(state)  # after the last batch yielded
        self.reconnects = 0  # times the stream was re-opened after a retryable error
        self._outage: tuple[float, int] | None = None  # (when retrying started, tries) while the server is away
        self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._call: Any = None
        self._done = False
        self._control = self._channel(MAX_REQUEST_BYTES * 16)
        self._data: grpc.Channel | None = None

    # -- public -----------------------------------------------------------------------------

    def describe(self) -> StreamInfo:
        """The server's stream description (retried like the stream while the server starts)."""
        call = self._control.unary_unary(
            f"/{SERVICE_NAME}/Describe",
            request_serializer=packfeed_pb2.DescribeRequest.SerializeToString,
            response_deserializer=packfeed_pb2.StreamInfo.FromString,
        )
        info = self._retrying(lambda: call(packfeed_pb2.DescribeRequest(), metadata=self._metadata, timeout=30))
        self._back(self._state.cursor)
        if info.wire_version != WIRE_VERSION:
            raise StreamError(grpc.StatusCode.FAILED_PRECONDITION,
                              f"server speaks wire version {info.wire_version}, this client {WIRE_VERSION}")
        return stream_info(info)

    def set_mixture(self, weights: Mapping[str, float], *, step: int | None = None) -> dict:
        """New source weights (every source named; 0 pauses one) from the first window starting
        at or after this rank's cursor (the rows consumed), so at most one window after them.
        ``step`` (default: the steps consumed so far) is the same on every rank, called after the
        same batch: one change per step, the same answer for all. What was read ahead is dropped
        and read again from the cursor (it may have been packed with the old weights). Returns
        the change (``step``, ``from_sample``, ``window``, ``weights``, ``schedule_index``),
        recorded in ``state_dict()``, and how far it is from the consumers: ``consumer_window``
        holds the cursor, ``lag_samples`` = ``from_sample`` - that window's first sample.
        StreamError INVALID_ARGUMENT for bad weights (nothing changes), FAILED_PRECONDITION when
        the stream cannot change (a packed directory); README "Changing the mixture during a run"."""
        try:
            wanted = {str(name): float(w) for name, w in dict(weights).items()}
        except (TypeError, ValueError):
            raise ValueError(f"weights must map source names to numbers, got {weights!r}") from None
        call = self._control.unary_unary(
            f"/{SERVICE_NAME}/SetMixture",
            request_serializer=packfeed_pb2.SetMixtureRequest.SerializeToString,
            response_deserializer=packfeed_pb2.MixtureChange.FromString,
        )
        request = packfeed_pb2.SetMixtureRequest(weights=wanted, step=self._state.step if step is None else step,
                                                 cursor=self._state.cursor)
        reply = self._retrying(lambda: call(request, metadata=self._metadata, timeout=60))  # a step's change is made once
        record = change_record(reply)
        self._state = self._state.with_mixture([record])
        self._read_again()
        return {**record, "schedule_index": reply.schedule_index, "consumer_window": reply.consumer_window,
                "lag_samples": record["from_sample"] - reply.consumer_sample}

    @property
    def state(self) -> StreamState:
        """The position after the last batch yielded (``state_dict()`` is its JSON-able record)."""
        return self._state

    def state_dict(self) -> dict:
        """JSON-able position after the last batch yielded (``StreamState.to_dict()``); pass as
        ``state=`` to resume."""
        return self._state.to_dict()

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        if self._done:
            raise StopIteration
        if self._thread is None:
            self._start()
        try:
            item = self._queue.get(timeout=self.progress_timeout_s)
        except queue.Empty:
            self.close()
            raise StreamError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no batch from {self.target} in {self.progress_timeout_s:.0f}s: the server is down and not back yet, "
                "or its packing makes no progress (see its log; raise progress_timeout_s for very slow first windows)",
            ) from None
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        decoded: DecodedBatch = item
        step = self._state.step
        batch = Batch(rows=decoded.rows, padding_rows=decoded.padding_rows, cursor=decoded.cursor, step=step)
        self._state = self._state.after_step(decoded.cursor)
        return batch

    def close(self) -> None:
        """Stop prefetching and close the connections (safe to call twice); iteration ends."""
        self._done = True
        self._stop_fetching()
        for channel in (self._control, self._data):
            if channel is not None:
                channel.close()

    def __enter__(self) -> "PackedStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _stop_fetching(self) -> None:
        """Stop the prefetch thread (its call cancelled) and wait for it to end."""
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            while self._thread.is_alive():  # unblock a put() on a full queue
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    pass
                self._thread.join(0.05)

    def _read_again(self) -> None:
        """Drop every batch read ahead (queued or in flight) and prefetch again from the cursor
        of the last batch yielded (after a mixture change: they may hold rows of the old weights)."""
        if self._thread is None or self._done:
            return
        self._stop_fetching()
        self._stop, self._queue, self._call = threading.Event(), queue.Queue(maxsize=self._queue.maxsize), None
        self._thread = threading.Thread(target=self._fetch, name=f"packfeed-stream-rank{self.rank}", daemon=True)
        self._thread.start()

    def _channel(self, max_receive: int) -> grpc.Channel:
        options = channel_options(max_receive=max_receive, max_send=MAX_REQUEST_BYTES)
        if self._tls_server_name:
            options.append(("grpc.ssl_target_name_override", self._tls_server_name))
        if self._credentials is None:
            return grpc.insecure_channel(self.target, options=options)
        return grpc.secure_channel(self.target, self._credentials, options=options)

    def _start(self) -> None:
        info = self.describe()
        if info.max_batch_rows and self.batch_rows > info.max_batch_rows:
            raise ValueError(f"batch_rows {self.batch_rows} is above the server's limit of {info.max_batch_rows} "
                             "(its --max-batch-rows): use fewer rows per batch")
        # pinned: a restarted server must stream the same data (its mixture changes too)
        self._state = self._state.pinned(info.config_hash, info.seq_len).with_mixture(info.mixture_changes)
        seq_len = self._state.seq_len
        limit = batch_message_limit(self.batch_rows, seq_len)
        if limit > MAX_MESSAGE_BYTES:
            raise ValueError(f"batch_rows {self.batch_rows} x seq_len {seq_len} makes messages above gRPC's 2 GiB "
                             "limit: use fewer rows per batch")
        self._data = self._channel(limit)
        self._thread = threading.Thread(target=self._fetch, name=f"packfeed-stream-rank{self.rank}", daemon=True)
        self._thread.start()

    def _request(self, cursor: int) -> packfeed_pb2.StreamRequest:
        return packfeed_pb2.StreamRequest(
            rank=self.rank,
            world_size=self.world_size,
            batch_rows=self.batch_rows,
            cursor=cursor,
            expected_config_hash=self._state.config_hash,
            expected_seq_len=self._state.seq_len,
            mixture_changes=[change_message(c) for c in self._state.mixture],
        )

    def _fetch(self) -> None:
        """Prefetch thread: stream from the cursor, reconnecting until the end or a fatal error."""
        stream = self._data.unary_stream(
            f"/{SERVICE_NAME}/StreamBatches",
            request_serializer=packfeed_pb2.StreamRequest.SerializeToString,
            response_deserializer=decode_batch_bytes,
        )
        cursor = self._state.cursor  # after the last batch received
        seq_len = self._state.seq_len  # pinned by _start
        item: Any = _END

        def read_all() -> None:
            nonlocal cursor
            self._call = stream(self._request(cursor), metadata=self._metadata)
            if self._stop.is_set():  # close() ran before the call existed: it could not cancel it
                self._call.cancel()
            for decoded in self._call:
                self._back(cursor)
                if decoded.rows.num_rows != self.batch_rows or decoded.rows.seq_len != seq_len:
                    raise StreamError(grpc.StatusCode.DATA_LOSS, f"batch of shape {decoded.rows.input_ids.shape}, "
                                      f"expected [{self.batch_rows}, {seq_len}]")
                if not self._put(decoded):
                    return
                cursor = decoded.cursor

        try:
            self._retrying(read_all, progress=lambda: cursor)
        except BaseException as exc:  # handed to the consumer, raised from __next__
            item = exc
        if not self._stop.is_set():
            self._put(item)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _retrying(self, attempt, progress=lambda: None):
        """Run ``attempt()`` until it returns, retrying retryable gRPC errors with backoff;
        the deadline restarts whenever ``progress()`` changes."""
        tries, last, deadline = 0, progress(), time.monotonic() + self.retry_timeout_s
        while True:
            if self._stop.is_set():  # closed while waiting to retry
                return None
            try:
                return attempt()
            except grpc.RpcError as exc:
                code = exc.code()
                if self._stop.is_set():
                    return None
                if code not in RETRYABLE:
                    raise StreamError(code, exc.details() or "") from None
                if code == grpc.StatusCode.UNAVAILABLE and tries >= 2 and not self._tls_checked:
                    # a TLS mismatch looks like a down server to gRPC: probe once something listens
                    self._tls_checked, problem = diagnose_tls(self.target, self._tls_ca)
                    if problem is not None:
                        raise StreamError(code, problem) from None
                if progress() != last:
                    tries, last, deadline = 0, progress(), time.monotonic() + self.retry_timeout_s
                if time.monotonic() > deadline:
                    raise StreamError(code, f"gave up after {self.retry_timeout_s:.0f}s of retries: {exc.details()}") from None
                delay = min(self.max_backoff_s, 0.05 * 2**tries) * random.uniform(0.5, 1.0)
                tries += 1
                self.reconnects += 1
                self._away(code, exc.details() or "", progress())
                self._stop.wait(delay)

    def _away(self, code: grpc.StatusCode, details: str, cursor: Any) -> None:
        """A retryable failure: the first of an outage is a warning, the rest are counted."""
        if self._outage is None:
            self._outage = (time.monotonic(), 1)
            logger.warning("rank %d: %s is unavailable (%s: %s); retrying from cursor %s for up to %.0fs",
                           self.rank, self.target, code.name, details,
                           self._state.cursor if cursor is None else cursor, self.retry_timeout_s)
        else:
            self._outage = (self._outage[0], self._outage[1] + 1)

    def _back(self, cursor: int) -> None:
        """The server answered again after an outage: say so once."""
        if self._outage is not None:
            since, tries = self._outage
            self._outage = None
            logger.warning("rank %d: reconnected to %s after %.1fs (%d retr%s), resuming at cursor %d", self.rank,
                           self.target, time.monotonic() - since, tries, "y" if tries == 1 else "ies", cursor)
