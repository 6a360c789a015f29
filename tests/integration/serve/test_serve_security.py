"""``packfeed serve`` security and request checking, with real gRPC calls to a real server.

One ``packfeed serve`` on 127.0.0.1 for the whole module, started the way a user would secure
it: a bearer token from ``--auth-token-file`` and TLS with a self-signed certificate for
127.0.0.1 / localhost. Against it:

* every RPC (PackFeed's Describe and StreamBatches, health Check and Watch, reflection)
  answers UNAUTHENTICATED without the token or with a wrong one, and works with it;
* the client's token comes from ``token=`` or $PACKFEED_AUTH_TOKEN; TLS needs the right CA, a
  plaintext or wrong-CA client gets an error and no data;
* the server's own checks (raw requests through a generic channel, so the client
  constructor's checks do not hide them): INVALID_ARGUMENT for bad fields and malformed bytes,
  RESOURCE_EXHAUSTED above 64 KiB, OUT_OF_RANGE past the end, FAILED_PRECONDITION for another
  config hash or seq_len, and the server keeps serving afterwards;
* the CLI refuses a non-loopback host without a token before starting Ray (no server start).
"""

from __future__ import annotations

import os
import random
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from packfeed.client.stream import PackedStream, StreamError
from packfeed.client.transport import MAX_REQUEST_BYTES, SERVICE_NAME, TOKEN_ENV
from packfeed.client.v1 import packfeed_pb2
from support.serve import METRICS, REPO, ServerProcess, demo_args, scrape
from support.tls import self_signed_cert

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token-for-tests"
SEQ_LEN = 512
BUFFER_ROWS = 512  # a step may use at most half: world_size * batch_rows <= 256
MAX_BATCH_ROWS = 64
OK = grpc.StatusCode.OK


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("certs")
    cert, key = self_signed_cert(root, "server")
    other, _ = self_signed_cert(root, "impostor")  # a CA that did not sign the server's certificate
    return {"cert": cert, "key": key, "other_ca": other}


@pytest.fixture(scope="module")
def server(tmp_path_factory, certs):
    root = tmp_path_factory.mktemp("serve-secure")
    token_file = root / "token"
    token_file.write_text(TOKEN + "\n")  # a trailing newline, as `echo > file` writes it
    args = demo_args(seq_len=SEQ_LEN, extra=(
        "--auth-token-file", str(token_file),
        "--tls-cert", str(certs["cert"]), "--tls-key", str(certs["key"]),
        "--buffer-rows", str(BUFFER_ROWS), "--max-batch-rows", str(MAX_BATCH_ROWS), "--metrics-port", "0",
    ))
    # The server's token comes from the file only: no $PACKFEED_AUTH_TOKEN from the caller's env.
    proc = ServerProcess(args, log=root / "server.log", state_dir=root / "state",
                         env={"RAY_ADDRESS": "", TOKEN_ENV: ""})
    proc.start()
    try:
        yield proc
        assert proc.terminate(60) == 0, proc.tail()
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def ca(certs) -> bytes:
    return certs["cert"].read_bytes()


@pytest.fixture(scope="module")
def channel(server, ca):
    """A TLS channel to the server with no token of its own (each call passes metadata)."""
    ch = grpc.secure_channel(server.target, grpc.ssl_channel_credentials(root_certificates=ca))
    yield ch
    ch.close()


