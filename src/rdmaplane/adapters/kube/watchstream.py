"""A watch's event lines straight off the connection, for a watch whose events come in
thousands (the scheduler extender's watch of every pod).

lightkube's watch takes every chunk the API server sends (one per event) through httpx2,
httpcore2, h11 and anyio, and then a line iterator, a text decoder and a dict per object: for
a watch of every pod of a busy cluster that costs more CPU than what the reader does with the
events (bench/cluster.py). Here the connection is asyncio's (TLS included), the response is
parsed by httptools (llhttp, in C) and the lines are split from the de-chunked body. Where to
connect, the CA, the client certificate and the credentials are lightkube's own, read from the
same kubeconfig (`AsyncClient.config`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlencode, urlsplit

import httptools
import httpx2
from lightkube.config.client_adapter import user_auth, verify_cluster
from lightkube.config.kubeconfig import SingleConfig

from rdmaplane.core.errors import RdmaplaneError

CONNECT_TIMEOUT_S = 10.0  # lightkube's own default
READ_SIZE = 1 << 16
ERROR_BODY_BYTES = 2_000  # of a refusal's body, in the error
# One event's line at most: the API server stores objects of 1.5 MiB at most (etcd's default
# request limit), so a longer line is not a watch event, and must not grow without end.
MAX_EVENT_BYTES = 16 << 20


class WatchRefused(RdmaplaneError):
    """The API server answered the watch with an error status (the message has its body)."""


class WatchEventTooLarge(RdmaplaneError):
    """A watch line longer than `MAX_EVENT_BYTES` without its end."""


class _Response:
    """httptools' callbacks: the status, the de-chunked body split into lines, the end."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.lines: list[bytes] = []
        self.rest = b""
        self.headed = False
        self.done = False

    def on_headers_complete(self) -> None:
        self.headed = True

    def on_body(self, body: bytes) -> None:
        *lines, self.rest = (self.rest + body).split(b"\n")
        self.lines.extend(lines)

    def on_message_complete(self) -> None:
        self.done = True

    def status(self) -> int:
        return int(self.parser.get_status_code())


async def watch_lines(
    config: SingleConfig, path: str, params: Mapping[str, str]
) -> AsyncIterator[bytes]:
    """The non-empty lines of `GET path?params` (a watch: `watch=true` in `params`) until the
    server ends the response; `WatchRefused` when it answers with an error status."""
    server = urlsplit(config.cluster.server)
    tls = server.scheme == "https"
    host = server.hostname or "localhost"
    port = server.port or (443 if tls else 80)
    context: ssl.SSLContext | None = None
    if tls and config.user is not None:
        context = verify_cluster(config.cluster, config.user, config.abs_file, trust_env=False)
    elif tls:
        context = ssl.create_default_context()
    head = await _request_head(config, server.netloc, server.path.rstrip("/") + path, params)
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=context, server_hostname=host if tls else None),
        CONNECT_TIMEOUT_S,
    )
    try:
        writer.write(head)
        response = _Response()
        while not response.done:
            data = await reader.read(READ_SIZE)
            if not data:
                return  # the server closed the connection: the watch is over
            response.parser.feed_data(data)
            if response.headed and response.status() != 200:
                await _refused(reader, response)
            if len(response.rest) > MAX_EVENT_BYTES:
                raise WatchEventTooLarge(
                    f"watch {path}: an event of over {MAX_EVENT_BYTES >> 20} MiB without its end"
                    " (the API server's objects are 1.5 MiB at most)"
                )
            lines, response.lines = response.lines, []
            for line in lines:
                if line:
                    yield line
    finally:
        writer.close()


async def _request_head(
    config: SingleConfig, netloc: str, path: str, params: Mapping[str, str]
) -> bytes:
    """The request line and headers, with the credentials lightkube would send."""
    headers = {"Host": netloc, "Accept": "application/json", "User-Agent": "rdmaplane"}
    auth = user_auth(config.user)
    if auth is not None:  # a token, a token file (read now), an exec plugin, basic auth
        flow = auth.async_auth_flow(httpx2.Request("GET", config.cluster.server))
        signed = await flow.__anext__()
        await flow.aclose()
        headers.update((k, v) for k, v in signed.headers.items() if k.lower() == "authorization")
    lines = [f"GET {path}?{urlencode(params)} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _refused(reader: asyncio.StreamReader, response: _Response) -> None:
    """Read what the server says with its error status (a little of it), then raise."""
    while not response.done and len(response.rest) < ERROR_BODY_BYTES:
        data = await reader.read(READ_SIZE)
        if not data:
            break
        response.parser.feed_data(data)
    body = b"\n".join([*response.lines, response.rest])[:ERROR_BODY_BYTES]
    raise WatchRefused(f"watch refused: HTTP {response.status()}: {body.decode(errors='replace')}")
