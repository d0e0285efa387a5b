"""The extender over real HTTP (uvicorn on loopback, httpx client), in the upstream wire format."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from rdmaplane.core import nrt
from rdmaplane.core.settings.scheduler import ExtenderSettings
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.root import create_app
from rdmaplane.services.scheduler.watch import make_client, watch_all
from tests.scheduler_helpers import (
    EXAMPLE_NODES,
    example_cluster,
    node,
    pod,
    serve,
    unreachable_kubeconfig,
)


@pytest.fixture
def url() -> Iterator[str]:
    settings = ExtenderSettings(max_request_bytes=64 * 1024)
    with serve(create_app(example_cluster(), settings)) as base:
        yield base


def _call(url: str, verb: str, body: object) -> httpx.Response:
    return httpx.post(
        f"{url}/{verb}", content=orjson.dumps(body), headers={"content-type": "application/json"}
    )


def test_filter_with_node_names(url: str) -> None:
    reply = _call(url, "filter", {"Pod": pod("p", 8, 8), "Nodes": None, "NodeNames": EXAMPLE_NODES})
    assert reply.status_code == 200
    body = reply.json()
    assert set(body) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert body["Nodes"] is None and body["Error"] == ""
    assert body["NodeNames"] == ["paired", "lopsided"]
    assert body["FailedNodes"] == {}
    assert body["FailedAndUnresolvableNodes"] == {
        "full": "rdmaplane: single-numa-node: no NUMA zone can hold"
        " 8 nvidia.com/gpu + 8 rdmaplane.io/hca",
        "bare": "rdmaplane: no NodeResourceTopology published for this node",
    }


def test_filter_full_node_is_resolvable(url: str) -> None:
    body = _call(url, "filter", {"Pod": pod("p", 1, 1), "NodeNames": ["full"]}).json()
    assert body["FailedNodes"] == {"full": "rdmaplane: insufficient nvidia.com/gpu"}


def test_filter_with_node_list_returns_node_list(url: str) -> None:
    items = [node(n) for n in EXAMPLE_NODES]
    body = _call(
        url,
        "filter",
        {"Pod": pod("p", 2, 2), "Nodes": {"kind": "NodeList", "items": items}, "NodeNames": None},
    ).json()
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["paired", "lopsided"]
    assert body["Nodes"]["kind"] == "NodeList"
    assert body["NodeNames"] == ["paired", "lopsided"]


def test_prioritize_ranks_pcie_pairs_first(url: str) -> None:
    reply = _call(url, "prioritize", {"Pod": pod("p", 8, 8), "NodeNames": ["lopsided", "paired"]})
    scores = {e["Host"]: e["Score"] for e in reply.json()}
    assert set(reply.json()[0]) == {"Host", "Score"}
    assert scores["paired"] > scores["lopsided"] >= 0 and scores["paired"] <= 10


def test_pass_through_pod_changes_nothing(url: str) -> None:
    body = _call(url, "filter", {"Pod": pod("web"), "NodeNames": EXAMPLE_NODES}).json()
    assert (
        body["NodeNames"] == EXAMPLE_NODES
        and body["FailedNodes"] == {}
        and body["FailedAndUnresolvableNodes"] == {}
    )
    asked = {"Pod": pod("web"), "NodeNames": EXAMPLE_NODES}
    scores = {e["Score"] for e in _call(url, "prioritize", asked).json()}
    assert scores == {0}


def test_no_nodes_at_all(url: str) -> None:
    body = _call(url, "filter", {"Pod": pod("p", 1, 1), "Nodes": None, "NodeNames": None}).json()
    assert body["NodeNames"] == [] and body["Error"] == ""


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "request body is not valid JSON"),
        (b"[1, 2]", "request body: expected a JSON object"),
        (b'{"NodeNames": []}', "Pod: expected an object"),
        (b'{"Pod": {"spec": {}}, "NodeNames": "n1"}', "NodeNames: expected a list"),
        (b'{"Pod": {"spec": {}}, "NodeNames": ["a", 7]}', "NodeNames[1]: expected a string"),
        (
            b'{"Pod": {"spec": {}}, "Nodes": {"items": [{"metadata": {}}]}}',
            "Nodes.items[0].metadata.name",
        ),
        (
            b'{"Pod": {"spec": {"containers": [{"resources": {"limits":'
            b' {"nvidia.com/gpu": "half"}}}]}}, "NodeNames": []}',
            "Pod.spec.containers[0].resources.limits[nvidia.com/gpu]",
        ),
    ],
)
def test_malformed_requests_get_400_with_a_message(url: str, content: bytes, message: str) -> None:
    for verb in ("filter", "prioritize"):
        reply = httpx.post(f"{url}/{verb}", content=content)
        assert reply.status_code == 400
        assert message in reply.json()["Error"]


def test_oversized_requests_get_413(url: str) -> None:
    big = orjson.dumps(
        {"Pod": pod("p", 1, 1), "NodeNames": [f"node-{i:06d}" for i in range(10_000)]}
    )
    reply = httpx.post(f"{url}/filter", content=big)
    assert reply.status_code == 413 and "exceeds the limit of 65536 bytes" in reply.json()["Error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while streaming too
        for i in range(0, len(big), 4096):
            yield big[i : i + 4096]

    reply = httpx.post(f"{url}/prioritize", content=chunks())
    assert reply.status_code == 413
    assert httpx.get(f"{url}/healthz").status_code == 200


def _raw_request(url: str, head: bytes, body: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=30)
    conn.sendall(head + b"\r\n\r\n" + body)
    return conn


def _read_until_closed(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes (the socket's 30 s timeout fails the test
    if it keeps the connection open)."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def test_413_closes_the_connection(url: str) -> None:
    """The rest of an oversized body may still be on its way: the server answers, then closes."""
    head = (
        b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 10000000"
    )
    with _raw_request(url, head, b"{" * 1000) as conn:
        reply = _read_until_closed(conn)
    assert reply.startswith(b"HTTP/1.1 413 ")
    assert b"connection: close" in reply.lower() and b"exceeds the limit" in reply


def test_a_client_that_leaves_mid_body_is_no_error(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rdmaplane")
    head = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 5000"
    _raw_request(url, head, b'{"Pod": ').close()
    deadline = time.monotonic() + 30
    while 'code="499",verb="filter"' not in httpx.get(f"{url}/metrics").text:
        assert time.monotonic() < deadline, "the abandoned request was never counted"
        time.sleep(0.05)
    went = [r for r in caplog.records if "went away" in r.getMessage()]
    assert [r.levelname for r in went] == ["INFO"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert 'code="503"' not in httpx.get(f"{url}/metrics").text


def test_unexpected_fault_is_a_503_with_a_message() -> None:
    cache = example_cluster()

    def broken(*args: object) -> object:
        raise KeyError("zone")

    cache.verdicts = broken  # type: ignore[method-assign]
    with serve(create_app(cache, ExtenderSettings())) as base:
        reply = _call(base, "filter", {"Pod": pod("p", 1, 1), "NodeNames": ["paired"]})
        assert reply.status_code == 503 and "internal error: KeyError" in reply.json()["Error"]


def test_explain_and_debug_endpoints(url: str) -> None:
    body = _call(url, "debug/explain", {"Pod": pod("p", 4, 4), "NodeNames": EXAMPLE_NODES}).json()
    rows = {r["node"]: r for r in body["nodes"]}
    assert body["request"]["total"] == {nrt.GPU: 4, nrt.HCA: 4}
    assert rows["paired"]["fits"] and rows["paired"]["alignment"] == "pcie"
    assert "4/4 PCIe pairs" in rows["paired"]["detail"]
    assert rows["full"]["unaccountedPods"] == ["default/big-a", "default/big-b"]
    state = httpx.get(f"{url}/debug/nodes/paired").json()["state"]
    assert [z["name"] for z in state["zones"]] == ["node-0", "node-1"]
    assert httpx.get(f"{url}/debug/nodes/nowhere").status_code == 404


def test_health_ready_and_metrics(url: str) -> None:
    _call(url, "filter", {"Pod": pod("p", 1, 1), "NodeNames": EXAMPLE_NODES})
    assert httpx.get(f"{url}/healthz").text == "ok\n"
    assert httpx.get(f"{url}/readyz").status_code == 200
    text = httpx.get(f"{url}/metrics").text
    assert 'rdmaplane_extender_requests_total{code="200",verb="filter"} 1.0' in text
    assert 'rdmaplane_extender_filter_nodes_total{outcome="passed"} 2.0' in text
    assert 'rdmaplane_extender_cache_objects{kind="nrt"} 3.0' in text


def test_serves_without_a_cluster(tmp_path: Path) -> None:
    """An unreachable API server: the extender serves, stays unready, and keeps retrying."""
    kubeconfig = unreachable_kubeconfig(tmp_path)
    cache = ClusterCache()
    app = create_app(
        cache,
        ExtenderSettings(),
        lambda c, restarted: watch_all(c, lambda: make_client(kubeconfig), restarted),
    )
    with serve(app) as base:
        ready = httpx.get(f"{base}/readyz")
        assert ready.status_code == 503 and "cache not synced yet: nrt, node, pod" in ready.text
        for verb in ("filter", "prioritize"):  # blind: an error, so `ignorable: true` applies
            reply = _call(base, verb, {"Pod": pod("p", 1, 1), "NodeNames": ["n1"]})
            assert reply.status_code == 503
            assert reply.json()["Error"].startswith("cache not synced yet: nrt, node, pod")
        for _ in range(100):
            if (
                'rdmaplane_extender_watch_restarts_total{kind="pod"} 2.0'
                in httpx.get(f"{base}/metrics").text
            ):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the watches did not retry")


def test_outside_a_pod_without_a_kubeconfig_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from rdmaplane.cli import app

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = CliRunner().invoke(app, ["scheduler-extender", "--port", "0"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: no kubeconfig given and not running in a pod")
    assert len(result.output.splitlines()) == 1


def test_a_watch_task_that_dies_is_restarted_and_healthz_fails_meanwhile() -> None:
    """The cache's watch task ending on an error nobody expected: /healthz answers 503 naming
    it until the supervisor has restarted it."""
    broken = threading.Event()
    broken.set()
    started = 0

    async def watcher(cache: ClusterCache, restarted: object) -> None:
        nonlocal started
        started += 1
        if broken.is_set():
            raise RuntimeError("unexpected fault injected by the test")
        await asyncio.Event().wait()

    app = create_app(example_cluster(), ExtenderSettings(), watcher)
    app.state.tasks.backoff_initial_s, app.state.tasks.backoff_max_s = 0.05, 0.2
    with serve(app) as base:
        health = _until(base, 503)
        assert health.text.startswith("task watch is down: RuntimeError: unexpected fault")
        broken.clear()
        _until(base, 200)
        assert started >= 2


def _until(base: str, status: int, within_s: float = 30.0) -> httpx.Response:
    deadline = time.monotonic() + within_s
    while (health := httpx.get(f"{base}/healthz")).status_code != status:
        assert time.monotonic() < deadline, f"/healthz never {status}"
    return health
