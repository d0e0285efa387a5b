"""A small asyncio HTTP/1.1 server for `/metrics`, `/healthz` and `/readyz`.

Three GET endpoints do not need a web framework: this keeps the agent's memory and idle CPU
down (the DaemonSet runs on every GPU node). One request per connection, then close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("rdmaplane.services.agent.http")

MAX_HEADER_BYTES = 16384
READ_TIMEOUT_S = 10.0
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
REASONS |= {503: "Service Unavailable"}


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Handler = Callable[[], Response]


class HttpServer:
    def __init__(self, routes: dict[str, Handler], host: str, port: int) -> None:
        self.routes = routes
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            response = self._respond(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            response = Response(400, b"bad request\n")
        except ConnectionError:
            writer.close()
            return
        writer.write(
            f"HTTP/1.1 {response.status} {REASONS.get(response.status, '')}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + response.body
        )
        try:
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _respond(self, head: bytes) -> Response:
        if len(head) > MAX_HEADER_BYTES:
            return Response(400, b"request header too large\n")
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return Response(400, b"bad request line\n")
        method, target = parts[0], parts[1].split("?", 1)[0]
        handler = self.routes.get(target)
        if handler is None:
            return Response(404, f"no such path {target}\n".encode())
        if method != "GET":
            return Response(405, b"only GET\n")
        try:
            return handler()
        except Exception:
            log.exception("handler for %s failed", target)
            return Response(503, b"internal error\n")
