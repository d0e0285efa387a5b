"""Shared by the scheduler tests: a live uvicorn server on loopback, pods and clusters."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from rdmaplane.core import nrt
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.serving import server_config
from tests.layouts import layout

EXAMPLE_NODES = ["paired", "lopsided", "full", "bare"]


def example_cluster() -> ClusterCache:
    """Four nodes: two best-effort ones with room, a single-numa-node one whose GPUs two bound
    pods hold, and one without a NodeResourceTopology."""
    cache = ClusterCache()
    topologies = [
        layout("hgx", "paired", policy="best-effort"),
        layout("one-socket-nics", "lopsided", policy="best-effort"),
        layout("hgx", "full", policy="single-numa-node"),
    ]
    cache.replace("nrt", [nrt.to_object(t) for t in topologies])
    cache.replace("node", [node(n) for n in EXAMPLE_NODES])
    cache.replace("pod", [pod("big-a", 4, 4, node="full"), pod("big-b", 4, 0, node="full")])
    return cache


@contextmanager
def serve(app: FastAPI, direct: bool = True) -> Iterator[str]:
    """Run the app under uvicorn in a thread, as the extender serves it (kube-scheduler's
    calls answered in the protocol; with `direct=False`, every call through ASGI); yield its
    base URL."""
    sock = socket.socket(
        socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )  # asyncio sets TCP_NODELAY only when proto says TCP
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    calls = getattr(getattr(app, "state", None), "direct_calls", None) if direct else None
    server = uvicorn.Server(server_config(app, calls, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start within 10 s")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def pod(
    name: str, gpus: int = 0, hcas: int = 0, shared: int = 0, node: str = "", ns: str = "default"
) -> dict[str, Any]:
    limits = {
        k: str(v) for k, v in ((nrt.GPU, gpus), (nrt.HCA, hcas), (nrt.HCA_SHARED, shared)) if v
    }
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "creationTimestamp": f"2026-01-01T00:00:{len(name):02d}Z",
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": limits, "requests": limits},
                }
            ]
        },
        "status": {"phase": "Pending"},
    }
    if node:
        obj["spec"]["nodeName"] = node
    return obj


def node(name: str, rdma_ready: str | None = None, message: str = "") -> dict[str, Any]:
    conditions = (
        [{"type": nrt.CONDITION_RDMA_READY, "status": rdma_ready, "message": message}]
        if rdma_ready
        else []
    )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"conditions": conditions},
    }


def unreachable_kubeconfig(folder: Path) -> Path:
    """A kubeconfig whose API server is a closed port: watches fail and retry for ever."""
    path = folder / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    return path
