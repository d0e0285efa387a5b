"""The real kube-scheduler on KWOK, one arm at a time: the fabric's nodes as KWOK nodes, the
extender as deployed, and per arm a fresh namespace and kube-scheduler; a job's pods created
held by a scheduling gate (and, with gangs, its Workload and PodGroup), the gate lifted once the
extender counts the job whole, the bindings awaited; finished jobs' pods deleted."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx2
from cluster import cluster_with_kwok
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from rdmaplane.adapters.kube import load_config
from rdmaplane.core import fabric as fab
from rdmaplane.core import nrt
from tests.e2e import fleet, scalerig
from tests.e2e.controlplane import (
    KubeCluster,
    build_dir,
    free_port,
    launch_extender,
    launch_scheduler,
)
from tests.e2e.test_fabric import _job_seen_whole
from tests.e2e.test_gangs import (
    APISERVER_FLAGS,
    GATES,
    PodGroup,
    Workload,
    gang_objects,
)
from tests.layouts import layout

from .trace import Job, pods_of

T = TypeVar("T")


@dataclass(frozen=True)
class ArmSetup:
    label: str
    extender: bool  # kube-scheduler calls rdmaplane's extender (deploy/scheduler's config)
    gangs: bool  # each job a Workload API gang, all under one leaf
    score_all: bool = False  # percentageOfNodesToScore: 100 (default: kube-scheduler's own)


REAL_ARMS = {
    "default": ArmSetup("kube-scheduler alone", False, False),
    "extender": ArmSetup("kube-scheduler + rdmaplane's extender", True, False),
    "extender-all": ArmSetup("the same, percentageOfNodesToScore: 100", True, False, True),
    "gangs": ArmSetup("Workload API gangs, one leaf each, + the extender", True, True),
}
HOLD = "rdmaplane.io/bench-hold"  # a scheduling gate, lifted once all of a job's pods exist
PLACED_WITHIN_S = 300.0  # generous: a loaded 2-core machine
SCHEDULER_QPS = 1000.0  # kube-scheduler's default 50 QPS would pace the binds, not the judging


def kwok_nodes(
    fabric: fab.Fabric,
    sample: str = "hgx",
    capacity: Mapping[str, str] | None = None,
    nrt_of: Callable[[str], dict[str, Any]] | None = None,
) -> list[fleet.FleetNode]:
    """The fabric's nodes as KWOK nodes of `sample`: the agent's tier labels, the capacity the
    kubelet reports (an HGX's 8 GPUs + 8 HCAs unless given), the NRT its agent publishes."""
    where = fabric.locations()
    return [
        fleet.FleetNode(
            n,
            sample,
            "best-effort",
            "container",
            {**fab.tier_labels(where[n], fab.DEFAULT_TIER_LABELS), fleet.FLEET_LABEL: "fabric"},
            capacity or {nrt.GPU: "8", nrt.HCA: "8"},
            nrt_of(n) if nrt_of else nrt.to_object(layout(sample, n)),
        )
        for n in sorted(fabric.nodes)
    ]


def real_pod(body: dict[str, Any], namespace: str, pod_group: str | None) -> dict[str, Any]:
    """`pods_of`'s pod as created: held by a scheduling gate, naming its PodGroup if any."""
    spec = {**body["spec"], "terminationGracePeriodSeconds": 0, "schedulingGates": [{"name": HOLD}]}
    spec["containers"] = [{**c, "image": "trainer"} for c in spec["containers"]]
    if pod_group is not None:
        spec["schedulingGroup"] = {"podGroupName": pod_group}
    meta = {**body["metadata"], "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@dataclass
class RealArm:
    """One scheduler setup, its namespace, and the bindings a watch of it saw."""

    name: str
    kube: AsyncClient
    namespace: str
    seen: fleet.Bindings
    extender: str | None  # its URL, when kube-scheduler calls it
    gangs: bool


async def place(arm: RealArm, job: Job, fits_a_leaf: bool) -> list[str] | None:
    """Create the job's pods (and its gang), lift their gate once the extender counts the job
    whole, and return the nodes kube-scheduler bound them to; None for a gang it judged
    unschedulable when no leaf had room for it (withdrawn: it would wait, holding nothing)."""
    group = f"{job.name}-workers" if arm.gangs else None
    if arm.gangs:
        workload, pod_group = gang_objects(arm.namespace, job.name, job.size)
        await arm.kube.create(Workload.from_dict(workload))
        await arm.kube.create(PodGroup.from_dict(pod_group))
    bodies = [real_pod(p, arm.namespace, group) for p in pods_of(job)]
    await asyncio.gather(*(arm.kube.create(Pod.from_dict(b)) for b in bodies))
    if arm.extender is not None:  # as the model: every pod of the job exists before any binds
        await _job_seen_whole(arm.extender, bodies[0], job.size)
    names = [b["metadata"]["name"] for b in bodies]
    lift = {"spec": {"schedulingGates": None}}
    await asyncio.gather(
        *(arm.kube.patch(Pod, n, lift, namespace=arm.namespace, patch_type=PatchType.MERGE)
          for n in names)
    )  # fmt: skip
    deadline = time.monotonic() + PLACED_WITHIN_S
    while waiting := await arm.seen.wait_for(names, 1.0):
        if group is not None and not fits_a_leaf and await _unschedulable(arm, group):
            await finish(arm, job)
            return None
        if time.monotonic() > deadline:
            raise TimeoutError(f"{arm.name}: {len(waiting)} pods of {job.name} still unbound")
    return [arm.seen.bound[n].node for n in names]


async def _unschedulable(arm: RealArm, pod_group: str) -> bool:
    got = await arm.kube.get(PodGroup, pod_group, namespace=arm.namespace)
    conditions = (got.get("status") or {}).get("conditions") or []
    return any(
        c["type"] == "PodGroupInitiallyScheduled" and c["status"] == "False" for c in conditions
    )


async def finish(arm: RealArm, job: Job) -> None:
    """The job's pods go at once (grace 0), and its gang with them."""
    kube, ns = arm.kube, arm.namespace
    await asyncio.gather(
        *(kube.delete(Pod, p["metadata"]["name"], namespace=ns, grace_period=0)
          for p in pods_of(job))
    )  # fmt: skip
    if arm.gangs:
        await kube.delete(PodGroup, f"{job.name}-workers", namespace=ns)
        await kube.delete(Workload, job.name, namespace=ns)


async def one_arm(
    cluster: KubeCluster, kube: AsyncClient, name: str, extender: str,
    run: Callable[[RealArm], Awaitable[T]],
) -> tuple[T, float]:  # fmt: skip
    """A fresh namespace and kube-scheduler for arm `name`, `run` through it, and how long it
    took; the cluster emptied after it."""
    setup = REAL_ARMS[name]
    namespace = await scalerig.create_namespace(kube, f"fabric-{name}")
    url = extender if setup.extender else None
    config = scalerig.scheduler_config(url, SCHEDULER_QPS)
    # a pod tried while its nodes' previous pods were still being deleted retries in 1 s
    config.update(podInitialBackoffSeconds=1, podMaxBackoffSeconds=1)
    if setup.score_all:
        config["percentageOfNodesToScore"] = 100
    if url is not None:  # the extender shares 2 loaded cores: judge its answers, not its speed
        config["extenders"][0]["httpTimeout"] = "30s"
    scheduler = launch_scheduler(cluster, config, [GATES] if setup.gangs else [])
    started = time.monotonic()
    try:
        async with fleet.Bindings(kube, namespace) as seen:
            got = await run(RealArm(name, kube, namespace, seen, url, setup.gangs))
    finally:
        scheduler.stop()
    seconds = time.monotonic() - started
    await kube.deletecollection(PodGroup, namespace=namespace)
    await kube.deletecollection(Workload, namespace=namespace)
    await scalerig.empty(kube, namespace, [extender])
    return got, seconds


async def real_arms(
    cluster: KubeCluster,
    nodes: list[fleet.FleetNode],
    arms: Iterable[str],
    run: Callable[[RealArm], Awaitable[T]],
) -> dict[str, tuple[T, float]]:
    """`nodes` as KWOK nodes, the extender as deployed (its own process, its RBAC), then `run`
    through each arm in turn on the same nodes."""
    config = load_config(cluster.kubeconfig)
    async with AsyncClient(config, timeout=httpx2.Timeout(120.0), trust_env=False) as kube:
        await fleet.create(kube, nodes)
        port = free_port()
        kubeconfig = scalerig.extender_kubeconfig(cluster)
        extender = await asyncio.to_thread(launch_extender, cluster, kubeconfig, port)
        url = f"http://127.0.0.1:{port}"
        try:
            return {name: await one_arm(cluster, kube, name, url, run) for name in arms}
        finally:
            extender.stop()


def control_plane() -> contextlib.AbstractContextManager[KubeCluster]:
    """The gated control plane with KWOK, or exit 2 naming what `make k8s-bins` would build."""
    bin_dir, kwok_bin = build_dir("--bin-dir"), build_dir("--kwok-bin-dir") / "kwok"
    missing = [str(p) for p in (bin_dir / "kube-apiserver", kwok_bin) if not p.is_file()]
    if missing:
        sys.exit(f"error: {', '.join(missing)} missing: run `make k8s-bins` first")
    return cluster_with_kwok(bin_dir, kwok_bin, APISERVER_FLAGS)