@pytest.fixture(autouse=True)
def _no_client_token_from_env(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


GOOD = bearer(TOKEN)
BAD_CREDENTIALS = [
    pytest.param((), id="no-token"),
    pytest.param(bearer("wrong-token"), id="wrong-token"),
    pytest.param(bearer(TOKEN + "x"), id="token-plus-one-char"),
    pytest.param(bearer(TOKEN[:-1]), id="token-prefix"),
    pytest.param((("authorization", TOKEN),), id="no-bearer-prefix"),
    pytest.param((("authorization", f"Basic {TOKEN}"),), id="basic-scheme"),
]


# -- raw calls: bytes in, bytes out, so nothing client-side checks the request -----------------


def describe(channel, metadata=GOOD, request: bytes = b"") -> tuple[grpc.StatusCode, str, bytes | None]:
    call = channel.unary_unary(f"/{SERVICE_NAME}/Describe")
    try:
        return OK, "", call(request, metadata=metadata, timeout=60)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", None


def stream_batches(channel, request: bytes, metadata=GOOD, take: int = 2) -> tuple[grpc.StatusCode, str, list[bytes]]:
    """Status and the first ``take`` messages of a raw StreamBatches call (cancelled after them)."""
    call = channel.unary_stream(f"/{SERVICE_NAME}/StreamBatches")(request, metadata=metadata, timeout=120)
    got: list[bytes] = []
    try:
        for message in call:
            got.append(message)
            if len(got) >= take:
                call.cancel()
                return OK, "", got
        return call.code(), call.details() or "", got
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", got


def request(**fields) -> bytes:
    fields = {"rank": 0, "world_size": 1, "batch_rows": 4, **fields}
    return packfeed_pb2.StreamRequest(**fields).SerializeToString()


def stream_info(channel) -> packfeed_pb2.StreamInfo:
    code, details, raw = describe(channel)
    assert code == OK, details
    return packfeed_pb2.StreamInfo.FromString(raw)


def set_mixture(channel, metadata) -> tuple[grpc.StatusCode, str]:
    """Status of a SetMixture call with weights that are always bad (a source that does not exist)."""
    call = channel.unary_unary(f"/{SERVICE_NAME}/SetMixture")
    request = packfeed_pb2.SetMixtureRequest(step=1, weights={"no-such-source": 1.0}).SerializeToString()
    try:
        call(request, metadata=metadata, timeout=60)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return OK, ""


def reflection_services(channel, metadata) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                          metadata=metadata, timeout=60)
    return [s.name for r in responses for s in r.list_services_response.service]


# -- authentication: every RPC ---------------------------------------------------------------------


@pytest.mark.parametrize("metadata", BAD_CREDENTIALS)
def test_every_rpc_refuses_a_missing_or_wrong_token(channel, metadata):
    code, details, raw = describe(channel, metadata)
    assert (code, raw) == (grpc.StatusCode.UNAUTHENTICATED, None)
    assert "token" in details and TOKEN not in details

    code, _, got = stream_batches(channel, request(), metadata)
    assert (code, got) == (grpc.StatusCode.UNAUTHENTICATED, [])
    assert set_mixture(channel, metadata)[0] == grpc.StatusCode.UNAUTHENTICATED

    health = health_pb2_grpc.HealthStub(channel)
    with pytest.raises(grpc.RpcError) as check:
        health.Check(health_pb2.HealthCheckRequest(service=""), metadata=metadata, timeout=60)
    assert check.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as watch:
        next(iter(health.Watch(health_pb2.HealthCheckRequest(service=""), metadata=metadata, timeout=60)))
    assert watch.value.code() == grpc.StatusCode.UNAUTHENTICATED

    with pytest.raises(grpc.RpcError) as listing:
        reflection_services(channel, metadata)
    assert listing.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_refused_calls_are_counted_by_reason_and_logged_with_the_caller(server, channel):
    port = int(METRICS.search(server.log.read_text()).group(1))
    refused = "packfeed_auth_refused_total{{reason=\"{}\"}}"
    before = scrape(port)
    for metadata in ((), (), bearer("wrong-token"), bearer("wrong-token"), bearer("wrong-token")):
        assert describe(channel, metadata)[0] == grpc.StatusCode.UNAUTHENTICATED
    assert describe(channel)[0] == OK  # a good call is not counted
    after = scrape(port)
    for reason, calls in (("missing bearer token", 2), ("wrong bearer token", 3)):
        key = refused.format(reason)
        assert after.get(key, 0) - before.get(key, 0) == calls, (reason, before, after)
    log = server.log.read_text()
    # one line per 10 s at most: the first refusal of this module's run is the one logged
    assert re.search(r"refused /packfeed\.v1\.PackFeed/\w+ from ipv4:127\.0\.0\.1:\d+: (missing|wrong) bearer token",
                     log), log[-2000:]
    assert TOKEN not in log and "wrong-token" not in log, "no token, right or wrong, is ever logged"


