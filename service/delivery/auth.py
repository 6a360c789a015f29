"""Who may call ``packfeed serve``: the bearer token, checked on every call (an interceptor,
constant-time comparison); a refused call answers UNAUTHENTICATED and is reported to the
service, which counts and logs it (server.py). TLS is the channel's (listen_checks.py).
"""

from __future__ import annotations

import hmac
from typing import Callable

import grpc
from packfeed.client.transport import AUTH_HEADER, TOKEN_ENV


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call without ``authorization: Bearer <token>`` (UNAUTHENTICATED) and
    reports each refusal to ``on_refused(reason, method, peer)``."""

    def __init__(self, token: str, on_refused: Callable[[str, str, str], None] = lambda *_: None) -> None:
        self._expected = f"Bearer {token}".encode()
        self._on_refused = on_refused

    def intercept_service(self, continuation, handler_call_details):
        got = dict(handler_call_details.invocation_metadata or ()).get(AUTH_HEADER)
        if got is not None and hmac.compare_digest(got.encode(), self._expected):
            return continuation(handler_call_details)
        reason = "missing bearer token" if got is None else "wrong bearer token"
        # Unknown methods are refused the same way: no token, no hint of which methods exist.
        handler = continuation(handler_call_details) or grpc.unary_unary_rpc_method_handler(None)
        method = handler_call_details.method

        def refuse(context: grpc.ServicerContext) -> None:
            self._on_refused(reason, method, context.peer())

        return _deny(handler, f"{reason}: pass the server's token (PackedStream(token=...) or ${TOKEN_ENV})", refuse)


def _deny(handler: grpc.RpcMethodHandler, message: str,
          before: Callable[[grpc.ServicerContext], None]) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that only answers UNAUTHENTICATED (after
    ``before(context)``: the peer is known only inside the call)."""

    def abort(request, context):
        before(context)
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds: dict[tuple[bool, bool], Callable] = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(abort)
