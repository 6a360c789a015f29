"""``run_serve``: one packed stream over gRPC until a signal (``packfeed serve``).

::

    PackedDir | DataConfig -> open_stream -> RowStream -> RowHub (bounded buffer, Manifest)
                                                       -> PackFeedService + gRPC server (+ metrics)

One process: the packing pipeline (Ray: joined or embedded, see ``init_ray``) or a packed
directory read as it is (no Ray), one RowHub holding a bounded buffer of rows, and a gRPC server
whose consumers read it by global row index (server.py). It logs ``listening on HOST:PORT`` once
it accepts calls, then a status line every ``progress_s`` seconds while consumers read.

Shutdown: SIGTERM or SIGINT drain the server (in-flight batches finish, clients see UNAVAILABLE
and resume from their cursor), then the reader is stopped and waited for, and Ray shut down
(when one was started: a packed directory needs none), in that order. A signal during start-up
ends the server the same way once it has started: the handlers are installed first.

The manifest (first row of each window, stream length) is kept under ``state_dir`` (a
directory or a URI: ``s3://bucket/serve-state``), so a restarted server resumes any cursor by
packing from the window that holds it, and replays the online mixture changes recorded there
(mixture_changes.py); so are the inputs' scan manifest
(``scan-<config hash>.npz``) and the record of their probe (``probed-<config hash>.txt``), so a
restart reads no input to plan or to probe: only the windows from its consumers' cursor on.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grpc_health.v1 import health_pb2

from packfeed.client.transport import SERVICE_NAME
from packfeed.service import storage
from packfeed.service.delivery.hub import RowHub
from packfeed.service.delivery.manifest import Manifest
from packfeed.service.delivery.row_stream import PackedDir, RowStream, open_stream
from packfeed.service.delivery.server import PackFeedService, build_server, drain
from packfeed.service.errors import root_cause, user_message
from packfeed.service.metrics import start_metrics_server
from packfeed.service.pipeline.preflight import RayStart, preflight
from packfeed.service.cluster.raycluster import shutdown_ray
from packfeed.service.cluster.scaling import PackingScaling, place_packing

if TYPE_CHECKING:
    from packfeed.service.data.config import DataConfig

logger = logging.getLogger("packfeed")


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    """How ``run_serve`` serves: where it listens, who may read, what it holds, how it stops.
    ``packfeed serve`` checks them first, naming its flags (commands/serve.py)."""

    state_dir: str | Path  # where the stream manifest (and the scan manifest) are kept: a directory or a URI
    host: str = "127.0.0.1"
    port: int = 50051  # 0: any free port
    token: str | None = None  # the bearer token every call must carry
    tls: tuple[bytes, bytes] | None = None  # (PEM certificate chain, PEM private key)
    buffer_rows: int = 2048
    max_batch_rows: int = 256
    max_consumers: int = 64
    balance: str = "off"  # "compute": each rank of a step the same attention work (balance.py)
    micro_batches: int = 1  # with balance "compute": micro-batches of a consumer's batch, each balanced
    idle_timeout_s: float = 120.0
    grace_s: float = 10.0  # how long a drain waits for in-flight batches
    progress_s: float = 30.0
    exit_on_failure: bool = False  # a failed pipeline drains and returns 1, not NOT_SERVING
    metrics_port: int | None = None  # None: no metrics endpoint
    metrics_host: str | None = None  # None: host
    debug: bool = False  # a user's error in the pipeline is logged with its traceback too


def run_serve(packed_or_config: PackedDir | DataConfig, options: ServeOptions, *,
              scaling: PackingScaling = PackingScaling(), address: str | None = None) -> int:
    """Serve ``packed_or_config`` (a ``PackedDir`` as it is, or a DataConfig through its packing
    pipeline, with the packing actors ``scaling`` on the Ray at ``address``) until SIGTERM or SIGINT;
    returns 0, or 1 when the pipeline failed under ``exit_on_failure``. Installs its own SIGTERM
    and SIGINT handlers: call it from the main thread."""
    started = time.perf_counter()
    failed, stop = threading.Event(), threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before Ray starts: init_ray keeps them
        signal.signal(sig, lambda *_: stop.set())
    uses_ray = not isinstance(packed_or_config, PackedDir)
    state_dir = os.fspath(options.state_dir)
    if uses_ray:
        stream = open_pipeline_stream(packed_or_config, scaling, address, state_dir=state_dir)
    else:
        stream = open_stream(packed_or_config)
    manifest = Manifest(stream.manifest_key, storage.join(state_dir, f"{stream.manifest_key}.json"))
    stream.seed_manifest(manifest)
    if stream.mixture is not None:  # the mixture changes of a previous server of this stream, then the new ones
        stream.mixture.attach(manifest)
        for change in stream.mixture.changes:
            logger.info("replaying the mixture change of step %d: from sample %s the weights are %s", change.step,
                        f"{change.from_sample:,}", dict(change.weights))

    def reader_failed(exc: BaseException) -> None:
        cause = root_cause(exc)
        bug = user_message(exc) is None or options.debug  # a user's error is its line, a bug keeps its traceback
        logger.error("the pipeline failed, NOT_SERVING from now on: %s: %s", type(cause).__name__, cause,
                     exc_info=cause if bug else None)
        for name in ("", SERVICE_NAME):
            health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if options.exit_on_failure:
            failed.set()
            stop.set()

    hub = RowHub(stream.open_reader, manifest, capacity=options.buffer_rows, pack_window=stream.pack_window,
                 idle_timeout_s=options.idle_timeout_s, on_error=reader_failed)
    service = PackFeedService(hub, stream, max_batch_rows=options.max_batch_rows, max_consumers=options.max_consumers,
                              balance=options.balance, micro_batches=options.micro_batches)
    server, port, health_servicer = build_server(
        service, host=options.host, port=options.port, token=options.token, tls=options.tls,
        max_consumers=options.max_consumers,
    )
    metrics = None
    if options.metrics_port is not None:
        metrics = start_metrics_server(options.metrics_host or options.host, options.metrics_port, hub=hub,
                                       service=service, stream=stream)
    server.start()
    logger.info(  # before the packing actors start: none of their log lines can cut into it
        "listening on %s:%d (%s, %s); stream %s, seq_len %d, %d epoch(s), ready in %.1fs%s", options.host, port,
        "TLS" if options.tls else "plaintext", "token required" if options.token else "no token",
        stream.config_hash, stream.seq_len, stream.epochs, time.perf_counter() - started,
        f"; metrics on :{metrics.port}" if metrics else "",
    )
    if manifest.total_rows is None and len(manifest.first_row) == 1:
        # A first run: start packing now so the first consumer does not wait for the cold
        # start. A restarted server waits: its consumers resume mid-stream, wherever they were.
        hub.start()
    _status_loop(stop, hub, service, options.progress_s)
    logger.info("draining (%s): finishing in-flight batches", "the pipeline failed" if failed.is_set() else "signal")
    t0 = time.perf_counter()
    drain(server, service, health_servicer, options.grace_s)
    stopped = hub.close(timeout=max(60.0, options.grace_s))
    manifest.flush()
    stream.close()
    if metrics is not None:
        metrics.stop()
    t1 = time.perf_counter()
    ray_s = None
    if uses_ray:  # a packed directory is served without Ray: nothing to shut down
        shutdown_ray()
        ray_s = time.perf_counter() - t1
    logger.info("%s", stopped_line(t1 - t0, stopped, ray_s))
    return 1 if failed.is_set() else 0


def open_pipeline_stream(config: DataConfig, scaling: PackingScaling, address: str | None, *,
                         state_dir: str | None = None) -> RowStream:
    """Everything checkable before Ray (``preflight``: the plan, the tokenizer, the inputs' first
    rows and the chat template on them), then Ray, the packing actors placed, and the pipeline's
    RowStream. ``state_dir``: where the plan keeps the inputs' scan manifest (a restart reads no
    input to plan) and the probe that passed is recorded (a restart on the same files does not
    probe again: it reads no input before its consumers' cursor)."""
    # The catch-up path packs windows in this process: one tokenizer thread, so it does not
    # fight the packing actors for every core (the Rust pool reads this once, on first use).
    os.environ["RAYON_NUM_THREADS"] = "1"
    kept = {} if state_dir is None else {
        "scan_cache": storage.join(state_dir, f"scan-{config.config_hash()}.npz"),
        "probe_record": storage.join(state_dir, f"probed-{config.config_hash()}.txt")}
    checked = preflight(config, RayStart(address), **kept)
    placed = place_packing(scaling, num_windows=checked.plan.num_windows)
    return open_stream(checked.plan, config, tokenizer=checked.tokenizer, scaling=placed)


def stopped_line(drained_s: float, reader_stopped: bool, ray_s: float | None) -> str:
    """The last line of a server: how long the drain took, and Ray's shutdown when there was a
    Ray (``ray_s`` None: none was started). "stopped (drained in 0.4s, Ray shut down in 1.2s)"."""
    return (f"stopped (drained in {drained_s:.1f}s" + ("" if reader_stopped else ", the reader did not stop in time")
            + ("" if ray_s is None else f", Ray shut down in {ray_s:.1f}s") + ")")


def _status_loop(stop: threading.Event, hub, service, every: float) -> None:
    """Wait for a stop signal, logging the serving status every ``every`` seconds.

    The wait is cut in short slices: a SIGTERM the kernel delivers to another thread (Ray and
    gRPC run many) does not wake the main thread's wait, and Python runs the handler only once
    the main thread wakes: a 30 s wait once delayed a drain by 30 s."""
    last_rows, last_t = service.rows_sent, time.monotonic()
    while True:
        due = time.monotonic() + every
        while not stop.is_set() and time.monotonic() < due:
            stop.wait(min(0.2, max(0.0, due - time.monotonic())))
        if stop.is_set():
            return
        snap = hub.snapshot()
        now, rows = time.monotonic(), service.rows_sent
        rate = (rows - last_rows) / max(now - last_t, 1e-9)
        last_rows, last_t = rows, now
        if service.streams or rate:
            logger.info(
                "serving: %d stream(s), %.0f rows/s sent, buffer %s/%s rows, reader at row %s, %s, "
                "%d catch-up window(s) packed", service.streams, rate, f"{snap['held_rows']:,}",
                f"{snap['capacity']:,}", f"{snap['produced']:,}", consumers_status(snap["attached"], snap["max_lag"]),
                snap["catchup_windows"],
            )


def consumers_status(attached: int, max_lag: int) -> str:
    """Where the consumers reading the buffer are, for the status line. A consumer's lag is
    the reader's position minus the first row it asks for: positive, it reads rows already
    made; zero or negative, it waits for rows the reader has yet to make.

    (2, 300) -> "slowest consumer 300 rows behind the reader"; (2, -92) -> "every consumer
    waiting for the reader (the nearest needs 93 more rows)"; (0, 0) -> "no consumer reading
    the buffer" (none yet, or only far-behind or idle ones)."""
    if attached == 0:
        return "no consumer reading the buffer"
    if max_lag > 0:
        return f"slowest consumer {max_lag:,} row{'s' if max_lag != 1 else ''} behind the reader"
    more = 1 - max_lag
    return f"every consumer waiting for the reader (the nearest needs {more:,} more row{'s' if more != 1 else ''})"
