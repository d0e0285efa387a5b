"""`kube.watchstream` against a real HTTP server on loopback (asyncio, chunked like the API
server's watch responses), and the pod watch's decoding of its lines (`scheduler.watch`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
import pytest
from lightkube import KubeConfig

from rdmaplane.adapters.kube import watchstream
from rdmaplane.adapters.kube.watchstream import WatchEventTooLarge, WatchRefused, watch_lines
from rdmaplane.core.pod import Pod
from rdmaplane.services.scheduler.policy import podrequest
from rdmaplane.services.scheduler.watch import WatchEnded, read_pod_event

Reply = Callable[[asyncio.StreamWriter, bytes], Awaitable[None]]


async def _serving(reply: Reply) -> tuple[asyncio.Server, list[bytes]]:
    heads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head)
        await reply(writer, head)
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), heads


async def _lines(
    server: asyncio.Server, token: str | None = None, into: list[bytes] | None = None
) -> list[bytes]:
    """The watch's lines, each also appended to `into` as it comes."""
    port = server.sockets[0].getsockname()[1]
    kubeconfig = {
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}/base"}}],
        "users": [{"name": "u", "user": {"token": token} if token else {}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    config = KubeConfig.from_dict(kubeconfig).get()
    params = {"watch": "true", "resourceVersion": "7"}
    got = [] if into is None else into
    async for line in watch_lines(config, "/api/v1/pods", params):
        got.append(line)
    return got


async def test_lines_of_a_chunked_watch_split_across_reads() -> None:
    events = [orjson.dumps({"type": "ADDED", "object": {"n": i}}) for i in range(5)]
    stream = b"\n".join(events) + b"\n"

    async def reply(writer: asyncio.StreamWriter, _: bytes) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(stream), 7):  # chunks that cut lines anywhere
            piece = stream[i : i + 7]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    server, heads = await _serving(reply)
    async with server:
        assert await _lines(server, token="s3cret") == events
    assert heads[0].startswith(b"GET /base/api/v1/pods?watch=true&resourceVersion=7 HTTP/1.1\r\n")
    assert b"\r\nauthorization: bearer s3cret\r\n" in heads[0].lower()


async def test_an_error_status_is_refused_with_its_body() -> None:
    async def reply(writer: asyncio.StreamWriter, _: bytes) -> None:
        body = b'{"kind":"Status","message":"pods is forbidden"}'
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    server, _ = await _serving(reply)
    async with server:
        with pytest.raises(WatchRefused, match=r"HTTP 403: .*pods is forbidden"):
            await _lines(server)


async def test_a_line_that_never_ends_is_refused_once_over_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watchstream, "MAX_EVENT_BYTES", 1 << 20)
    first = orjson.dumps({"type": "ADDED", "object": {"n": 1}})

    async def reply(writer: asyncio.StreamWriter, _: bytes) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\n\r\n" % (len(first) + 1, first))
        piece = b"x" * (1 << 16)
        for _ in range(64):  # 4 MiB of one line, if the reader kept reading
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            try:
                await writer.drain()
            except ConnectionError:
                return

    server, _ = await _serving(reply)
    got: list[bytes] = []
    async with server:
        with pytest.raises(WatchEventTooLarge, match=r"/api/v1/pods: an event of over 1 MiB"):
            await _lines(server, into=got)
    assert got == [first]  # the whole events before it were given


POD = {
    "metadata": {"name": "p", "namespace": "jobs", "resourceVersion": "42", "managedFields": [{}]},
    "spec": {
        "nodeName": "n1",
        "volumes": [{"name": "v"}],
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
    },
    "status": {"phase": "Running", "conditions": [{"type": "Ready"}]},
}


def test_a_pod_event_is_read_into_the_model() -> None:
    kind, pod = read_pod_event(orjson.dumps({"type": "MODIFIED", "object": POD}))
    assert kind == "MODIFIED" and isinstance(pod, Pod)
    assert pod.key == "jobs/p" and pod.metadata.resource_version == "42"
    assert (
        podrequest.pod_request(pod).total == podrequest.PodRequest.of({"nvidia.com/gpu": 2}).total
    )


def test_a_pod_the_model_cannot_read_comes_as_a_dict() -> None:
    bad = {**POD, "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1.5"}}}]}}
    kind, pod = read_pod_event(orjson.dumps({"type": "ADDED", "object": bad}))
    assert kind == "ADDED" and pod == bad


def test_an_error_event_ends_the_watch() -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    with pytest.raises(WatchEnded, match="Expired"):
        read_pod_event(orjson.dumps(gone))
