"""uvicorn as the extender runs it: kube-scheduler's two calls answered in the protocol, and
each response leaving in one send.

Direct calls: `/filter` and `/prioritize` are answered by the HTTP protocol itself once the
body is in, without an ASGI cycle (a scope, a task, receive and send coroutines, header
checks): on this machine uvicorn's per-request machinery cost about 90 µs of CPU beside a bare
asyncio protocol's 20 µs, twice per pod, on cores kube-scheduler shares (bench/cluster.py).
Anything unusual (another method or path, no Content-Length, `Expect: 100-continue`, a body
over the limit, a request behind one still in its ASGI cycle) goes the ASGI way, which answers
every case the same (`tests/integration/test_extender_direct.py`).

One send: uvicorn writes a response's status line and headers, then its body, as two writes on
the socket. With TCP_NODELAY (which asyncio sets, and which a request/response protocol needs:
Nagle would hold the body until the headers are acknowledged) each write is a send of its own,
and on loopback each send wakes kube-scheduler to read half a response. The transport here
holds writes made within one event-loop step and sends them together at the end of that step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

Answer = tuple[int, bytes, dict[str, str]]  # status, JSON body, extra headers


@dataclass(frozen=True, slots=True)
class DirectCalls:
    """The calls a protocol answers itself: path → the answer to a whole request body (never
    raising); the largest body it takes (larger ones go the ASGI way, which refuses them); and
    what to do of a request whose client left before its body was in (path, seconds since its
    headers)."""

    routes: Mapping[str, Callable[[bytes], Answer]]
    limit: int
    abandoned: Callable[[str, float], None]


class OneSendTransport:
    """A transport whose writes within one event-loop step leave as one send; everything else
    is the wrapped transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))

    def write_now(self, data: bytes) -> None:
        """`data` after whatever is pending, in one send now."""
        if self._pending:
            data = b"".join([*self._pending, data])
            self._pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def _flush(self) -> None:
        if self._pending:
            self.write_now(b"")

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneSendHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a `OneSendTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        one_send: Any = OneSendTransport(transport, self.loop)
        super().connection_made(one_send)


class DirectCallsProtocol(OneSendHttpProtocol):
    """The one-send protocol answering `calls` itself (see the module's docstring)."""

    calls = DirectCalls({}, 0, lambda path, seconds: None)  # set per server by `server_config`

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._direct: Callable[[bytes], Answer] | None = None
        self._body: list[bytes] = []

    def on_headers_complete(self) -> None:
        self._direct = self._direct_route()
        if self._direct is None:
            super().on_headers_complete()
        else:
            self._since = time.perf_counter()

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_direct", None) is not None:
            self.calls.abandoned(self.url.decode("latin-1"), time.perf_counter() - self._since)
            self._direct = None
        super().connection_lost(exc)

    def _direct_route(self) -> Callable[[bytes], Answer] | None:
        route = self.calls.routes.get(self.url.decode("latin-1"))
        if route is None or self.parser.get_method() != b"POST" or self.expect_100_continue:
            return None
        if self.cycle is not None and not self.cycle.response_complete:
            return None  # behind a request still in its ASGI cycle: keep the order
        length = next((v for k, v in self.headers if k == b"content-length"), b"")
        return route if length.isdigit() and int(length) <= self.calls.limit else None

    def on_body(self, body: bytes) -> None:
        if self._direct is None:
            super().on_body(body)
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        direct = self._direct
        if direct is None:
            super().on_message_complete()
            return
        self._direct = None
        status, content, extra = direct(b"".join(self._body))
        self._body = []
        keep_alive = self.parser.should_keep_alive()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(content))
        for header, text in extra.items():
            head += [header.lower().encode(), b": ", text.encode(), b"\r\n"]
            keep_alive = keep_alive and not (header.lower() == "connection" and text == "close")
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head += [b"\r\n", content]
        if self.access_log:
            self.access_logger.info(
                '%s:%d - "POST %s HTTP/%s" %d',
                *(self.client or ("-", 0)),
                self.url.decode("latin-1"),
                self.parser.get_http_version(),
                status,
            )
        self.transport.write_now(b"".join(head))  # type: ignore[attr-defined]
        if keep_alive:
            self.on_response_complete()
        else:
            self.transport.close()


def server_config(app: Any, direct: DirectCalls | None = None, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for the extender's app (`options` as uvicorn.Config takes
    them), with the one-send protocol, answering `direct` itself. `X-Forwarded-For` is not
    read: the client is the peer (`/debug/*` is answered by where a request comes from), and
    every request is spared the proxy-headers middleware."""
    protocol: type[OneSendHttpProtocol] = OneSendHttpProtocol
    if direct is not None:
        protocol = type("DirectCallsProtocol", (DirectCallsProtocol,), {"calls": direct})
    return uvicorn.Config(app, http=protocol, proxy_headers=False, **options)
