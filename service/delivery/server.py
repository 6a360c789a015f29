"""The gRPC side of ``packfeed serve``: the PackFeed service over a RowHub.

``build_server`` returns a started-to-be ``grpc.Server`` serving

* ``packfeed.v1.PackFeed`` (protos/packfeed/v1/packfeed.proto): ``Describe`` and the
  server-streaming ``StreamBatches``. Each call is one consumer of the hub: step after step it
  takes its batch (``steps.rank_batch``, as the train feeder does: assign.py says which rows,
  the tail filled with flagged padding rows) and sends it as one serialized PackedBatch.
  Requests arrive as raw bytes and are parsed here, so a malformed one is an INVALID_ARGUMENT
  answer, not a server error.
* ``SetMixture``: an online mixture change (delivery/mixture_changes.py), one per caller's
  step, from the first window at or after the caller's cursor, recorded in the state dir before
  it is answered. A call that had sent rows past a change's first row (packed with the old
  weights) ends with ABORTED; the client reads on from its cursor.
* the standard health service (``grpc.health.v1.Health``; NOT_SERVING while draining) and
  server reflection (``grpcurl`` can list and call the service).

``max_consumers`` limits concurrent ``StreamBatches`` calls only (RESOURCE_EXHAUSTED beyond
it): Describe and health checks are always answered, so a liveness probe never kills a busy
server. Every stream is logged when it opens and when it ends (rank, world size, cursor,
batches and rows sent, why it ended).

What "sent" means: a batch counts once gRPC has taken it and asks for the next, which is when
it has been written towards the consumer, not when the consumer read it. gRPC sends ahead of
the reads, as far as HTTP/2 flow control and the socket buffers let it (MBs: a whole 873-row
stream of 512-token rows, 219 batches, while its client read 5); what a consumer that leaves
had not read is lost, and it asks for those rows again from its cursor. So the counters are:
rows sent (every send), rows served (a row's first delivery to its rank of a world size:
``steps.Deliveries``) and rows resent (sent again: a resume, a replay from a checkpoint).

A bearer token, when set, is checked on every call, these two included (an interceptor,
constant-time comparison). Refused calls are counted by reason (``auth_refused``, the
``packfeed_auth_refused_total`` metric) and logged as warnings with the caller's address, at
most one line every 10 s (a client stuck on an old token must not flood the log). ``drain()`` is the graceful stop: health NOT_SERVING, every call
finishes the batch it is sending and ends with UNAVAILABLE (clients retry from their cursor).

Status codes: UNAUTHENTICATED (token), INVALID_ARGUMENT (request fields or a malformed
request, bad mixture weights), OUT_OF_RANGE (cursor past the end), FAILED_PRECONDITION (another
config hash or seq_len than the client expects, mixture changes the client recorded and this
server did not make or read past without recording, a mixture change on a packed directory), ABORTED (rows sent
were packed with weights a change replaced), UNAVAILABLE (draining), INTERNAL (the pipeline failed; the message says
why).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent import futures
from typing import Callable, Iterator

import grpc
import numpy as np
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from packfeed.client.transport import (
    MAX_REQUEST_BYTES,
    SERVICE_NAME,
    batch_message_limit,
    channel_options,
)
from packfeed.client.mixture_record import change_message, change_record
from packfeed.client.rows import IGNORE_INDEX, PAD_SAMPLE_ID
from packfeed.client.v1 import packfeed_pb2
from packfeed.client.wire import WIRE_VERSION, encode_batch
from packfeed.service import faults
from packfeed.service.delivery.assign import CursorOutOfRange, check_request
from packfeed.service.delivery.auth import BearerTokenInterceptor
from packfeed.service.delivery.balance import check_balance
from packfeed.service.delivery.hub import ConsumerGone, HubClosed, RowHub
from packfeed.service.delivery.listen_checks import check_tls_files, port_problem  # noqa: F401 (their old home)
from packfeed.service.delivery.mixture_changes import MixtureChange, MixtureRefused, apply_change
from packfeed.service.delivery.row_stream import RowStream
from packfeed.service.delivery.steps import Deliveries, RankBatch, rank_batch
from packfeed.service.errors import root_cause
from packfeed.service.storage.store_errors import StorageError

logger = logging.getLogger("packfeed")
AUTH_LOG_INTERVAL_S = 10.0  # at most one line about refused calls this often
STALE_DETAILS = ("the mixture changed from row {row:,} (SetMixture): rows sent to this call from there on were "
                 "packed with the old weights; read on from your cursor (every rank calls set_mixture at the same step)")
LACKING_DETAILS = ("the mixture changed from row {row:,} and this client read past it without recording the change: "
                   "every rank must call set_mixture at the same step (before reading on)")


class PackFeedService:
    """Handlers of packfeed.v1.PackFeed (plain methods over raw request bytes)."""

    def __init__(self, hub: RowHub, meta: RowStream, *, max_batch_rows: int, max_consumers: int = 64,
                 balance: str = "off", micro_batches: int = 1) -> None:
        self.hub, self.meta, self.max_batch_rows, self.max_consumers = hub, meta, max_batch_rows, max_consumers
        self.balance, self.micro_batches = check_balance(balance), micro_batches  # balance.py
        self._lock = threading.Lock()
        self.streams = 0  # StreamBatches calls open now
        self.batches_sent = 0
        self.bytes_sent = 0
        self.tokens_sent = 0  # real tokens of those rows
        self.rows_served = 0  # real rows sent (padding excluded) for the first time to their rank (of its world size)
        self.tokens_served = 0  # real tokens of those rows
        self.rows_resent = 0  # real rows sent to that rank before (a consumer resumed before them)
        self.deliveries = Deliveries()
        self.draining = False  # set by drain(): calls ending from now on end because of it
        self.auth_refused: Counter = Counter()  # reason ("missing token", "wrong token") -> calls refused
        self._refusals_unlogged, self._refusal_logged_at = 0, float("-inf")

    @property
    def rows_sent(self) -> int:
        """Real rows sent, every send: the first ones and those sent again."""
        return self.rows_served + self.rows_resent

    def refused(self, reason: str, method: str, peer: str) -> None:
        """A call refused by the token check: counted; logged at most every 10 s."""
        with self._lock:
            self.auth_refused[reason] += 1
            now = time.monotonic()
            if now - self._refusal_logged_at < AUTH_LOG_INTERVAL_S:
                self._refusals_unlogged += 1
                return
            unlogged, self._refusals_unlogged, self._refusal_logged_at = self._refusals_unlogged, 0, now
        logger.warning("refused %s from %s: %s%s", method, peer, reason,
                       f" ({unlogged} more refused since the last such line)" if unlogged else "")

    def describe(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        _parse(packfeed_pb2.DescribeRequest, request, context)
        m = self.meta
        info = packfeed_pb2.StreamInfo(
            seq_len=m.seq_len,
            tokenizer_name=m.tokenizer_name,
            vocab_size=m.vocab_size,
            pad_id=m.pad_id,
            config_hash=m.config_hash,
            ignore_index=IGNORE_INDEX,
            wire_version=WIRE_VERSION,
            epochs=m.epochs,
            epoch_rows=m.epoch_rows(self.hub.manifest),
            sources=[packfeed_pb2.SourceInfo(name=s["name"], rows=int(s.get("rows", 0)),
                                             samples_per_epoch=int(s["samples_per_epoch"]),
                                             planned_share=float(s["planned_share"]),
                                             first_sample_id=int(s.get("first_sample_id", 0))) for s in m.sources],
            samples_per_epoch=m.samples_per_epoch,
            max_batch_rows=self.max_batch_rows,
            mixture_changes=[change_message(c.to_dict()) for c in (m.mixture.changes if m.mixture else [])],
        )
        if self.hub.total_rows is not None:
            info.total_rows = self.hub.total_rows
        return info.SerializeToString()

    def set_mixture(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """An online mixture change (see mixture_changes.py); aborts with the status code a
        user can act on, and then nothing changed."""
        req = _parse(packfeed_pb2.SetMixtureRequest, request, context)
        control = self.meta.mixture
        if control is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "this server streams a packed directory as it is: its mixture cannot change (pack it again "
                          "with [[data.schedule]] entries, or serve the data config)")
        made = len(control.changes)
        try:
            answer = apply_change(control, self.hub, int(req.step), dict(req.weights),
                                  int(req.cursor) if req.HasField("cursor") else None)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"mixture not changed: {exc}")
        except MixtureRefused as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"mixture not changed: {exc}")
        except (OSError, StorageError) as exc:
            logger.warning("could not record a mixture change in the state dir (%s): refused", exc)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"mixture not changed: the server could not record it ({exc})")
        change = answer.change
        if len(control.changes) > made:
            again = (f"; windows {change.window}..{answer.planned}, packed ahead with the old weights, are packed again"
                     if answer.planned >= change.window else "")
            logger.info("mixture changed at step %d (%s): from sample %s (window %d; the consumers are in window %d, "
                        "%s samples before) the weights are %s%s", change.step, context.peer(),
                        f"{change.from_sample:,}", change.window, answer.consumer_window,
                        f"{change.from_sample - answer.consumer_sample:,}", dict(change.weights), again)
        reply = change_message(change.to_dict(), control.index_of(change))
        reply.consumer_window, reply.consumer_sample = answer.consumer_window, answer.consumer_sample
        return reply.SerializeToString()

    def stream_batches(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        req = _parse(packfeed_pb2.StreamRequest, request, context)
        self._check(req, context)
        with self._lock:
            if self.streams >= self.max_consumers:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"this server already streams to {self.max_consumers} consumers (--max-consumers): retry later")
            self.streams += 1
        who = f"rank {req.rank}/{req.world_size} ({context.peer()}), batch {req.batch_rows}, cursor {req.cursor:,}"
        logger.info("consumer connected: %s", who)
        sent = rows_sent = rows_resent = 0
        why = "cancelled"
        try:
            for message, batch in self._batches(req, context):
                yield message
                # sent: gRPC wrote it towards the consumer and asks for the next (read or not)
                rows = batch.assignment.rows
                again = self.deliveries.record(req.world_size, req.rank, rows)
                resent = int(again.sum())
                resent_tokens = _real_tokens(batch, again) if resent else 0
                sent, rows_sent, rows_resent = sent + 1, rows_sent + len(rows), rows_resent + resent
                with self._lock:
                    self.batches_sent += 1
                    self.bytes_sent += len(message)
                    self.tokens_sent += batch.num_real_tokens
                    self.rows_served += len(rows) - resent
                    self.tokens_served += batch.num_real_tokens - resent_tokens
                    self.rows_resent += resent
            # the last batch sent, not read: the consumer reads what gRPC still holds at its pace
            why = ("the stream's last batch sent (the consumer reads what gRPC still holds)" if context.is_active()
                   else "cancelled")  # a consumer gone ends the loop too
        except _EndCall as end:
            why = end.why
            context.abort(end.code, end.details)
        except Exception as exc:  # a bug: gRPC answers UNKNOWN
            why = f"failed ({type(exc).__name__}: {exc})"
            raise
        finally:
            if why == "cancelled" and self.draining:
                why = "cancelled during the drain"  # still sending when --grace-seconds ran out, or the client left
            with self._lock:
                self.streams -= 1
            again = f", {rows_resent:,} of them sent to this rank before" if rows_resent else ""
            logger.info("consumer disconnected: %s, %d batch(es) sent (%s rows%s): %s", who, sent, f"{rows_sent:,}",
                        again, why)

    def _batches(self, req: packfeed_pb2.StreamRequest,
                 context: grpc.ServicerContext) -> Iterator[tuple[bytes, RankBatch]]:
        """(message, the batch it encodes) step after step; _EndCall when the call must end
        with a status other than OK."""
        with self.hub.consumer(alive=context.is_active) as consumer:
            step, sent_end, version = 0, 0, self._changes()
            while True:
                version = self._end_if_stale(version, sent_end)  # before it asks the hub for rows far ahead
                try:
                    batch = rank_batch(consumer, rank=req.rank, world_size=req.world_size, batch_rows=req.batch_rows,
                                       cursor=req.cursor, step=step, seq_len=self.meta.seq_len, pad_id=self.meta.pad_id,
                                       balance=self.balance, grad_accum=self.micro_batches)
                except ConsumerGone:
                    return
                except HubClosed:
                    raise _EndCall(grpc.StatusCode.UNAVAILABLE,
                                   "packfeed server shutting down: reconnect and resume from your cursor",
                                   "ended by the drain (UNAVAILABLE: the client resumes from its cursor)") from None
                except CursorOutOfRange as exc:  # the stream turned out to end before the cursor
                    total = self.hub.total_rows
                    raise _EndCall(grpc.StatusCode.OUT_OF_RANGE, str(exc),
                                   f"OUT_OF_RANGE (cursor past the end, {total:,} rows)") from None
                except Exception as exc:  # the pipeline failed (e.g. a bad sample under --strict)
                    cause = root_cause(exc)  # what the data raised, not Ray's wrapper
                    failure = f"packfeed pipeline failed: {type(cause).__name__}: {cause}"
                    raise _EndCall(grpc.StatusCode.INTERNAL, failure, f"INTERNAL ({failure})") from None
                if batch is None:
                    return
                wanted = batch.assignment
                if self._changes() > version:  # a change came while the rows were gathered
                    stale_from = self._stale_from(version)
                    if stale_from is not None and wanted.cursor > stale_from:
                        continue  # maybe with the old weights: gather them again
                sent_end = max(sent_end, max(wanted.rows) + 1 if len(wanted.rows) else 0)
                message = encode_batch(batch.rows, cursor=wanted.cursor, padding_rows=batch.padding,
                                       step=step).SerializeToString()
                yield message, batch
                for row in faults.armed("serve-row"):
                    if row in wanted.rows:
                        faults.point("serve-row", row)
                step += 1

    def _changes(self) -> int:
        return 0 if self.meta.mixture is None else len(self.meta.mixture.changes)

    def _end_if_stale(self, version: int, sent_end: int) -> int:
        """The changes made so far; _EndCall ABORTED when one made after ``version`` made rows
        this call sent (every row below ``sent_end``) stale: the client reads on from its cursor."""
        now = self._changes()
        stale_from = self._stale_from(version) if now > version else None
        if stale_from is not None and sent_end > stale_from:
            raise _EndCall(grpc.StatusCode.ABORTED, STALE_DETAILS.format(row=stale_from),
                           "ABORTED (a mixture change made rows it had sent stale)")
        return now

    def _stale_from(self, version: int, lacking: Callable[[MixtureChange], bool] = lambda c: True) -> int | None:
        """The lowest first row of the changes made after ``version`` (and ``lacking``) that
        made rows already packed stale: rows sent from there on were packed with other weights."""
        control = self.meta.mixture
        firsts = [self.hub.manifest.first_row.get(c.window) for c in control.changes[version:]
                  if control.rewound(c) and lacking(c)]
        return min((r for r in firsts if r is not None), default=None)

    def _check(self, req: packfeed_pb2.StreamRequest, context: grpc.ServicerContext) -> None:
        """Abort with the status code a user can act on, or return."""
        m = self.meta
        try:
            check_request(req.rank, req.world_size, req.batch_rows, req.cursor, self.hub.total_rows)
        except CursorOutOfRange as exc:
            context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if req.batch_rows > self.max_batch_rows:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"batch_rows {req.batch_rows} is above this server's limit of {self.max_batch_rows} (--max-batch-rows)",
            )
        if self.balance == "compute" and req.batch_rows % self.micro_batches:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"batch_rows {req.batch_rows} does not split into this server's {self.micro_batches} "
                          "micro-batches (--micro-batches, with --balance compute)")
        if req.world_size * req.batch_rows > self.hub.capacity // 2:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a step of world_size x batch_rows = {req.world_size * req.batch_rows} rows does not fit in half "
                f"of the server's buffer ({self.hub.capacity} rows): restart it with a larger --buffer-rows",
            )
        if req.HasField("expected_config_hash") and req.expected_config_hash != m.config_hash:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this server streams data config {m.config_hash}, the client expects {req.expected_config_hash}: "
                "same inputs, tokenizer, seq_len, packing and seed are needed to resume",
            )
        if req.HasField("expected_seq_len") and req.expected_seq_len != m.seq_len:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this server packs rows of {m.seq_len} tokens, the client expects {req.expected_seq_len}",
            )
        if req.mixture_changes and m.mixture is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "the client's state records mixture changes; this server streams a packed directory, "
                          "whose mixture never changed")
        if m.mixture is not None:
            try:
                m.mixture.check_recorded([MixtureChange.from_dict(change_record(c)) for c in req.mixture_changes])
            except ValueError as exc:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            recorded = {c.step for c in req.mixture_changes}
            stale_from = self._stale_from(0, lambda c: c.step not in recorded)
            if stale_from is not None and req.cursor > stale_from:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, LACKING_DETAILS.format(row=stale_from))


def _real_tokens(batch: RankBatch, rows: np.ndarray) -> int:
    """Real tokens of the batch's real rows where ``rows`` (bool, one per real row, in batch
    order) is True."""
    splits, real = batch.rows.segment_splits, batch.rows.sample_ids != PAD_SAMPLE_ID
    return sum(int(batch.rows.seq_lens[splits[r]:splits[r + 1]][real[splits[r]:splits[r + 1]]].sum())
               for r in np.flatnonzero(~batch.padding)[rows])


class _EndCall(Exception):
    """Ends a StreamBatches call with ``code`` and ``details`` (for the client); ``why`` is
    what the server's disconnect line says."""

    def __init__(self, code: grpc.StatusCode, details: str, why: str) -> None:
        super().__init__(details)
        self.code, self.details, self.why = code, details, why


