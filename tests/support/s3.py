"""A real S3 server on loopback, and a proxy in front of it that counts and injects faults.

``S3Server`` runs moto's S3 server (``python -m moto.server``) as a subprocess on
127.0.0.1, a free port; it answers ~0.3 s after the start. Everything packfeed does on a store
goes through the real code path: pyarrow's S3 filesystem, pointed at the server by
``AWS_ENDPOINT_URL``. Test data is put there with boto3, a client independent of the code
under test.

``FaultProxy`` is a threaded HTTP/1.1 proxy (stdlib only) between the client and the server.
It records every request (method, bucket/key, query, status, bytes each way) and can be told
to answer the next N matching requests itself: ``503`` (S3's SlowDown XML), ``500``
(InternalError), ``403`` (AccessDenied), ``drop`` (read the request, then reset the
connection without a reply: curl resends it once by itself on a kept-alive connection), ``cut``
(forward it, send the status, the headers and half the body, then close: nothing resends it) or
``stall`` (read the request, send nothing for ``STALL_S``
seconds, then reset). A LIST is a GET on a bucket with a ``list-type`` or ``prefix``
query. ``storm`` throttles until told otherwise, as a store under load does: bursts of 503
SlowDown on every object (the first 4 of every 10 GETs of a key) and every 5th GET's connection
dropped (before the answer and within it, by turns); the proxy records each request's ``Range`` and
the most requests one key had in flight at once.

Fixtures (import them into a conftest: ``from support.s3 import s3, s3_faulty, ...``):
``s3_server`` and ``s3_proxy`` are session-scoped (one server, one proxy per conftest
that imports them); ``s3`` points the environment at the server directly, ``s3_faulty`` at the
proxy with its record cleared and no fault pending. Both yield the server, whose ``bucket()``
gives a fresh bucket name per call, so tests never see each other's keys.
"""

from __future__ import annotations

import ctypes
import http.client
import itertools
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterator

import pytest

STARTUP_TIMEOUT_S = 30.0
_ERROR_BODIES = {
    "503": (503, "Service Unavailable", "SlowDown", "Please reduce your request rate."),
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
    "403": (403, "Forbidden", "AccessDenied", "Access Denied"),
}
FAULT_MODES = (*_ERROR_BODIES, "drop", "cut", "stall")
STALL_S = 5.0  # a stalled request is held this long, then its connection reset
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te", "trailer"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_answering(url: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the S3 server exited with status {proc.returncode} before answering") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"no answer from {url} within {STARTUP_TIMEOUT_S:.0f} s") from None
            time.sleep(0.02)


def _die_with_parent() -> None:
    """In the server's process: end it when the test process ends, even killed (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class S3Server:
    """moto's S3 server as a subprocess on 127.0.0.1 (``start()``/``stop()``, or ``with``)."""

    def __init__(self) -> None:
        self.port = 0
        self._proc: subprocess.Popen | None = None
        self._names = itertools.count()
        self._client = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "S3Server":
        self.port = free_port()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent,
        )
        _wait_until_answering(f"{self.endpoint}/moto-api/", self._proc)
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def client(self):
        """A boto3 S3 client talking to the server directly (never through the proxy)."""
        if self._client is None:
            import boto3

            self._client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                                        aws_access_key_id="testing", aws_secret_access_key="testing")
        return self._client

    def bucket(self, stem: str = "pf") -> str:
        """A new, empty bucket with a name no other test used."""
        name = f"{stem}-{os.getpid()}-{next(self._names)}"
        self.client.create_bucket(Bucket=name)
        return name

    def put(self, bucket: str, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)
        return f"s3://{bucket}/{key}"

    def upload_tree(self, local_dir: str | Path, bucket: str, prefix: str = "") -> list[str]:
        """Put every file under ``local_dir`` at ``prefix`` + its relative path; returns the keys."""
        root = Path(local_dir)
        keys = []
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            key = prefix + path.relative_to(root).as_posix()
            self.put(bucket, key, path.read_bytes())
            keys.append(key)
        return keys

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The environment that points AWS clients at ``endpoint`` (default: this server) with
        dummy credentials, and keeps them off a developer's profile and the EC2 metadata service."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }


@dataclass(frozen=True)
class Request:
    """One request seen by the proxy. ``status`` 0: the connection was dropped."""

    method: str
    bucket: str
    key: str
    query: str
    status: int
    bytes_in: int  # request body
    bytes_out: int  # response body
    range: str = ""  # the Range header, if any

    @property
    def is_list(self) -> bool:
        return _is_list(self.method, self.key, self.query)


