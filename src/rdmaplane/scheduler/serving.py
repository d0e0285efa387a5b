"""uvicorn as the extender runs it: each response leaves in one send.

uvicorn writes a response's status line and headers, then its body, as two writes on the
socket. With TCP_NODELAY (which asyncio sets, and which a request/response protocol needs:
Nagle would hold the body until the headers are acknowledged) each write is a send of its own,
and on loopback each send wakes kube-scheduler to read half a response. Twice per call, two
calls per pod, that cost the extender more CPU than deciding (measured in bench/cluster.py).
The transport here holds writes made within one event-loop step and sends them together at
the end of that step.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

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


def server_config(app: Any, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for the extender's app (`options` as uvicorn.Config takes
    them), with the one-send protocol. `X-Forwarded-For` is not read: the client is the peer
    (`/debug/*` is answered by where a request comes from), and every request is spared the
    proxy-headers middleware."""
    return uvicorn.Config(app, http=OneSendHttpProtocol, proxy_headers=False, **options)