def _parse(message_type, data: bytes, context: grpc.ServicerContext):
    try:
        return message_type.FromString(data)
    except DecodeError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {message_type.__name__}: {exc}")


def build_server(
    service: PackFeedService,
    *,
    host: str,
    port: int,
    token: str | None = None,
    tls: tuple[bytes, bytes] | None = None,
    max_consumers: int = 64,
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """The server (not started), the port it bound and its health servicer.

    ``tls``: (certificate chain PEM, private key PEM), checked by the caller
    (``check_tls_files``). ``max_consumers``: the service's stream limit; the thread pool
    keeps room beyond it for Describe, health checks and reflection.
    """
    max_send = batch_message_limit(service.max_batch_rows, service.meta.seq_len)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_consumers + 16, thread_name_prefix="packfeed-rpc"),
        interceptors=[BearerTokenInterceptor(token, service.refused)] if token else [],
        options=[*channel_options(max_receive=MAX_REQUEST_BYTES, max_send=max_send), ("grpc.so_reuseport", 0)],
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE_NAME,
                {
                    "Describe": grpc.unary_unary_rpc_method_handler(service.describe),
                    "StreamBatches": grpc.unary_stream_rpc_method_handler(service.stream_batches),
                    "SetMixture": grpc.unary_unary_rpc_method_handler(service.set_mixture),
                },
            ),
        )
    )
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            cert, key = tls
            bound = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen on {address}: {port_problem(host, port) or 'gRPC refused the address'}")
    return server, bound, health_servicer


def drain(server: grpc.Server, service: PackFeedService, health_servicer: health.HealthServicer, grace_s: float) -> None:
    """Graceful stop: report NOT_SERVING, end every stream after its current batch with
    UNAVAILABLE, refuse new calls, and wait up to ``grace_s`` for in-flight ones."""
    health_servicer.enter_graceful_shutdown()
    service.draining = True
    service.hub.drain()
    server.stop(grace_s).wait()
