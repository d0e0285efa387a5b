"""The scale scenario's moving parts, shared by tests/e2e/test_scale.py and bench/cluster.py:
the extender as deployed (its own process, its ServiceAccount's RBAC), kube-scheduler
configured with it or without it, pod streams, and the failover run (replicas killed and
restarted behind one address while pods keep coming).
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from lightkube import AsyncClient, Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount
from lightkube.resources.resource_v1 import ResourceClaim

from tests.e2e import fleet
from tests.e2e.controlplane import KubeCluster, Process, launch_extender
from tests.e2e.faultrig import Proxy

REPO = Path(__file__).resolve().parents[2]
SCHEDULER_CONFIG = REPO / "deploy" / "scheduler" / "kube-scheduler-config.yaml"
EXTENDER_MANIFEST = REPO / "deploy" / "scheduler" / "extender.yaml"
EXTENDER_USER = "system:serviceaccount:kube-system:rdmaplane-scheduler-extender"
EXTENDER_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:kube-system")
BIND_WITHIN_S = 300.0  # generous: a loaded 2-core machine


def install_extender_rbac(client: Client) -> None:
    """The ServiceAccount, ClusterRole and binding of deploy/scheduler/extender.yaml."""
    for obj in codecs.load_all_yaml(EXTENDER_MANIFEST.read_text()):
        if obj.kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
            client.apply(obj, force=True)


def extender_kubeconfig(cluster: KubeCluster) -> Path:
    """A kubeconfig as the extender's ServiceAccount (its RBAC is what it gets)."""
    return cluster.kubeconfig_for(EXTENDER_USER, EXTENDER_GROUPS)


def scheduler_config(extender: str | None, qps: float | None = None) -> dict[str, Any]:
    """Without an extender, or deploy/scheduler/kube-scheduler-config.yaml pointed at
    `extender`; with `qps`, the scheduler's client limits raised to it (kube-scheduler's
    default, 50 QPS, caps bindings at 50 pods a second)."""
    config: dict[str, Any] = {}
    if extender is not None:
        config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
        config["extenders"][0]["urlPrefix"] = extender
    if qps is not None:
        config["clientConnection"] = {"qps": qps, "burst": int(2 * qps)}
    return config


async def create_namespace(kube: AsyncClient, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:5]}"
    await kube.create(Namespace(metadata=ObjectMeta(name=name)))
    await kube.create(ServiceAccount(metadata=ObjectMeta(name="default", namespace=name)))
    return name


def bodies(
    namespace: str,
    fleet_label: str,
    prefix: str,
    gpus: Sequence[int],
    make: Callable[[str, str, str, int], dict[str, Any]] = fleet.pod_body,
) -> list[dict[str, Any]]:
    """A pod for each entry of `gpus` made by `make` (extended resources by default; DRA
    claims with `drafleet.pod_body`)."""
    return [make(f"{prefix}-{i:05d}", namespace, fleet_label, g) for i, g in enumerate(gpus)]


async def create_pods(
    kube: AsyncClient, pods: Sequence[dict[str, Any]], sent: dict[str, float]
) -> None:
    """Create the pods (a few at a time), noting when each create was sent."""

    async def one(body: dict[str, Any]) -> None:
        sent[body["metadata"]["name"]] = time.monotonic()
        await kube.create(Pod.from_dict(body))

    await fleet.bounded(fleet.CREATE_PARALLEL, (functools.partial(one, b) for b in pods))


async def create_paced(
    kube: AsyncClient, pods: Sequence[dict[str, Any]], rate: float, sent: dict[str, float]
) -> None:
    """Each pod created at its own moment, `rate` a second, whatever the others' latency."""
    start = time.monotonic()
    tasks = []
    for i, body in enumerate(pods):
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        tasks.append(asyncio.create_task(create_pods(kube, [body], sent)))
    await asyncio.gather(*tasks)


def asks_devices(body: dict[str, Any]) -> bool:
    return "limits" in body["spec"]["containers"][0]["resources"]


async def metric(url: str, name: str, **labels: str) -> float:
    """The sum of an extender metric's samples that carry `labels` (0 when it has none)."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{url}/metrics", timeout=30)).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def empty(
    kube: AsyncClient, namespace: str, extenders: Sequence[str], *, claims: bool = False
) -> None:
    """Delete the namespace's pods at once (grace 0) and wait until they are gone and no
    extender's cache holds a bound pod: the next run starts from an empty cluster. With
    `claims`, its ResourceClaims too (kube-controller-manager's resourceclaim controller lifts
    an allocated claim's finalizer once no pod holds it)."""
    await kube.deletecollection(Pod, namespace=namespace, grace_period=0)
    if claims:
        await kube.deletecollection(ResourceClaim, namespace=namespace)
    deadline = time.monotonic() + BIND_WITHIN_S
    while True:
        left = [p async for p in kube.list(Pod, namespace=namespace)]
        if claims:
            left += [c async for c in kube.list(ResourceClaim, namespace=namespace)]
        held = [await metric(u, "rdmaplane_extender_cache_objects", kind="pod") for u in extenders]
        if not left and not any(held):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{namespace}: {len(left)} objects left, extenders hold {held}")
        await asyncio.sleep(0.5)


# ---------------------------------------------------------------- failover


@dataclass
class Phase:
    name: str
    pods: int  # created in this phase
    bound: int  # of them, bound
    asked: int  # of them, asking for devices (kube-scheduler calls the extender for these)
    answered: int  # filter calls answered by a live replica during the phase


@dataclass
class Failover:
    phases: list[Phase] = field(default_factory=list)
    restart_to_ready_s: list[float] = field(default_factory=list)  # process start to /readyz
    answers: list[str] = field(default_factory=list)  # replicas compared, after each rejoin
    refused: dict[str, str] = field(default_factory=dict)  # bound with a replica up, refused
    unbound: int = 0


@dataclass
class Replicas:
    """Extender replicas on fixed ports behind one relay (a Service's stand-in)."""

    cluster: KubeCluster
    kubeconfig: Path
    ports: list[int]
    running: dict[int, Process] = field(default_factory=dict)

    def urls(self, ports: Sequence[int] | None = None) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in (self.ports if ports is None else ports)]

    def kill(self, port: int) -> None:
        process = self.running.pop(port)
        process.popen.kill()  # SIGKILL: no goodbye
        process.popen.wait()

    async def start(self, port: int) -> float:
        """Start a replica; seconds until its /readyz said it had listed everything."""
        began = time.monotonic()
        self.running[port] = await asyncio.to_thread(
            launch_extender, self.cluster, self.kubeconfig, port
        )
        return time.monotonic() - began

    def stop(self) -> None:
        for port in list(self.running):
            self.running.pop(port).stop()


