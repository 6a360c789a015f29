"""``packfeed serve``: the packed stream of a data config over gRPC, to any training loop.

    packfeed serve INPUT... --tokenizer T --seq-len L [data flags] [--host H --port P]
    packfeed serve --config data.toml [--port P]          # a mixture, several epochs
    packfeed serve runs/demo-pack [--port P]              # a packed directory, as it is

One process: the packing pipeline (embedded local Ray, or ``--address``/$RAY_ADDRESS; as a
Ray job the job's cluster), one RowHub holding a bounded buffer of rows, and a gRPC server
whose consumers read it by global row index (service/delivery/server.py). It prints
``packfeed serve: listening on HOST:PORT`` on a line of its own once it accepts calls.

Security: a bearer token from ``--auth-token-file`` or $PACKFEED_AUTH_TOKEN is required on
every call when set (and is not passed on to Ray's processes); without one the server listens
only on loopback unless ``--insecure``. ``--tls-cert``/``--tls-key`` serve TLS.

Shutdown: SIGTERM or SIGINT drain the server (in-flight batches finish, clients see
UNAVAILABLE and resume from their cursor), then the reader is stopped and waited for, and Ray
shut down (when one was started: a packed directory needs none), in that order: exit 0, no
process left behind. A signal during start-up ends the server the same way once it has started.

The manifest (first row of each window, stream length) is kept under ``--state-dir``, so a
restarted server resumes any cursor by packing from the window that holds it.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import threading
import time
from pathlib import Path

from packfeed.client.transport import TOKEN_ENV, resolve_token
from packfeed.service.pipeline.raycluster import shutdown_ray
from packfeed.service.commands.args import (
    add_data_arguments,
    data_config_from_args,
    load_config_file,
    packing_from_args,
    place_packing,
    positive_number,
    resolve_output,
)

HELP = "stream packed batches over gRPC to any training loop"
ORDER = 1
logger = logging.getLogger("packfeed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser)
    net = parser.add_argument_group("serving")
    net.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only)")
    net.add_argument("--port", type=int, default=50051, help="port, 0 for any free port")
    net.add_argument("--auth-token-file", type=Path,
                     help=f"file holding the bearer token every call must carry (default: ${TOKEN_ENV} if set)")
    net.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve TLS (with --tls-key)")
    net.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    net.add_argument("--insecure", action="store_true",
                     help="allow listening beyond loopback without a token (anyone who can connect reads the data)")
    net.add_argument("--buffer-rows", type=int, default=2048,
                     help="rows held for the consumers reading together (memory bound; >= 2 x world_size x batch_rows); "
                          "far-behind consumers get a catch-up cache of as many")
    net.add_argument("--max-batch-rows", type=int, default=256, help="largest batch_rows a client may ask for")
    net.add_argument("--max-consumers", type=int, default=64,
                     help="concurrent streams; more get RESOURCE_EXHAUSTED (Describe and health are never refused)")
    net.add_argument("--idle-timeout-seconds", type=float, default=120.0,
                     help="a consumer that asks for nothing this long stops holding the reader back")
    net.add_argument("--state-dir", type=Path, default=None,
                     help="where the stream manifest is kept across restarts (default $XDG_CACHE_HOME/packfeed/serve, "
                          "else ~/.cache/packfeed/serve)")
    net.add_argument("--grace-seconds", type=float, default=10.0, help="how long SIGTERM waits for in-flight batches")
    net.add_argument("--progress-seconds", type=float, default=30.0, help="seconds between serving status lines")
    net.add_argument("--exit-on-failure", action="store_true",
                     help="when the pipeline fails, drain and exit 1 (a job runner then sees the failure) instead of "
                          "staying up NOT_SERVING with the rows it holds")
    net.add_argument("--metrics-port", type=int, default=None,
                     help="serve Prometheus metrics over HTTP on this port (0: any free port; default: off)")
    net.add_argument("--metrics-host", default=None, help="address of the metrics endpoint (default: --host)")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(path: Path | None) -> str | None:
    """The token from ``path``, else from $PACKFEED_AUTH_TOKEN; None when neither is set."""
    if path is not None:
        try:
            token = path.read_text().strip()
        except OSError as e:
            raise ValueError(f"--auth-token-file {path}: cannot read it ({e.strerror or e})") from None
        if not token:
            raise ValueError(f"--auth-token-file {path} is empty")
        return token
    return resolve_token(None)


def check_args(args: argparse.Namespace, token: str | None) -> None:
    """Every flag a user can get wrong, refused before anything starts."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise ValueError(f"--metrics-port must be in 0..65535, got {args.metrics_port}")
    for flag, value, low in (("--max-consumers", args.max_consumers, 1), ("--max-batch-rows", args.max_batch_rows, 1),
                             ("--buffer-rows", args.buffer_rows, 128)):
        if value < low:
            raise ValueError(f"{flag} must be >= {low}, got {value}")
    for flag, value in (("--grace-seconds", args.grace_seconds), ("--idle-timeout-seconds", args.idle_timeout_seconds),
                        ("--progress-seconds", args.progress_seconds)):
        positive_number(flag, value)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if token is None and not args.insecure and not is_loopback(args.host):
        raise ValueError(
            f"refusing to serve on {args.host} without a token: anyone who can reach it could read the data. "
            f"Give --auth-token-file (or ${TOKEN_ENV}), listen on 127.0.0.1, or pass --insecure"
        )
    if token is not None and args.tls_cert is None and not is_loopback(args.host):
        logger.warning("serving on %s without TLS: the token and the rows cross the network in clear text "
                       "(give --tls-cert/--tls-key unless the network itself is private)", args.host)


