"""A proxy in front of the S3 server of support/s3.py that counts requests and injects faults.

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
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

_ERROR_BODIES = {
    "503": (503, "Service Unavailable", "SlowDown", "Please reduce your request rate."),
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
    "403": (403, "Forbidden", "AccessDenied", "Access Denied"),
}
FAULT_MODES = (*_ERROR_BODIES, "drop", "cut", "stall")
STALL_S = 5.0  # a stalled request is held this long, then its connection reset
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te", "trailer"}


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