def test_every_rpc_works_with_the_token(channel):
    info = stream_info(channel)
    assert info.seq_len == SEQ_LEN and info.config_hash and info.wire_version == 1

    code, details, got = stream_batches(channel, request(batch_rows=2), take=1)
    assert code == OK, details
    batch = packfeed_pb2.PackedBatch.FromString(got[0])
    assert (batch.num_rows, batch.seq_len, batch.cursor) == (2, SEQ_LEN, 2)
    assert np.frombuffer(batch.row_index, "<i8").tolist() == [0, 1]
    code, details = set_mixture(channel, GOOD)  # past the token check: its weights are refused, nothing changes
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "mixture not changed" in details

    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE_NAME):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), metadata=GOOD, timeout=60)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as unknown:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), metadata=GOOD, timeout=60)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_unknown_methods_need_the_token_too(channel):
    call = channel.unary_unary("/packfeed.v1.PackFeed/NoSuchMethod")
    for metadata, code in (((), grpc.StatusCode.UNAUTHENTICATED), (GOOD, grpc.StatusCode.UNIMPLEMENTED)):
        with pytest.raises(grpc.RpcError) as err:
            call(b"", metadata=metadata, timeout=30)
        assert err.value.code() == code, err.value.details()


def test_reflection_describes_the_service(channel):
    assert SERVICE_NAME in reflection_services(channel, GOOD)
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    [reply] = list(stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME)]), metadata=GOOD, timeout=60))
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for b in reply.file_descriptor_response.file_descriptor_proto]
    services = {f"{f.package}.{s.name}": [m.name for m in s.method] for f in files for s in f.service}
    assert services[SERVICE_NAME] == ["Describe", "StreamBatches", "SetMixture"]


def test_standard_token_credentials_work(server, ca):
    """What grpcurl -H / any gRPC client's access-token credentials send is accepted."""
    creds = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials(root_certificates=ca), grpc.access_token_call_credentials(TOKEN))
    with grpc.secure_channel(server.target, creds) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        reply = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=60)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


# -- the client: token from token= or the environment, TLS ----------------------------------------


def first_batches(stream: PackedStream, n: int = 2) -> list:
    with stream:
        return [next(stream) for _ in range(n)]