async def same_answers(urls: Sequence[str], names: list[str], within: float) -> str:
    """Whether the replicas answer /filter and /prioritize byte for byte alike for a pod of
    every shape over every node; their watches may lag each other, so ask again until they
    agree or `within` seconds passed. A line saying which."""
    shapes = sorted({g for g, _ in fleet.SHAPES if g})
    requests = [
        orjson.dumps({"Pod": fleet.pod_body(f"probe-{g}", "probe", "x", g), "NodeNames": names})
        for g in shapes
    ]
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=60) as client:
        while True:
            differ = []
            for verb in ("filter", "prioritize"):
                for g, body in zip(shapes, requests, strict=True):
                    replies = {
                        (await client.post(f"{u}/{verb}", content=body)).content for u in urls
                    }
                    if len(replies) > 1:
                        differ.append(f"{verb} {g}-GPU")
            waited = time.monotonic() - start
            if not differ:
                return (
                    f"identical ({len(shapes)} pod shapes, filter and prioritize, {waited:.1f} s)"
                )
            if waited > within:
                return "DIFFERENT: " + ", ".join(differ)
            await asyncio.sleep(1.0)


async def failover(
    kube: AsyncClient,
    replicas: Replicas,
    nodes: Sequence[fleet.FleetNode],
    start_scheduler: Callable[[dict[str, Any]], Process],
    count: int,
    rate: float,
    seed: int,
) -> Failover:
    """Two replicas behind one relay; pods streamed at `rate` in five phases: both up; one
    killed (SIGKILL); it back (and the two compared); both killed (kube-scheduler goes on
    without the extender: `ignorable`); both back (compared again)."""
    a, b = replicas.ports
    for port in replicas.ports:
        if port not in replicas.running:
            await replicas.start(port)
    result = Failover()
    proxy = Proxy(a, b)
    await proxy.open()
    scheduler = start_scheduler(scheduler_config(f"http://127.0.0.1:{proxy.port}"))
    names = [n.name for n in nodes]
    label = nodes[0].labels[fleet.FLEET_LABEL]
    namespace = await create_namespace(kube, "failover")
    pods = bodies(namespace, label, "fo", fleet.stream(count, seed))
    chunks = [pods[i::5] for i in range(5)]  # the same mix in every phase

    async def compare() -> None:
        result.answers.append(await same_answers(replicas.urls(), names, 120.0))

    async def restart(*ports: int) -> None:
        for port in ports:
            result.restart_to_ready_s.append(await replicas.start(port))

    steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("both up", lambda: asyncio.sleep(0)),
        ("one killed", lambda: asyncio.to_thread(replicas.kill, a)),
        ("it back", lambda: restart(a)),
        ("both killed", lambda: asyncio.to_thread(lambda: [replicas.kill(p) for p in (a, b)])),
        ("both back", lambda: restart(a, b)),
    ]
    sent: dict[str, float] = {}
    blind: set[str] = set()  # pods created while no replica ran
    try:
        async with fleet.Bindings(kube, namespace) as seen:
            for (name, step), chunk in zip(steps, chunks, strict=True):
                await step()
                if name.endswith("back"):
                    await compare()
                live = replicas.urls(list(replicas.running))
                before = sum(
                    [
                        await metric(u, "rdmaplane_extender_requests_total", verb="filter")
                        for u in live
                    ]
                )
                await create_paced(kube, chunk, rate, sent)
                waiting = await seen.wait_for((p["metadata"]["name"] for p in chunk), BIND_WITHIN_S)
                after = sum(
                    [
                        await metric(u, "rdmaplane_extender_requests_total", verb="filter")
                        for u in live
                    ]
                )
                if not live:
                    blind |= {p["metadata"]["name"] for p in chunk}
                result.phases.append(
                    Phase(
                        name,
                        len(chunk),
                        len(chunk) - len(waiting),
                        sum(map(asks_devices, chunk)),
                        int(after - before),
                    )
                )
                result.unbound += len(waiting)
            by_name = {p["metadata"]["name"]: p for p in pods}
            refused = fleet.refused(nodes, by_name, seen.bound)
            result.refused = {n: why for n, why in refused.items() if n not in blind}
    finally:
        scheduler.stop()
        await proxy.cut()
    await empty(kube, namespace, replicas.urls(list(replicas.running)))
    return result
