"""``packfeed serve``: the packed stream of a data config over gRPC, to any training loop.

    packfeed serve INPUT... --tokenizer T --seq-len L [data flags] [--host H --port P]
    packfeed serve --config data.toml [--port P]          # a mixture, several epochs
    packfeed serve runs/demo-pack [--port P]              # a packed directory, as it is

The flags are checked here, naming them, before anything starts; ``run_serve``
(service/delivery/serve_run.py) then serves. One process: the packing pipeline (embedded local
Ray, or ``--address``/$RAY_ADDRESS; as a Ray job the job's cluster), one RowHub holding a
bounded buffer of rows, and a gRPC server whose consumers read it by global row index
(service/delivery/server.py). It prints ``packfeed serve: listening on HOST:PORT`` on a line
of its own once it accepts calls.

Security: a bearer token from ``--auth-token-file`` or $PACKFEED_AUTH_TOKEN is required on
every call when set (and is not passed on to Ray's processes); without one the server listens
only on loopback unless ``--insecure``. ``--tls-cert``/``--tls-key`` serve TLS.

Shutdown: SIGTERM or SIGINT drain the server (in-flight batches finish, clients see
UNAVAILABLE and resume from their cursor), then the reader is stopped and waited for, and Ray
shut down (when one was started: a packed directory needs none), in that order: exit 0, no
process left behind. A signal during start-up ends the server the same way once it has started.

The manifest (first row of each window, stream length) is kept under ``--state-dir`` (a
directory or a URI), so a restarted server resumes any cursor by packing from the window that
holds it, and reads no input to plan (the scan manifest is kept there too).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from pathlib import Path

from packfeed.client.transport import MAX_MESSAGE_BYTES, TOKEN_ENV, batch_message_limit, resolve_token
from packfeed.service import storage
from packfeed.service.commands.args import (
    add_data_arguments,
    data_config_from_args,
    load_config_file,
    packing_from_args,
    positive_number,
    resolve_output,
)
from packfeed.service.delivery.manifest import Manifest
from packfeed.service.delivery.row_stream import find_packed_dir
from packfeed.service.cluster.scaling import PackingScaling

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
    net.add_argument("--balance", choices=("off", "compute"), default="off",
                     help="which rank of a step gets which row: off, rank k of N the rows k mod N; compute, each "
                          "rank the same attention work (docs/serve.md)")
    net.add_argument("--micro-batches", type=int, default=1,
                     help="with --balance compute: the micro-batches each consumer splits its batch into (gradient "
                          "accumulation), each balanced on its own; batch_rows must be a multiple")
    net.add_argument("--max-consumers", type=int, default=64,
                     help="concurrent streams; more get RESOURCE_EXHAUSTED (Describe and health are never refused)")
    net.add_argument("--idle-timeout-seconds", type=float, default=120.0,
                     help="a consumer that asks for nothing this long stops holding the reader back")
    net.add_argument("--state-dir", default=None,
                     help="directory or URI (s3://bucket/prefix) where the stream and scan manifests are kept across "
                          "restarts (default $XDG_CACHE_HOME/packfeed/serve, else ~/.cache/packfeed/serve)")
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
                             ("--buffer-rows", args.buffer_rows, 128), ("--micro-batches", args.micro_batches, 1)):
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
    # the server, imported when it runs: `packfeed` imports every subcommand module to build its parser
    from packfeed.service.delivery.serve_run import ServeOptions, run_serve
    from packfeed.service.delivery.server import check_tls_files, port_problem

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
    packed = find_packed_dir(args.inputs)
    if packed is not None:
        _check_packed_flags(args, packed)
        packed_or_config, scaling = packed, PackingScaling()  # nothing to pack: its rows are read as they are
    else:
        base = load_config_file(args.config)
        packed_or_config = data_config_from_args(args, base)
        _check_batch_bytes(args.max_batch_rows, packed_or_config.seq_len)
        scaling = packing_from_args(args, base)
    state_dir = resolve_output(args.state_dir, "--state-dir") if args.state_dir else (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "packfeed" / "serve")
    try:  # on a store a failure is a StorageError: one line naming the URI, without credentials
        Manifest("probe", storage.join(os.fspath(state_dir), "probe.json")).check_writable()
    except OSError as e:
        raise ValueError(f"--state-dir {state_dir}: cannot write the stream manifest there ({e.strerror or e})") from None
    options = ServeOptions(
        state_dir=state_dir, host=args.host, port=args.port, token=token, tls=tls, buffer_rows=args.buffer_rows,
        max_batch_rows=args.max_batch_rows, max_consumers=args.max_consumers,
        balance=args.balance, micro_batches=args.micro_batches,
        idle_timeout_s=args.idle_timeout_seconds, grace_s=args.grace_seconds, progress_s=args.progress_seconds,
        exit_on_failure=args.exit_on_failure, metrics_port=args.metrics_port, metrics_host=args.metrics_host,
        debug=args.debug,
    )
    return run_serve(packed_or_config, options, scaling=scaling, address=args.address)


def _check_packed_flags(args: argparse.Namespace, packed) -> None:
    """A packed directory is served as it is: no flag may change its rows."""
    stream_flags = ("tokenizer", "epochs", "strategy", "overlong", "format", "loss", "add_eos", "seed", "window_samples",
                    "block_samples")
    given = [f"--{f.replace('_', '-')}" for f in stream_flags if getattr(args, f) is not None]
    if given or args.config is not None:
        raise ValueError(f"{storage.display(packed.path)} is a packed directory, served as it is: "
                         f"{', '.join(given) or '--config'} cannot change its rows (pack again with them)")
    if args.seq_len is not None and args.seq_len != packed.seq_len:
        raise ValueError(f"{storage.display(packed.path)} holds rows of {packed.seq_len} tokens, not --seq-len "
                         f"{args.seq_len}")
    _check_batch_bytes(args.max_batch_rows, packed.seq_len)
    logger.info("serving the packed directory %s as it is (%s rows)", storage.display(packed.path),
                f"{packed.num_rows:,}")


def _check_batch_bytes(max_batch_rows: int, seq_len: int) -> None:
    """A batch of --max-batch-rows rows must fit in one gRPC message (2 GiB)."""
    if batch_message_limit(max_batch_rows, seq_len) > MAX_MESSAGE_BYTES:
        per_row = batch_message_limit(2, seq_len) - batch_message_limit(1, seq_len)
        most = (MAX_MESSAGE_BYTES - batch_message_limit(0, seq_len)) // per_row
        raise ValueError(f"--max-batch-rows {max_batch_rows} x seq_len {seq_len:,} makes batches above gRPC's 2 GiB "
                         f"message limit: at most {most} rows per batch at this seq_len")