def test_client_token_argument(server, certs):
    batches = first_batches(PackedStream(server.target, batch_rows=4, token=TOKEN, tls_ca=certs["cert"]))
    assert [b.row_index.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_client_token_from_environment(server, certs, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    batches = first_batches(PackedStream(server.target, world_size=2, rank=1, batch_rows=3, tls_ca=certs["cert"]))
    assert [b.row_index.tolist() for b in batches] == [[1, 3, 5], [7, 9, 11]]


@pytest.mark.parametrize("env_token, token", [
    pytest.param(None, None, id="none"),
    pytest.param("wrong-token", None, id="wrong-env"),
    pytest.param(TOKEN, "wrong-token", id="argument-overrides-env"),
])
def test_client_without_the_right_token_gets_unauthenticated(server, certs, monkeypatch, env_token, token):
    if env_token is not None:
        monkeypatch.setenv(TOKEN_ENV, env_token)
    stream = PackedStream(server.target, token=token, tls_ca=certs["cert"], retry_timeout_s=10)
    with stream, pytest.raises(StreamError) as err:
        next(stream)
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_plaintext_client_against_tls_server_gets_no_data(server):
    with grpc.insecure_channel(server.target) as plain:
        code, _, raw = describe(plain)
        assert code != OK and raw is None
        code, _, got = stream_batches(plain, request())
        assert code != OK and got == []
    # The client says what is wrong within seconds, with its default 5 minutes of retries.
    start = time.monotonic()
    with PackedStream(server.target, token=TOKEN) as stream, pytest.raises(StreamError) as err:
        next(stream)
    assert time.monotonic() - start < 30 and "speaks TLS and this client plaintext" in str(err.value)


def test_a_client_started_before_its_tls_server_still_says_what_is_wrong(certs):
    """The TLS probe ran once, at the first retries: a trainer started before the server (nothing
    listening yet) used it up, and the mismatch was then retried for the full retry timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    target = "127.0.0.1:%d" % listener.getsockname()[1]
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(certs["cert"], certs["key"])
    stop = threading.Event()

    def serve_handshakes() -> None:  # a TLS endpoint that is not the plaintext client expects
        time.sleep(3.0)
        listener.listen()
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                with tls.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                conn.close()

    thread = threading.Thread(target=serve_handshakes, daemon=True)
    thread.start()
    start = time.monotonic()
    try:
        with PackedStream(target, retry_timeout_s=120) as stream, pytest.raises(StreamError) as err:
            next(stream)
    finally:
        stop.set()
        thread.join(5)
        listener.close()
    assert "speaks TLS and this client plaintext" in str(err.value)
    assert 3.0 < time.monotonic() - start < 60


def test_client_trusting_another_ca_gets_no_data(server, certs):
    other = grpc.ssl_channel_credentials(root_certificates=certs["other_ca"].read_bytes())
    with grpc.secure_channel(server.target, other) as ch:
        code, _, raw = describe(ch)
        assert code == grpc.StatusCode.UNAVAILABLE and raw is None
        code, _, got = stream_batches(ch, request())
        assert code != OK and got == []
    start = time.monotonic()
    with PackedStream(server.target, token=TOKEN, tls_ca=certs["other_ca"]) as stream, \
            pytest.raises(StreamError) as err:
        next(stream)
    assert time.monotonic() - start < 30 and "not signed by the CA in tls_ca" in str(err.value)


# -- the server's own request checks ----------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, message",
    [
        pytest.param({"rank": 2, "world_size": 2}, "rank", id="rank-equals-world-size"),
        pytest.param({"rank": 5, "world_size": 2}, "rank", id="rank-above-world-size"),
        pytest.param({"rank": 0, "world_size": 0}, "world_size", id="world-size-0"),
        pytest.param({"batch_rows": 0}, "batch_rows", id="batch-rows-0"),
        pytest.param({"batch_rows": MAX_BATCH_ROWS + 1}, "--max-batch-rows", id="batch-rows-above-max"),
        pytest.param({"world_size": 5, "batch_rows": 52}, "--buffer-rows", id="step-too-big-for-buffer"),
    ],
)
def test_invalid_requests_are_refused(channel, fields, message):
    code, details, got = stream_batches(channel, request(**fields))
    assert (code, got) == (grpc.StatusCode.INVALID_ARGUMENT, []), details
    assert message in details


def test_largest_valid_step_is_accepted(channel):
    # world_size * batch_rows == buffer_rows // 2 and batch_rows == --max-batch-rows: the limits themselves.
    code, details, got = stream_batches(channel, request(rank=3, world_size=4, batch_rows=MAX_BATCH_ROWS), take=1)
    assert code == OK and len(got) == 1, details
    rows = np.frombuffer(packfeed_pb2.PackedBatch.FromString(got[0]).row_index, "<i8")
    assert rows.tolist() == list(range(3, 4 * MAX_BATCH_ROWS, 4))


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"expected_config_hash": "0" * 16}, id="config-hash"),
        pytest.param({"expected_seq_len": SEQ_LEN + 1}, id="seq-len"),
        pytest.param({"expected_seq_len": 0}, id="seq-len-zero-is-set"),
    ],
)
def test_another_stream_than_expected_is_a_failed_precondition(channel, fields):
    code, details, got = stream_batches(channel, request(**fields))
    assert (code, got) == (grpc.StatusCode.FAILED_PRECONDITION, []), details


def test_matching_expectations_are_accepted(channel):
    info = stream_info(channel)
    req = request(expected_config_hash=info.config_hash, expected_seq_len=info.seq_len)
    code, details, got = stream_batches(channel, req, take=1)
    assert code == OK and len(got) == 1, details


def malformed_requests() -> list[bytes]:
    """Random byte strings that protobuf refuses to parse as a StreamRequest or a DescribeRequest."""
    rng = random.Random(7)
    out = []
    while len(out) < 3:
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        refused = 0
        for message_type in (packfeed_pb2.StreamRequest, packfeed_pb2.DescribeRequest):
            try:
                message_type.FromString(data)
            except DecodeError:
                refused += 1
        if refused == 2:
            out.append(data)
    return out


def test_malformed_and_oversized_requests_are_refused_and_the_server_keeps_serving(channel):
    for data in malformed_requests():
        code, details, got = stream_batches(channel, data)
        assert (code, got) == (grpc.StatusCode.INVALID_ARGUMENT, []), (data, details)
        assert "malformed" in details
        code, _, raw = describe(channel, request=data)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and raw is None

    oversized = request(expected_config_hash="x" * (MAX_REQUEST_BYTES + 1024))
    assert len(oversized) > MAX_REQUEST_BYTES
    code, details, got = stream_batches(channel, oversized)
    assert (code, got) == (grpc.StatusCode.RESOURCE_EXHAUSTED, []), details
    code, _, raw = describe(channel, request=b"\x00" * (MAX_REQUEST_BYTES + 1))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and raw is None

    code, details, got = stream_batches(channel, request(cursor=8, batch_rows=4), take=2)
    assert code == OK, details
    cursors = [packfeed_pb2.PackedBatch.FromString(m).cursor for m in got]
    assert cursors == [12, 16]
    assert stream_info(channel).seq_len == SEQ_LEN


def test_whole_stream_over_tls_then_cursor_past_the_end(server, certs, channel):
    """Reads the stream to its end (so the server knows its length), checks it, then asks past it."""
    world, b = 1, MAX_BATCH_ROWS
    seen: list[int] = []
    padding: list[int] = []
    steps = []
    with PackedStream(server.target, world_size=world, batch_rows=b, token=TOKEN, tls_ca=certs["cert"]) as stream:
        for batch in stream:
            seen.extend(batch.row_index[~batch.padding_rows].tolist())
            padding.extend(batch.row_index[batch.padding_rows].tolist())
            steps.append(batch.cursor)
    total = stream_info(channel).total_rows
    assert total > BUFFER_ROWS, "the stream must be longer than the server's buffer"
    assert seen == list(range(total)), "every row exactly once, in order"
    assert all(i >= total for i in padding) and len(set(padding)) == len(padding)
    assert steps[-1] == total

    for cursor in (total + 1, total + world * b, 10**12):
        code, details, got = stream_batches(channel, request(cursor=cursor))
        assert (code, got) == (grpc.StatusCode.OUT_OF_RANGE, []), (cursor, details)
        assert str(total) in details
    code, details, got = stream_batches(channel, request(cursor=total))
    assert (code, got) == (OK, []), details  # at the end: nothing left, not an error

    late = PackedStream(server.target, token=TOKEN, tls_ca=certs["cert"],
                        state={"version": 1, "cursor": total + 4, "step": 0})
    with late, pytest.raises(StreamError) as err:
        next(late)
    assert err.value.code == grpc.StatusCode.OUT_OF_RANGE


# -- the CLI refuses an open, unauthenticated server -------------------------------------------------


def serve_command(*flags: str) -> list[str]:
    return [sys.executable, "-m", "packfeed.service.cli", "serve", *demo_args(seq_len=SEQ_LEN), *flags]


def test_cli_refuses_non_loopback_without_token_before_starting_ray(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env["RAY_ADDRESS"] = ""
    started = time.monotonic()
    proc = subprocess.run(
        serve_command("--host", "0.0.0.0", "--port", "0", "--state-dir", str(tmp_path)),
        check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--auth-token-file" in proc.stderr and "--insecure" in proc.stderr and "0.0.0.0" in proc.stderr
    assert "Ray:" not in proc.stderr and "listening on" not in proc.stderr, "it started Ray or the server"
    assert elapsed < 60, f"took {elapsed:.0f}s to refuse"


def test_a_bad_sample_under_strict_is_a_clear_error_and_the_server_turns_not_serving(tmp_path):
    good = '{"text": "a short story about a lantern and a harbor"}\n'
    data = tmp_path / "broken.jsonl"
    data.write_text(good * 40 + '{"text": "no closing brace"\n' + good * 40)
    args = [str(data), "--tokenizer", demo_args()[demo_args().index("--tokenizer") + 1], "--seq-len", "64",
            "--strict", "--num-workers", "1"]
    with ServerProcess(args, log=tmp_path / "serve.log", state_dir=tmp_path / "state", env={"RAY_ADDRESS": ""}) as server:
        with pytest.raises(StreamError) as err, PackedStream(server.target, batch_rows=2) as stream:
            list(stream)
        assert err.value.code == grpc.StatusCode.INTERNAL
        assert "broken.jsonl" in err.value.details and "41" in err.value.details, err.value.details
        with grpc.insecure_channel(server.target) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
    # With --exit-on-failure a failed pipeline ends the server with exit 1 and its reason:
    # test_serve_robustness.py::test_a_failed_reader_under_exit_on_failure_exits_1_saying_why.
