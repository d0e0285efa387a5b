"""The real kube-scheduler, configured with `deploy/scheduler/kube-scheduler-config.yaml`, calls
the extender (uvicorn on loopback, watching the real API server) on a small mixed cluster:
aligned pods land on the aligned node, bound pods are accounted before the agent republishes,
an impossible pod stays Pending with our reason in its events, and with the extender gone
scheduling goes on (`ignorable`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Event, Pod
from typer.testing import CliRunner

from rdmaplane.adapters.kube import NodeResourceTopology
from rdmaplane.cli import app
from rdmaplane.core import nrt
from rdmaplane.core.settings.scheduler import ExtenderSettings
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.root import create_app
from rdmaplane.services.scheduler.watch import make_client, watch_all
from tests.e2e.controlplane import KubeCluster, Process, add_ready_node, free_port, launch_extender
from tests.layouts import layout
from tests.scheduler_helpers import pod, serve

REPO = Path(__file__).resolve().parents[2]
SCHEDULER_CONFIG = REPO / "deploy" / "scheduler" / "kube-scheduler-config.yaml"


@pytest.fixture
def extender(kube_cluster: KubeCluster, nrt_crd: type[NodeResourceTopology]) -> Iterator[str]:
    with in_process_extender(kube_cluster) as url:
        yield url


@contextlib.contextmanager
def in_process_extender(cluster: KubeCluster) -> Iterator[str]:
    """The extender in a thread of this process, watching `cluster` as its admin; yields its
    URL once /readyz says it has listed everything."""
    cache = ClusterCache()
    kubeconfig = cluster.kubeconfig
    app = create_app(
        cache,
        ExtenderSettings(),
        lambda c, restarted: watch_all(c, lambda: make_client(kubeconfig), restarted),
    )
    with serve(app) as url:
        for _ in range(120):
            if httpx.get(f"{url}/readyz").status_code == 200:
                break
            time.sleep(0.25)
        else:
            pytest.fail("the extender did not sync with the API server")
        yield url


def _scheduler_config(url: str) -> dict[str, Any]:
    """deploy/'s KubeSchedulerConfiguration pointed at `url`, with 30 s for each call instead of
    the deployed 2 s: the extenders under test run in a thread of the long pytest process, where
    a slow call (a GC pass holding the GIL) would let kube-scheduler place the pod by its own
    scores (`ignorable`) and the test judge kube-scheduler instead. An extender that does not
    answer at all is still passed over at once (connection refused)."""
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    config["extenders"][0]["urlPrefix"] = url
    config["extenders"][0]["httpTimeout"] = "30s"
    return dict(config)


async def _mixed_cluster(kube: AsyncClient, prefix: str) -> dict[str, str]:
    """hgx: HGX layout, single-numa-node, all free (the aligned node).
    lopsided: every NIC on socket 0, single-numa-node, socket 0's GPUs published as in use.
    split: NICs on their own root complexes (NUMA-aligned at best), best-effort.
    bare: no NRT published."""
    names = {k: f"{prefix}-{k}" for k in ("hgx", "lopsided", "split", "bare")}
    topologies = {
        "hgx": layout("hgx", names["hgx"], policy="single-numa-node"),
        "lopsided": layout("one-socket-nics", names["lopsided"], policy="single-numa-node"),
        "split": layout("split-roots", names["split"], policy="best-effort"),
    }
    lopsided = nrt.to_object(topologies["lopsided"])
    for zone in lopsided["zones"]:
        for res in zone["resources"]:
            if res["name"] == nrt.GPU and zone["name"] in (
                "node-0",
                "pci0000:15",
                "pci0000:37",
                "pci0000:48",
            ):
                res["available"] = "0"
    objects = {
        "hgx": nrt.to_object(topologies["hgx"]),
        "lopsided": lopsided,
        "split": nrt.to_object(topologies["split"]),
    }
    for key, name in names.items():
        await add_ready_node(
            kube, name, {}, {nrt.GPU: "8", nrt.HCA: "4" if key == "split" else "8"}
        )
        if key in objects:
            await kube.create(NodeResourceTopology(objects[key]))
    return names


async def _create(kube: AsyncClient, namespace: str, name: str, gpus: int, hcas: int) -> None:
    body = pod(name, gpus, hcas, ns=namespace)
    del body["status"]
    await kube.create(Pod.from_dict(body))


async def _bound(kube: AsyncClient, namespace: str, name: str) -> str:
    for _ in range(120):
        found = await kube.get(Pod, name, namespace=namespace)
        if found.spec and found.spec.nodeName:
            return found.spec.nodeName
        await asyncio.sleep(0.25)
    raise AssertionError(f"pod {name} not bound within 30 s")


async def _seen_by_extender(url: str, node: str, namespace: str, name: str) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(480):  # up to 120 s: a loaded CI machine
            reply = await client.get(f"{url}/debug/nodes/{node}")
            if f"{namespace}/{name}" in reply.json().get("unaccountedPods", []):
                return
            await asyncio.sleep(0.25)
    raise AssertionError(f"the extender never saw {namespace}/{name} bound to {node}")


async def test_aligned_placement_accounting_and_pending_reason(
    kube: AsyncClient, namespace: str, extender: str, start_scheduler: Callable[..., Process]
) -> None:
    names = await _mixed_cluster(kube, f"ext-{uuid.uuid4().hex[:6]}")
    start_scheduler(_scheduler_config(extender))

    # Two 4-GPU + 4-NIC pods: both zones of the HGX node, one after the other.
    for name in ("train-a", "train-b"):
        await _create(kube, namespace, name, 4, 4)
        assert await _bound(kube, namespace, name) == names["hgx"]
        await _seen_by_extender(extender, names["hgx"], namespace, name)

    # The NRT still says the HGX node is free (no agent republished): the extender counts the
    # two bound pods itself, so the third goes to the NUMA-aligned node instead.
    await _create(kube, namespace, "train-c", 2, 2)
    assert await _bound(kube, namespace, "train-c") == names["split"]

    # 8 GPUs + 8 NICs: impossible on single-numa-node two-socket nodes, no NRT on "bare".
    await _create(kube, namespace, "train-huge", 8, 8)
    message = await _failed_scheduling(kube, namespace, "train-huge")
    assert (
        "rdmaplane: single-numa-node: no NUMA zone can hold 8 nvidia.com/gpu + 8 rdmaplane.io/hca"
        in message
    )
    assert "rdmaplane: no NodeResourceTopology published for this node" in message
    huge = await kube.get(Pod, "train-huge", namespace=namespace)
    assert huge.spec is not None and not huge.spec.nodeName


async def _failed_scheduling(kube: AsyncClient, namespace: str, name: str) -> str:
    """The pod's FailedScheduling messages, once one of them carries the extender's reason
    (up to 30 s), else what there was."""
    message = ""
    for _ in range(120):
        events = [
            e
            async for e in kube.list(
                Event, namespace=namespace, fields={"involvedObject.name": name}
            )
        ]
        message = " ".join(e.message or "" for e in events if e.reason == "FailedScheduling")
        if "rdmaplane:" in message:
            break
        await asyncio.sleep(0.25)
    return message


async def test_scheduling_goes_on_without_the_extender(
    kube: AsyncClient, namespace: str, start_scheduler: Callable[..., Process]
) -> None:
    await _mixed_cluster(kube, f"gone-{uuid.uuid4().hex[:6]}")
    start_scheduler(_scheduler_config("http://127.0.0.1:9"))  # nothing listens there
    await _create(kube, namespace, "train-anyway", 1, 1)
    assert await _bound(kube, namespace, "train-anyway")  # wherever the default plugins chose


async def test_explain_placement_reads_the_cluster(
    kube: AsyncClient,
    kube_cluster: KubeCluster,
    nrt_crd: type[NodeResourceTopology],
    tmp_path: Path,
) -> None:
    names = await _mixed_cluster(kube, f"expl-{uuid.uuid4().hex[:6]}")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(pod("job", 4, 4)))
    args = [
        "explain-placement",
        str(job),
        "--kubeconfig",
        str(kube_cluster.kubeconfig),
        "-o",
        "json",
    ]
    result = await asyncio.to_thread(CliRunner().invoke, app, args)
    assert result.exit_code == 0, result.output
    rows = {r["node"]: r for r in json.loads(result.output)["nodes"]}
    assert rows[names["hgx"]]["fits"] and rows[names["hgx"]]["alignment"] == "pcie"
    assert not rows[names["lopsided"]]["fits"]
    assert rows[names["bare"]]["detail"] == "no NodeResourceTopology published for this node"


async def test_kube_scheduler_calls_the_extender_over_https(
    kube: AsyncClient,
    kube_cluster: KubeCluster,
    namespace: str,
    nrt_crd: type[NodeResourceTopology],
    start_scheduler: Callable[..., Process],
) -> None:
    """`rdmaplane scheduler-extender --tls-cert-file --tls-key-file` in its own process, and
    kube-scheduler with `enableHTTPS` and the CA in `tlsConfig.caFile`: the extender's reason
    reaches the pod's events, so the call went through (with `ignorable`, a failed TLS
    handshake would let kube-scheduler bind the pod to the node without an NRT)."""
    cert, key = kube_cluster.pki.issue("extender-tls", "extender", hosts=["127.0.0.1"])
    port = free_port()
    process = launch_extender(
        kube_cluster,
        kube_cluster.kubeconfig,
        port,
        f"--tls-cert-file={cert}",
        f"--tls-key-file={key}",
        ready=False,
    )
    url = f"https://127.0.0.1:{port}"
    ca = ssl.create_default_context(cafile=str(kube_cluster.pki.ca_cert))
    try:
        await asyncio.to_thread(process.wait_ready, lambda: _ready(f"{url}/readyz", ca))
        names = await _mixed_cluster(kube, f"tls-{uuid.uuid4().hex[:6]}")
        config = _scheduler_config(url)
        config["extenders"][0]["enableHTTPS"] = True
        config["extenders"][0]["tlsConfig"] = {"caFile": str(kube_cluster.pki.ca_cert)}
        start_scheduler(config)
        await _create(kube, namespace, "train-huge", 8, 8)
        message = await _failed_scheduling(kube, namespace, "train-huge")
        assert "rdmaplane: no NodeResourceTopology published for this node" in message
        huge = await kube.get(Pod, "train-huge", namespace=namespace)
        assert huge.spec is not None and not huge.spec.nodeName, names
        async with httpx.AsyncClient(timeout=5) as plain:  # and nothing is served in the clear
            with pytest.raises(httpx.HTTPError):
                await plain.get(f"http://127.0.0.1:{port}/readyz")
    finally:
        process.stop()


def _ready(url: str, context: ssl.SSLContext) -> bool:
    try:
        return httpx.get(url, verify=context, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
