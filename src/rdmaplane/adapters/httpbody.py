"""Request bodies read with a size bound, for every HTTP service (extender, webhook): a body
over the bound is refused before it is held in memory."""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope

from rdmaplane.core.errors import InputError


class BodyTooLarge(InputError):
    """The body is larger than the service accepts (answer 413 and close the connection:
    the rest of the body may still be on its way)."""


async def read_body(request: Request, limit: int) -> bytes:
    return await read_asgi_body(request.scope, request.receive, limit)


async def read_asgi_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The body of an ASGI request (plain ASGI routes have no `Request`); ClientDisconnect
    when the client goes away before sending all of it."""
    declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(
            f"request body of {declared.decode()} bytes exceeds the limit of {limit} bytes"
        )
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
