"""``packfeed serve``: the packed stream of a data config over gRPC, to any training loop.

    packfeed serve INPUT... --tokenizer T --seq-len L [data flags] [--host H --port P]
        [--auth-token-file F] [--tls-cert C --tls-key K] [--insecure]

One process: the Ray Data pipeline (embedded local Ray, or ``--address``/$RAY_ADDRESS; as a
Ray job the job's cluster), one RowHub holding a bounded buffer of rows, and a gRPC server
whose consumers read it by global row index (service/server.py). Prints
``packfeed serve: listening on HOST:PORT`` once it accepts calls.

Security: a bearer token from ``--auth-token-file`` or $PACKFEED_AUTH_TOKEN is required on
every call when set; without one the server listens only on loopback unless ``--insecure``.
``--tls-cert``/``--tls-key`` serve TLS. SIGTERM or SIGINT drain it: exit 0 once in-flight
batches are sent, clients see UNAVAILABLE and resume from their cursor elsewhere or later.

The manifest (first row of each window, stream length) is kept under ``--state-dir``, so a
restarted server resumes any cursor by packing from the window that holds it.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import os
import signal
import sys
import threading
import time
from pathlib import Path

from packfeed.client.transport import TOKEN_ENV, resolve_token
from packfeed.service.cli import add_data_arguments, data_config_from_args, load_config_file, root_cause
from packfeed.service.config import DataConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser)
    net = parser.add_argument_group("serving")
    net.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    net.add_argument("--port", type=int, default=50051, help="port (0: any free port; default 50051)")
    net.add_argument("--auth-token-file", type=Path,
                     help=f"file holding the bearer token every call must carry (default: ${TOKEN_ENV} if set)")
    net.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve TLS (with --tls-key)")
    net.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    net.add_argument("--insecure", action="store_true",
                     help="allow listening beyond loopback without a token (anyone who can connect reads the data)")
    net.add_argument("--buffer-rows", type=int, default=2048,
                     help="rows held for all consumers together (memory bound; >= 2 x world_size x batch_rows)")
    net.add_argument("--max-batch-rows", type=int, default=256, help="largest batch_rows a client may ask for")
    net.add_argument("--max-consumers", type=int, default=64, help="concurrent streams; more get RESOURCE_EXHAUSTED")
    net.add_argument("--state-dir", type=Path, default=None,
                     help="where the stream manifest is kept across restarts (default ~/.cache/packfeed/serve)")
    net.add_argument("--grace-seconds", type=float, default=10.0, help="how long SIGTERM waits for in-flight batches")


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
        token = path.read_text().strip()
        if not token:
            raise ValueError(f"--auth-token-file {path} is empty")
        return token
    return resolve_token(None)


def check_security(host: str, token: str | None, insecure: bool, tls_cert: Path | None, tls_key: Path | None) -> None:
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if token is None and not insecure and not is_loopback(host):
        raise ValueError(
            f"refusing to serve on {host} without a token: anyone who can reach it could read the data. "
            f"Give --auth-token-file (or ${TOKEN_ENV}), listen on 127.0.0.1, or pass --insecure"
        )


def manifest_key(config: DataConfig) -> str:
    """The stream's identity: the config hash and the planned windows (files, byte ranges,
    sample counts), so a manifest written before an input file changed is not trusted."""
    from packfeed.service.sources import plan_windows

    plan = plan_windows(config.inputs, window_samples=config.window_samples, format=config.format)
    return f"{config.config_hash()}-{hashlib.sha256(repr(plan).encode()).hexdigest()[:16]}"


def run(args: argparse.Namespace) -> int:
    from grpc_health.v1 import health_pb2

    from packfeed.client.rows import IGNORE_INDEX
    from packfeed.client.transport import SERVICE_NAME
    from packfeed.service.hub import Manifest, RowHub
    from packfeed.service.pipeline import PackedStream, Scaling, init_ray
    from packfeed.service.server import PackFeedService, StreamMeta, build_server, drain
    from packfeed.service.sources import expand_inputs
    from packfeed.service.stats import format_summary
    from packfeed.service.tokenize import SampleTokenizer

    config = data_config_from_args(args, load_config_file(args.config))
    expand_inputs(config.inputs)  # a missing input fails here, before Ray starts
    token = read_token(args.auth_token_file)
    check_security(args.host, token, args.insecure, args.tls_cert, args.tls_key)
    tls = None if args.tls_cert is None else (args.tls_cert.read_bytes(), args.tls_key.read_bytes())
    if args.buffer_rows < 128:
        raise ValueError(f"--buffer-rows must be >= 128, got {args.buffer_rows}")

    started = time.perf_counter()
    tokenizer = SampleTokenizer(config.tokenizer, loss=config.loss, add_eos=config.add_eos,
                                backend=config.tokenizer_backend)  # fmt: skip
    meta = StreamMeta(
        seq_len=config.seq_len,
        tokenizer_name=tokenizer.name,
        vocab_size=tokenizer.vocab_size,
        pad_id=tokenizer.pad_id,
        config_hash=config.config_hash(),
        ignore_index=IGNORE_INDEX,
    )
    key = manifest_key(config)
    state_dir = args.state_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "packfeed" / "serve"
    manifest = Manifest(key, state_dir / f"{key}.json")
    print(init_ray(args.address), file=sys.stderr)
    scaling = Scaling(num_workers=args.num_workers, cpus_per_worker=args.cpus_per_worker)

    def open_reader(window: int, first_row: int):
        """The stream from ``window``; at its end, the packing report (skips, why, which)."""
        print(f"packfeed serve: packing from window {window} (row {first_row})", file=sys.stderr, flush=True)
        reader_started = time.perf_counter()
        stream = PackedStream(config, scaling=scaling, start_window=window)
        yield from stream.iter_windows(first_row)
        total = stream.stats()
        total.check_accounting()
        stats = total.to_dict(seq_len=config.seq_len, seconds=time.perf_counter() - reader_started)
        print(f"packfeed serve: end of stream reached (windows {window}..{window + len(stream.windows) - 1}):\n"
              f"{format_summary(stats)}", file=sys.stderr, flush=True)

    def reader_failed(exc: BaseException) -> None:
        cause = root_cause(exc)
        print(f"packfeed serve: the pipeline failed, NOT_SERVING from now on: {type(cause).__name__}: {cause}",
              file=sys.stderr, flush=True)
        for name in ("", SERVICE_NAME):
            health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    hub = RowHub(open_reader, manifest, capacity=args.buffer_rows, on_error=reader_failed)
    service = PackFeedService(hub, meta, max_batch_rows=args.max_batch_rows)
    server, port, health_servicer = build_server(
        service, host=args.host, port=args.port, token=token, tls=tls, max_consumers=args.max_consumers
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    if manifest.total_rows is None and len(manifest.first_row) == 1:
        # A first run: start packing now so the first consumer does not wait for the cold
        # start. A restarted server waits: its consumers resume mid-stream, wherever they were.
        hub.start()
    print(
        f"packfeed serve: listening on {args.host}:{port} ({'TLS' if tls else 'plaintext'}, "
        f"{'token required' if token else 'no token'}); stream {meta.config_hash}, seq_len {meta.seq_len}, "
        f"ready in {time.perf_counter() - started:.1f}s",
        file=sys.stderr,
        flush=True,
    )
    stop.wait()
    print("packfeed serve: draining (SIGTERM): finishing in-flight batches", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    drain(server, service, health_servicer, args.grace_seconds)
    hub.close()
    t1 = time.perf_counter()
    import ray

    ray.shutdown()
    print(f"packfeed serve: stopped (drained in {t1 - t0:.1f}s, Ray shut down in {time.perf_counter() - t1:.1f}s)",
          file=sys.stderr, flush=True)
    return 0