def run(args: argparse.Namespace) -> int:
    from packfeed.service.delivery.hub import Manifest
    from packfeed.service.delivery.server import check_tls_files, port_problem
    from packfeed.service.packed.writer import packed_dir_info

    token = read_token(args.auth_token_file)
    check_args(args, token)
    tls = None
    if args.tls_cert is not None:
        try:
            tls = (args.tls_cert.read_bytes(), args.tls_key.read_bytes())
        except OSError as e:
            raise ValueError(f"--tls-cert/--tls-key: cannot read {e.filename} ({e.strerror})") from None
        check_tls_files(*tls, str(args.tls_cert), str(args.tls_key))
    problem = port_problem(args.host, args.port)
    if problem:
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {problem}")
    if args.metrics_port:
        problem = port_problem(args.metrics_host or args.host, args.metrics_port)
        if problem:
            raise ValueError(f"--metrics-port {args.metrics_port}: {problem}")
    packed = packed_dir_info(args.inputs[0]) if len(args.inputs) == 1 else None
    if packed is not None:
        source, ray_needed = _packed_source(args, packed), False
    else:
        source, ray_needed = None, True
    state_dir = resolve_output(args.state_dir, "--state-dir") if args.state_dir else (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "packfeed" / "serve")
    try:
        Manifest("probe", state_dir / "probe.json").check_writable()
    except OSError as e:
        raise ValueError(f"--state-dir {state_dir}: cannot write the stream manifest there ({e.strerror or e})") from None
    return _serve(args, token, tls, source, state_dir, ray_needed, Manifest)


def _packed_source(args: argparse.Namespace, packed: dict):
    from packfeed.service.delivery.streams import packed_dir_source

    stream_flags = ("tokenizer", "epochs", "strategy", "overlong", "format", "loss", "add_eos", "seed", "window_samples",
                    "block_samples")
    given = [f"--{f.replace('_', '-')}" for f in stream_flags if getattr(args, f) is not None]
    if given or args.config is not None:
        raise ValueError(f"{args.inputs[0]} is a packed directory, served as it is: {', '.join(given) or '--config'} "
                         "cannot change its rows (pack again with them)")
    seq_len = int(packed["config"]["data"]["seq_len"])
    if args.seq_len is not None and args.seq_len != seq_len:
        raise ValueError(f"{args.inputs[0]} holds rows of {seq_len} tokens, not --seq-len {args.seq_len}")
    _check_batch_bytes(args.max_batch_rows, seq_len)
    logger.info("serving the packed directory %s as it is (%s rows)", args.inputs[0], f"{packed['stats']['rows']:,}")
    return packed_dir_source(args.inputs[0], packed)


