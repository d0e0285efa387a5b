"""Kubelet restarts with the real kubelet v1.37.2 (the shared RDMA plugin's best-known failure:
allocatable 0 after a kubelet restart), while pods hold devices.

After each of 20 restarts: the plugin registered once more and never twice (issue 33: the real
kubelet refuses a duplicate and is then stuck), the kubelet's device manager lists every HCA
again, the Node's allocatable is back (from a status the new kubelet wrote), the running pods
still run in the same containers and hold the same devices. Then a new pod still gets some.
How long each took is printed (`-s`), measured here, not asserted.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod

from rdmaplane.core.allocation import PodDevices
from tests.node import pods
from tests.node.plugins import HCA, device_plugin, held, kubelet_allocatable, wait_allocatable
from tests.node.realnode import RealNode
from tests.node.test_device_plugin import EXCLUSIVE

RESTARTS = 20


async def kubelet_lists(node: RealNode, want: int, within: float = 60.0) -> float:
    """Until the kubelet's device manager lists `want` HCAs: the seconds it took."""
    start = time.monotonic()
    while (seen := await kubelet_allocatable(node, HCA)) != want:
        assert time.monotonic() - start < within, f"the kubelet lists {seen} HCAs"
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def node_allocatable_since(kube: AsyncClient, node: str, since: float, want: int) -> float:
    """Until a Node status the new kubelet wrote (heartbeat at or after `since`, wall clock)
    has `want` HCAs allocatable: the seconds it took."""
    start = time.monotonic()
    while True:
        status = (await kube.get(Node, node)).status
        assert status is not None
        ready = next(c for c in status.conditions or [] if c.type == "Ready")
        beat = ready.lastHeartbeatTime.timestamp() if ready.lastHeartbeatTime else 0.0
        if beat >= since and int((status.allocatable or {}).get(HCA, "0")) == want:
            return time.monotonic() - start
        assert time.monotonic() - start < 60, f"allocatable {status.allocatable}"
        await asyncio.sleep(0.05)


async def holds_again(
    node: RealNode, namespace: str, want: dict[str, PodDevices], within: float = 60.0
) -> float:
    """Until the kubelet's PodResources lists the pods of `namespace` with `want`'s devices
    (the new kubelet learns its pods from the API server first): the seconds it took."""
    start = time.monotonic()
    while (seen := await held(node, namespace)) != want:
        assert time.monotonic() - start < within, f"PodResources lists {seen}, not {want}"
        await asyncio.sleep(0.05)
    return time.monotonic() - start


def containers(pod: Pod) -> list[tuple[str | None, int]]:
    statuses = (pod.status.containerStatuses if pod.status else None) or []
    return [(c.containerID, c.restartCount) for c in statuses]


async def test_twenty_restarts_keep_registration_devices_and_running_pods(
    real_node: RealNode, node_sample: Path, kube: AsyncClient, node_namespace: str
) -> None:
    with device_plugin(real_node, node_sample, EXCLUSIVE) as plugin:
        await wait_allocatable(kube, real_node, {HCA: 9})
        holders = {}
        for name, count in (("hold-2", 2), ("hold-1", 1)):
            await pods.create(
                kube, node_namespace, pods.pod_body(name, ["sleep", "3600"], limits={HCA: count})
            )
            holders[name] = await pods.wait_phase(kube, node_namespace, name, ("Running",))
        before = await held(real_node, node_namespace)
        ready_s, listed_s, allocatable_s, held_s = [], [], [], []
        for _ in range(RESTARTS):
            ready_s.append(await asyncio.to_thread(real_node.restart_kubelet))
            listed_s.append(await kubelet_lists(real_node, 9))
            allocatable_s.append(
                ready_s[-1]
                + await node_allocatable_since(kube, real_node.name, real_node.started_at, 9)
            )
            held_s.append(ready_s[-1] + await holds_again(real_node, node_namespace, before))
            for name, pod in holders.items():
                now = await kube.get(Pod, name, namespace=node_namespace)
                assert pods.phase(now) == "Running" and containers(now) == containers(pod)
        late = await pods.create(
            kube, node_namespace, pods.pod_body("late", ["sleep", "3600"], limits={HCA: 2})
        )
        await pods.wait_phase(kube, node_namespace, late, ("Running",))
        after = await held(real_node, node_namespace)
        log = plugin.log_path.read_text()
    taken = before["hold-2"].devices[HCA] | before["hold-1"].devices[HCA]
    assert len(after[late].devices[HCA]) == 2 and not after[late].devices[HCA] & taken
    assert log.count("registered with the kubelet") == RESTARTS + 1
    assert "refused a second Register" not in log and "cannot register" not in log
    assert "device plugin already connected" not in real_node.kubelet_log()
    print(
        f"\n{RESTARTS} kubelet restarts: Node Ready after {_spread(ready_s)}, every HCA listed"
        f" again by the kubelet {_spread(listed_s)} after that, Node allocatable back"
        f" {_spread(allocatable_s)} after the kubelet started, the pods' devices listed again"
        f" {_spread(held_s)} after it started"
    )


def _spread(seconds: list[float]) -> str:
    median = statistics.median(seconds)
    return f"median {median:.2f} s (min {min(seconds):.2f}, max {max(seconds):.2f})"