def _is_list(method: str, key: str, query: str) -> bool:
    params = urllib.parse.parse_qs(query, keep_blank_values=True)
    return method == "GET" and not key and ("list-type" in params or "prefix" in params)


@dataclass
class _Fault:
    mode: str
    remaining: int
    matches: Callable[[str, str, str, str], bool]  # (method, bucket, key, query)


@dataclass
class _Storm:
    """Of the requests of ``method`` on an object: the first ``burst`` of every ``every`` on one
    key answered 503 SlowDown; every ``drop_every``-th of them all (0: none) dropped, ``drop`` and
    ``cut`` by turns. ``seen``: how many of each key so far; ``total``: of them all."""

    method: str
    every: int
    burst: int
    drop_every: int
    seen: dict[str, int]
    total: int = 0

    def take(self, method: str, key: str) -> str | None:
        if method != self.method:
            return None
        self.total += 1
        n = self.seen.get(key, 0)
        self.seen[key] = n + 1
        if self.drop_every and self.total % self.drop_every == 0:
            return ("drop", "cut")[self.total // self.drop_every % 2]
        return "503" if n % self.every < self.burst else None


class FaultProxy:
    """A counting, fault-injecting HTTP proxy on 127.0.0.1 in front of ``upstream_port``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._lock = threading.Lock()
        self._requests: list[Request] = []
        self._last_request_at = time.monotonic()
        self._faults: list[_Fault] = []
        self._storm: _Storm | None = None
        self._in_flight: dict[str, int] = {}
        self.peak_in_flight_per_key = 0  # the most requests on one key the proxy held at once
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "FaultProxy":
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def reset(self) -> None:
        """Forget what was seen and every pending fault."""
        with self._lock:
            self._requests.clear()
            self._faults.clear()
            self._storm = None
            self.peak_in_flight_per_key = 0

    def wait_quiet(self, quiet_s: float = 1.0, timeout_s: float = 30.0) -> None:
        """Wait until no request has been answered for ``quiet_s``: requests a killed process
        sent before it died are then counted before a ``reset``, not after it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                idle = time.monotonic() - self._last_request_at
            if idle >= quiet_s:
                return
            time.sleep(quiet_s - idle)
        raise AssertionError(f"the S3 proxy still answers requests after {timeout_s} s")

    def fail_next(self, n: int, mode: str, *, method: str | None = None, key: str | None = None,
                  lists: bool | None = None) -> None:
        """Answer the next ``n`` requests that match (``method``; ``key`` exact; ``lists``: only
        LISTs, or only non-LISTs) with ``mode`` instead of forwarding them."""
        if mode not in FAULT_MODES:
            raise ValueError(f"fault mode {mode!r}: one of {FAULT_MODES}")

        def matches(m: str, b: str, k: str, q: str) -> bool:
            return ((method is None or m == method) and (key is None or k == key)
                    and (lists is None or lists == _is_list(m, k, q)))

        with self._lock:
            self._faults.append(_Fault(mode, n, matches))

    def storm(self, *, every: int = 10, burst: int = 4, drop_every: int = 5, method: str = "GET") -> None:
        """Until ``reset`` (or ``calm``): of the requests of ``method`` on objects, the first
        ``burst`` of every ``every`` on each key answered 503 SlowDown, and every
        ``drop_every``-th of them all (0: none) dropped, before its answer and within it by turns
        (``drop``, ``cut``). A ``fail_next`` fault pending for a request is answered first."""
        if not 0 <= burst <= every or drop_every < 0:
            raise ValueError(f"storm: need 0 <= burst ({burst}) <= every ({every}) and drop_every >= 0")
        with self._lock:
            self._storm = _Storm(method, every, burst, drop_every, {})

    def calm(self) -> None:
        """End the ``storm`` (what was recorded stays)."""
        with self._lock:
            self._storm = None

    def pending_faults(self) -> int:
        with self._lock:
            return sum(f.remaining for f in self._faults)

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def count(self, method: str | None = None, *, key: str | None = None, lists: bool | None = None,
              status: int | None = None) -> int:
        return len(self.select(method, key=key, lists=lists, status=status))

    def select(self, method: str | None = None, *, key: str | None = None, lists: bool | None = None,
               status: int | None = None) -> list[Request]:
        return [r for r in self.requests
                if (method is None or r.method == method) and (key is None or r.key == key)
                and (lists is None or r.is_list == lists) and (status is None or r.status == status)]

    def bytes_out(self, method: str | None = None, *, key: str | None = None) -> int:
        return sum(r.bytes_out for r in self.select(method, key=key))

    def _take_fault(self, method: str, bucket: str, key: str, query: str) -> str | None:
        with self._lock:
            for fault in self._faults:
                if fault.remaining > 0 and fault.matches(method, bucket, key, query):
                    fault.remaining -= 1
                    return fault.mode
            if self._storm is not None and key:  # an object's request, not a bucket's (a LIST)
                return self._storm.take(method, f"{bucket}/{key}")
        return None

    def _enter(self, bucket: str, key: str) -> None:
        with self._lock:
            n = self._in_flight[f"{bucket}/{key}"] = self._in_flight.get(f"{bucket}/{key}", 0) + 1
            if key:
                self.peak_in_flight_per_key = max(self.peak_in_flight_per_key, n)

    def _leave(self, bucket: str, key: str) -> None:
        with self._lock:
            self._in_flight[f"{bucket}/{key}"] -= 1

    def _record(self, request: Request) -> None:
        with self._lock:
            self._requests.append(request)
            self._last_request_at = time.monotonic()


def _split_target(target: str) -> tuple[str, str, str]:
    """Path-style request target -> (bucket, key, query)."""
    parts = urllib.parse.urlsplit(target)
    bucket, _, key = urllib.parse.unquote(parts.path).lstrip("/").partition("/")
    return bucket, key, parts.query


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        upstream: http.client.HTTPConnection | None = None

        def setup(self) -> None:
            super().setup()
            # headers and body go out in two writes: without this, Nagle's algorithm and the
            # client's delayed ACK hold every answer ~40 ms
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *args) -> None:  # quiet
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                raw = bytearray()
                while True:  # forward the chunked stream as it came (aws-chunked signs it)
                    line = self.rfile.readline()
                    raw += line
                    size = int(line.split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while True:  # trailers, then the empty line
                            trailer = self.rfile.readline()
                            raw += trailer
                            if trailer in (b"\r\n", b"\n", b""):
                                return bytes(raw)
                    raw += self.rfile.read(size + 2)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _handle(self) -> None:
            bucket, key, query = _split_target(self.path)
            proxy._enter(bucket, key)
            try:
                self._answer(bucket, key, query)
            finally:
                proxy._leave(bucket, key)

        def _answer(self, bucket: str, key: str, query: str) -> None:
            body = self._body()
            asked = self.headers.get("Range", "")
            mode = proxy._take_fault(self.command, bucket, key, query)
            if mode in ("drop", "stall"):
                proxy._record(Request(self.command, bucket, key, query, 0, len(body), 0, asked))
                if mode == "stall":
                    time.sleep(STALL_S)
                # RST instead of FIN: the client sees "connection reset by peer"
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
                return
            if mode == "cut":
                status, headers, payload = self._forward(body)
                proxy._record(Request(self.command, bucket, key, query, 0, len(body), len(payload) // 2, asked))
                self.send_response(status)
                for name, value in headers:
                    if name.lower() not in _HOP_BY_HOP:
                        self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload[:len(payload) // 2])
                self.wfile.flush()
                # a FIN after the part sent (an RST could discard it unsent): the client has an answer cut short
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_WR)
                return
            if mode is not None:
                status, reason, code, message = _ERROR_BODIES[mode]
                payload = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                           f"<Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>").encode()
                # recorded before the answer: a client that has its answer finds it recorded
                proxy._record(Request(self.command, bucket, key, query, status, len(body), len(payload), asked))
                self.send_response(status, reason)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                return
            status, headers, payload = self._forward(body)
            proxy._record(Request(self.command, bucket, key, query, status, len(body),
                                  0 if self.command == "HEAD" else len(payload), asked))
            self.send_response(status)
            for name, value in headers:
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            length = dict((n.lower(), v) for n, v in headers).get("content-length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
            headers = {n: v for n, v in self.headers.items() if n.lower() not in ("connection", "proxy-connection")}
            for attempt in range(2):  # the kept-alive upstream connection may have been closed
                if self.upstream is None or attempt:
                    self.upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                    self.upstream.connect()
                    self.upstream.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    self.upstream.request(self.command, self.path, body=body, headers=headers)
                    response = self.upstream.getresponse()
                    return response.status, response.getheaders(), response.read()
                except (ConnectionError, http.client.HTTPException):
                    if attempt:
                        raise
            raise AssertionError("unreachable")

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

    return Handler


# ---- pytest fixtures ----------------------------------------------------------------------------
@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture(scope="session")
def s3_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3_server.port).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The environment points at the S3 server directly."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return s3_server


@pytest.fixture
def s3_faulty(s3_server: S3Server, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The environment points at the proxy (``s3_proxy``: cleared, no fault pending)."""
    for name, value in s3_server.env(s3_proxy.endpoint).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    s3_proxy.reset()
    yield s3_server
    s3_proxy.reset()