def _serve(args, token, tls, source, state_dir: Path, ray_needed: bool, Manifest) -> int:
    from grpc_health.v1 import health_pb2

    from packfeed.client.transport import SERVICE_NAME
    from packfeed.service.delivery.hub import RowHub
    from packfeed.service.delivery.server import PackFeedService, build_server, drain

    started = time.perf_counter()
    failed, stop = threading.Event(), threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before Ray starts: init_ray keeps them
        signal.signal(sig, lambda *_: stop.set())
    if ray_needed:
        source = _pipeline_source(args)
    manifest = Manifest(source.manifest_key, state_dir / f"{source.manifest_key}.json")
    source.seed_manifest(manifest)

    def reader_failed(exc: BaseException) -> None:
        from packfeed.service.errors import root_cause, user_message

        cause = root_cause(exc)
        bug = user_message(exc) is None or args.debug  # a user's error is its line, a bug keeps its traceback
        logger.error("the pipeline failed, NOT_SERVING from now on: %s: %s", type(cause).__name__, cause,
                     exc_info=cause if bug else None)
        for name in ("", SERVICE_NAME):
            health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if args.exit_on_failure:
            failed.set()
            stop.set()

    hub = RowHub(source.open_reader, manifest, capacity=args.buffer_rows, pack_window=source.pack_window,
                 idle_timeout_s=args.idle_timeout_seconds, on_error=reader_failed)
    service = PackFeedService(hub, source, max_batch_rows=args.max_batch_rows, max_consumers=args.max_consumers)
    server, port, health_servicer = build_server(
        service, host=args.host, port=args.port, token=token, tls=tls, max_consumers=args.max_consumers
    )
    metrics = None
    if args.metrics_port is not None:
        from packfeed.service.metrics import start_metrics_server

        metrics = start_metrics_server(args.metrics_host or args.host, args.metrics_port, hub=hub, service=service,
                                       source=source)
    server.start()
    logger.info(  # before the packing actors start: none of their log lines can cut into it
        "listening on %s:%d (%s, %s); stream %s, seq_len %d, %d epoch(s), ready in %.1fs%s", args.host, port,
        "TLS" if tls else "plaintext", "token required" if token else "no token", source.config_hash, source.seq_len,
        source.epochs, time.perf_counter() - started, f"; metrics on :{metrics.port}" if metrics else "",
    )
    if manifest.total_rows is None and len(manifest.first_row) == 1:
        # A first run: start packing now so the first consumer does not wait for the cold
        # start. A restarted server waits: its consumers resume mid-stream, wherever they were.
        hub.start()
    _status_loop(stop, hub, service, args.progress_seconds)
    logger.info("draining (%s): finishing in-flight batches", "the pipeline failed" if failed.is_set() else "signal")
    t0 = time.perf_counter()
    drain(server, service, health_servicer, args.grace_seconds)
    stopped = hub.close(timeout=max(60.0, args.grace_seconds))
    source.close()
    if metrics is not None:
        metrics.stop()
    t1 = time.perf_counter()
    ray_s = None
    if ray_needed:  # a packed directory is served without Ray: nothing to shut down
        shutdown_ray()
        ray_s = time.perf_counter() - t1
    logger.info("%s", stopped_line(t1 - t0, stopped, ray_s))
    return 1 if failed.is_set() else 0


def stopped_line(drained_s: float, reader_stopped: bool, ray_s: float | None) -> str:
    """The last line of a server: how long the drain took, and Ray's shutdown when there was a
    Ray (``ray_s`` None: none was started). "stopped (drained in 0.4s, Ray shut down in 1.2s)"."""
    return (f"stopped (drained in {drained_s:.1f}s" + ("" if reader_stopped else ", the reader did not stop in time")
            + ("" if ray_s is None else f", Ray shut down in {ray_s:.1f}s") + ")")


def _pipeline_source(args: argparse.Namespace):
    """Everything checkable before Ray (config, plan, tokenizer, probe), then Ray and the
    packing pipeline's source."""
    from packfeed.service.data.plan import build_plan
    from packfeed.service.data.probe import describe, probe
    from packfeed.service.pipeline.raycluster import init_ray
    from packfeed.service.delivery.streams import pipeline_source
    from packfeed.service.tokenize.samples import load_tokenizer

    base = load_config_file(args.config)
    config = data_config_from_args(args, base)
    _check_batch_bytes(args.max_batch_rows, config.seq_len)
    packing = packing_from_args(args, base)
    plan = build_plan(config)
    # The catch-up path packs windows in this process: one tokenizer thread, so it does not
    # fight the packing actors for every core (the Rust pool reads this once, on first use).
    os.environ["RAYON_NUM_THREADS"] = "1"
    tokenizer = load_tokenizer(config.tokenizer, loss=config.loss, add_eos=config.add_eos,
                               backend=config.tokenizer_backend)
    for line in describe(probe(plan, tokenizer), plan):  # and the chat template on the rows it read
        logger.info(line)
    tokenizer.check_backend()  # under auto, a fast back-end refused at load is said now, before Ray
    logger.info(init_ray(args.address))
    scaling = place_packing(packing, num_windows=plan.num_windows)
    return pipeline_source(config, plan, tokenizer, scaling)


def _check_batch_bytes(max_batch_rows: int, seq_len: int) -> None:
    """A batch of --max-batch-rows rows must fit in one gRPC message (2 GiB)."""
    from packfeed.client.transport import MAX_MESSAGE_BYTES, batch_message_limit

    if batch_message_limit(max_batch_rows, seq_len) > MAX_MESSAGE_BYTES:
        per_row = batch_message_limit(2, seq_len) - batch_message_limit(1, seq_len)
        most = (MAX_MESSAGE_BYTES - batch_message_limit(0, seq_len)) // per_row
        raise ValueError(f"--max-batch-rows {max_batch_rows} x seq_len {seq_len:,} makes batches above gRPC's 2 GiB "
                         f"message limit: at most {most} rows per batch at this seq_len")


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
                "serving: %d stream(s), %.0f rows/s served, buffer %s/%s rows, reader at row %s, %s, "
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
