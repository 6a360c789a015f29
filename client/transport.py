"""gRPC settings shared by the packfeed server, its client and the transport benchmark.

One place for what both ends must agree on: the service name, how the bearer token travels
(``authorization: Bearer <token>`` metadata on every call), message size limits, and the
channel options that make large messages cheap on loopback (measured in
bench/bench_transport.py).
"""

from __future__ import annotations

import os

SERVICE_NAME = "packfeed.v1.PackFeed"
TOKEN_ENV = "PACKFEED_AUTH_TOKEN"  # the token when none is given explicitly (server and client)
AUTH_HEADER = "authorization"

MAX_REQUEST_BYTES = 64 * 1024  # StreamRequest / DescribeRequest are a few bytes
MAX_MESSAGE_BYTES = (1 << 31) - 1  # gRPC's message size limits are int32
_ROW_BYTES_PER_TOKEN = 3 * 4  # input_ids, labels, position_ids: int32 each
_MESSAGE_OVERHEAD = 1 << 20  # per-row and per-segment fields, framing


def batch_message_limit(batch_rows: int, seq_len: int) -> int:
    """Largest serialized PackedBatch for ``batch_rows`` rows of ``seq_len`` tokens.

    Every segment costs 12 bytes (int32 length + int64 sample id) and a row has at most L
    segments, so a batch is at most B*L*24 bytes plus B*17 and framing.
    """
    return batch_rows * seq_len * (_ROW_BYTES_PER_TOKEN + 12) + batch_rows * 17 + _MESSAGE_OVERHEAD


def diagnose_tls(target: str, ca_pem: bytes | None, timeout: float = 5.0) -> tuple[bool, str | None]:
    """(whether something listens at ``target``, why a connection cannot work when the cause is
    TLS or None).

    gRPC reports a TLS mismatch as UNAVAILABLE, like a server that is down, and a client would
    retry it for minutes. A server that accepts TCP connections but not our handshake is not
    down: probe it once with the standard library's TLS client. For a plaintext client
    (``ca_pem`` None): a server that completes a TLS handshake speaks TLS. For a TLS client: a
    handshake that fails on the certificate means the wrong CA; one that fails on the protocol
    means a plaintext server.
    """
    import socket
    import ssl

    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    try:
        raw = socket.create_connection((host, int(port)), timeout=timeout)
    except (OSError, ValueError):
        return False, None  # nothing listens: a down or restarting server, worth retrying (and probing again)
    context = ssl.create_default_context(cadata=ca_pem.decode() if ca_pem else None)
    if ca_pem is None:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    else:
        context.check_hostname = False  # gRPC checks the name itself; here only the chain matters
    try:
        with context.wrap_socket(raw, server_hostname=host or None):
            pass
    except ssl.SSLCertVerificationError as e:
        return True, (f"TLS handshake with {target} failed: its certificate is not signed by the CA in tls_ca "
                      f"({e.verify_message}): pass the CA that signed the server's certificate")
    except (ssl.SSLError, OSError, ConnectionError) as e:
        if ca_pem is None:
            return True, None
        return True, (f"TLS handshake with {target} failed ({e}): is the server serving plaintext? drop tls_ca, "
                      "or give it --tls-cert")
    finally:
        raw.close()
    if ca_pem is None:
        return True, (f"{target} speaks TLS and this client plaintext: pass tls_ca=<the CA that signed the server's "
                      "certificate> (PEM)")
    return True, None


def channel_options(*, max_receive: int, max_send: int) -> list[tuple[str, int]]:
    """Options for a channel or server: size limits, large HTTP/2 frames, keepalive."""
    return [
        ("grpc.max_receive_message_length", int(max_receive)),
        ("grpc.max_send_message_length", int(max_send)),
        # HTTP/2 frames up to 16 MiB and large TCP reads: fewer slices per MiB of payload.
        ("grpc.http2.max_frame_size", 16 * 1024 * 1024 - 1),
        ("grpc.experimental.tcp_read_chunk_size", 1 << 20),
        ("grpc.experimental.tcp_max_read_chunk_size", 4 << 20),
        # Reconnect soon after a restarted server is back: gRPC's own connection backoff grows
        # to 120 s, and every call fails at once while it runs (measured: 35 s lost after 61 s
        # of outage). The client's retry loop does its own backoff on top.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2_000),
        # Notice a vanished peer within ~30 s even when no data flows.
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]


def resolve_token(token: str | None) -> str | None:
    """``token`` if given, else $PACKFEED_AUTH_TOKEN, else None (stripped; empty means none)."""
    token = token if token is not None else os.environ.get(TOKEN_ENV)
    token = token.strip() if token else None
    return token or None


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying the bearer token (empty when there is none)."""
    return ((AUTH_HEADER, f"Bearer {token}"),) if token else ()
