"""Request bodies read with a size bound, for every HTTP service (extender, webhook): a body
over the bound is refused before it is held in memory."""

from __future__ import annotations

from starlette.requests import Request


class BodyTooLarge(ValueError):
    """The body is larger than the service accepts (answer 413 and close the connection:
    the rest of the body may still be on its way)."""


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
