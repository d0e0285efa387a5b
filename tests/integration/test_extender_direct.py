"""kube-scheduler's calls answered in the HTTP protocol (`serving.DirectCallsProtocol`) against
the same calls through ASGI: byte for byte the same replies (but the time headers), over raw
sockets, for every kind of request a client may send; and the direct path really taken."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import orjson
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from rdmaplane.core.settings.scheduler import ExtenderSettings
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.root import create_app
from tests.scheduler_helpers import EXAMPLE_NODES, example_cluster, pod, serve

LIMIT = 4096
POD = pod("p", 2, 2)
FILTER = orjson.dumps({"Pod": POD, "NodeNames": EXAMPLE_NODES})
PASSED = ["paired", "lopsided"]  # "full" has no GPU left, "bare" no NodeResourceTopology
PRIORITIZE = orjson.dumps({"Pod": POD, "NodeNames": PASSED})


class _Seen:
    """An ASGI layer that notes each request's path on its way to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.paths: list[str] = []
        self.state = getattr(app, "state", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.paths.append(scope["path"])
        await self.app(scope, receive, send)


@contextmanager
def _servers(listed: bool = True) -> Iterator[tuple[tuple[str, _Seen], tuple[str, _Seen]]]:
    """(url, app) served with direct calls, and the same served through ASGI only."""
    settings = ExtenderSettings(max_request_bytes=LIMIT)
    with ExitStack() as stack:
        pair = []
        for direct in (True, False):
            app = _Seen(create_app(example_cluster() if listed else ClusterCache(), settings))
            pair.append((stack.enter_context(serve(app, direct=direct)), app))  # type: ignore[arg-type]
        yield pair[0], pair[1]


def _exchange(url: str, data: bytes, replies: int) -> tuple[list[bytes], bool]:
    """Send `data` at once, read `replies` responses; and whether the server then closed."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(data)
        got: list[bytes] = []
        buffer = b""
        while len(got) < replies:
            head, sep, rest = buffer.partition(b"\r\n\r\n")
            length = re.search(rb"content-length: (\d+)", head, re.I) if sep else None
            if length and len(rest) >= int(length[1]):
                got.append(head + sep + rest[: int(length[1])])
                buffer = rest[int(length[1]) :]
                continue
            chunk = conn.recv(65536)
            assert chunk, f"closed after {len(got)} of {replies} replies: {buffer!r}"
            buffer += chunk
        conn.settimeout(1.0)
        try:
            closed = conn.recv(1) == b""
        except TimeoutError:
            closed = False
    return [_timeless(r) for r in got], closed


def _timeless(reply: bytes) -> bytes:
    """A reply without the headers that say when (date) and how long (server-timing)."""
    return re.sub(rb"(?im)^(date|server-timing): [^\r]*\r\n", b"", reply)


def _post(path: str, body: bytes, *headers: str, version: str = "1.1") -> bytes:
    lines = [f"POST {path} HTTP/{version}", "Host: extender", *headers]
    lines.append(f"Content-Length: {len(body)}")
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + body


CASES: dict[str, tuple[bytes, int]] = {
    "filter": (_post("/filter", FILTER), 1),
    "prioritize": (_post("/prioritize", PRIORITIZE), 1),
    "malformed JSON": (_post("/filter", b'{"Pod": '), 1),
    "no pod": (_post("/filter", b'{"NodeNames": []}'), 1),
    "a bad count": (_post("/filter", FILTER.replace(b'"2"', b'"two"', 1)), 1),
    "connection: close": (_post("/filter", FILTER, "Connection: close"), 1),
    "HTTP/1.0": (_post("/filter", FILTER, version="1.0"), 1),
    "keep-alive, three calls": (_post("/filter", FILTER) + _post("/prioritize", PRIORITIZE) * 2, 3),
    "pipelined behind a health check": (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + _post("/filter", FILTER),
        2,
    ),
    "over the limit": (_post("/filter", b"{" * (LIMIT + 1)), 1),
    "a query string": (_post("/filter?x=1", FILTER), 1),
    "a GET": (b"GET /filter HTTP/1.1\r\nHost: x\r\n\r\n", 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_direct_and_asgi_answer_alike(case: str) -> None:
    data, replies = CASES[case]
    with _servers() as ((direct, _), (asgi, _)):
        got = _exchange(direct, data, replies)
        assert got == _exchange(asgi, data, replies)
    answers, closed = got
    first = answers[0].split(b"\r\n", 1)[0]
    assert first.startswith(b"HTTP/1.1 "), answers
    if case in ("connection: close", "HTTP/1.0", "over the limit"):
        assert closed and b"connection: close" in answers[-1]
    else:
        assert not closed


def test_an_unready_cache_is_a_503_either_way() -> None:
    with _servers(listed=False) as ((direct, _), (asgi, _)):
        got = _exchange(direct, CASES["filter"][0], 1)
        assert got == _exchange(asgi, CASES["filter"][0], 1)
    assert got[0][0].startswith(b"HTTP/1.1 503 ") and b"cache not synced yet" in got[0][0]


def test_the_direct_path_is_taken_for_the_scheduler_calls_only() -> None:
    data = b"".join(
        [_post("/filter", FILTER), _post("/prioritize", PRIORITIZE), _post("/filter?x=1", FILTER)]
    )
    with _servers() as ((direct, seen), (asgi, seen_asgi)):
        _exchange(direct, data + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 4)
        _exchange(asgi, data, 3)
    assert seen.paths == ["/filter", "/healthz"]  # the query string's call went the ASGI way
    assert seen_asgi.paths == ["/filter", "/prioritize", "/filter"]


def _reply_body(reply: bytes) -> Any:
    return orjson.loads(reply.partition(b"\r\n\r\n")[2])


def test_the_direct_answers_are_the_extenders() -> None:
    with _servers() as ((direct, _), _):
        (filtered, scored), _closed = _exchange(
            direct, _post("/filter", FILTER) + _post("/prioritize", PRIORITIZE), 2
        )
    assert _reply_body(filtered)["NodeNames"] == PASSED
    assert "bare" in _reply_body(filtered)["FailedAndUnresolvableNodes"]
    assert [h["Host"] for h in _reply_body(scored)] == PASSED
