"""The device plugin with the real kubelet v1.37.2 and containerd: what a pod sees from inside.

`rdmaplane device-plugin` (its own process, as deployed) on the `hgx-h100-roce` sample, the GPU
plugin stand-in beside it, the kubelet's own device manager and Topology Manager on the node's
two NUMA nodes. Each pod prints what it has — `/dev/infiniband`, its environment, its network
interfaces — and the test compares that with what the kubelet's PodResources says it was
given, and with the plan `rdmaplane.core.nccl` makes for exactly those HCAs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from rdmaplane.adapters.config.base import validate
from rdmaplane.adapters.discovery import read_node
from rdmaplane.core.model import Hca, NodeTopology
from rdmaplane.core.nccl import nccl_env
from rdmaplane.core.selectors import Selectors, compute_ports
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.services.deviceplugin.manager import device_id
from tests.node import pods
from tests.node.plugins import GPU, HCA, device_plugin, gpu_plugin, held, wait_allocatable
from tests.node.realnode import NodeSettings, RealNode

# what a container shows of itself, then it holds its devices until deleted
VIEW = (
    "ls /dev/infiniband; echo ---; env; echo ---; "
    "for i in /sys/class/net/*; do echo ${i##*/}; done; echo END; sleep 3600"
)
EXCLUSIVE = {"pools": [{"resourceName": HCA, "nccl": {"socketIfname": "eth0"}}]}
SHARED = "rdmaplane.io/hca-shared"


def topology(sysfs: Path) -> NodeTopology:
    return read_node(str(sysfs))


def hcas_of(topo: NodeTopology, device_ids: frozenset[str]) -> list[Hca]:
    return [h for h in topo.hcas if device_id(h) in device_ids]


def device_files(hcas: list[Hca]) -> set[str]:
    """The /dev/infiniband entries an exclusive grant of `hcas` has: uverbs, umad, rdma_cm."""
    names = {h.uverbs for h in hcas if h.uverbs}
    names |= {p.umad for h in hcas for p in h.ports if p.umad}
    return names | {"rdma_cm"}


def expected_env(topo: NodeTopology, hcas: list[Hca], config: dict[str, Any]) -> dict[str, str]:
    """The environment our plugin plans for exactly `hcas` (rdmaplane.core.nccl) and
    RDMAPLANE_HCAS."""
    pool = validate(PluginSettings, config).pools[0]
    ports = [(h, p) for h, p in compute_ports(topo, Selectors()) if h in hcas]
    return {**nccl_env(topo, ports, pool.nccl), "RDMAPLANE_HCAS": ",".join(h.name for h in hcas)}


def parse_view(text: str) -> tuple[set[str], dict[str, str], set[str]]:
    devices, env, links = (part.strip() for part in text.split("END")[0].split("---"))
    return set(devices.split()), pods.env_lines(env), set(links.split())


async def view(
    kube: AsyncClient, namespace: str, name: str
) -> tuple[set[str], dict[str, str], set[str]]:
    """Once the pod printed its view: its devices, environment and network interfaces."""
    await pods.wait_phase(kube, namespace, name, ("Running",))
    deadline = time.monotonic() + pods.WAIT_S
    while "END" not in (text := await pods.log(kube, namespace, name)):
        assert time.monotonic() < deadline, text
        await asyncio.sleep(0.2)
    return parse_view(text)


@pytest.fixture
def topology_policy(real_node: RealNode, request: pytest.FixtureRequest) -> Iterator[str]:
    """The kubelet restarted with the Topology Manager policy the test names; put back after."""
    policy: str = request.param
    before = real_node.settings
    if before.topology_policy != policy:
        real_node.restart_kubelet(NodeSettings(topology_policy=policy))
    yield policy
    if real_node.settings != before:
        real_node.restart_kubelet(before)


@pytest.mark.parametrize("topology_policy", ["best-effort", "single-numa-node"], indirect=True)
async def test_a_pod_sees_exactly_its_hcas_on_the_gpus_numa_node(
    topology_policy: str, real_node: RealNode, node_sample: Path, kube: AsyncClient,
    node_namespace: str,
) -> None:  # fmt: skip
    topo = topology(node_sample)
    with device_plugin(real_node, node_sample, EXCLUSIVE):
        async with gpu_plugin(real_node, node_sample):
            await wait_allocatable(kube, real_node, {HCA: 9, GPU: 8})
            name = await pods.create(
                kube,
                node_namespace,
                pods.pod_body("two", ["sh", "-c", VIEW], limits={HCA: 2, GPU: 2}),
            )
            devices, env, links = await view(kube, node_namespace, name)
            given = (await held(real_node, node_namespace))[name]
    hcas = hcas_of(topo, given.devices[HCA])
    assert len(hcas) == 2
    assert devices == device_files(hcas)
    want = expected_env(topo, hcas, EXCLUSIVE)
    assert {k: env.get(k) for k in want} == want  # NCCL_IB_HCA, NCCL_IB_GID_INDEX, UCX_*, ...
    assert {"NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "UCX_NET_DEVICES"} <= set(want)
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and "eth0" in links
    gpu_numa = {g.pci.numa for g in topo.gpus if (g.uuid or g.pci.address) in given.devices[GPU]}
    assert {h.numa for h in hcas} == gpu_numa and len(gpu_numa) == 1


@pytest.mark.parametrize("topology_policy", ["single-numa-node"], indirect=True)
async def test_single_numa_node_admits_what_one_numa_node_holds_and_refuses_more(
    topology_policy: str, real_node: RealNode, node_sample: Path, kube: AsyncClient,
    node_namespace: str,
) -> None:  # fmt: skip
    """NUMA node 0 has five HCAs (mlx5_0-3 and the bond), node 1 four: five fit, six do not,
    and the kubelet's own Topology Manager refuses six from our plugin's hints (the scheduler,
    which knows no NUMA, placed it)."""
    topo = topology(node_sample)
    with device_plugin(real_node, node_sample, EXCLUSIVE):
        await wait_allocatable(kube, real_node, {HCA: 9})
        five = await pods.create(
            kube, node_namespace, pods.pod_body("five", ["sleep", "3600"], limits={HCA: 5})
        )
        await pods.wait_phase(kube, node_namespace, five, ("Running",))
        given = (await held(real_node, node_namespace))[five]
        assert {h.numa for h in hcas_of(topo, given.devices[HCA])} == {0}
        await kube.delete(Pod, five, namespace=node_namespace, grace_period=1)
        await pods.gone(kube, node_namespace, five)
        six = await pods.create(
            kube, node_namespace, pods.pod_body("six", ["sleep", "3600"], limits={HCA: 6})
        )
        refused = await pods.wait_phase(kube, node_namespace, six, ("Failed",))
    assert refused.status is not None
    assert refused.status.reason == "TopologyAffinityError", refused.status


async def test_a_shared_pools_pods_each_see_every_hca_of_the_pool(
    real_node: RealNode, node_sample: Path, kube: AsyncClient, node_namespace: str
) -> None:
    topo = topology(node_sample)
    pool = [h for h in topo.hcas if h.name in ("mlx5_4", "mlx5_5")]
    config = {
        "pools": [
            {"resourceName": SHARED, "mode": "shared", "slots": 4,
             "selectors": {"hcaNames": [h.name for h in pool]}}
        ]
    }  # fmt: skip
    with device_plugin(real_node, node_sample, config):
        await wait_allocatable(kube, real_node, {SHARED: 4})
        names = [
            await pods.create(
                kube, node_namespace, pods.pod_body(f"s{i}", ["sh", "-c", VIEW], limits={SHARED: 1})
            )
            for i in range(2)
        ]
        views = [await view(kube, node_namespace, n) for n in names]
        given = await held(real_node, node_namespace, (SHARED,))
    assert len({next(iter(given[n].devices[SHARED])) for n in names}) == 2  # two slots
    for devices, env, _ in views:
        assert devices == device_files(pool)
        want = expected_env(topo, pool, config)
        assert {k: env.get(k) for k in want} == want


async def test_with_cdi_containerd_applies_the_plugins_spec(
    real_node: RealNode, node_sample: Path, kube: AsyncClient, node_namespace: str
) -> None:
    """In CDI mode Allocate names CDI devices and no device nodes: what the pod has, containerd
    v2 took from our spec in its `cdi_spec_dirs`."""
    topo = topology(node_sample)
    config = {**EXCLUSIVE, "cdi": {"enabled": True, "specDir": str(real_node.cdi_dir)}}
    with device_plugin(real_node, node_sample, config):
        await wait_allocatable(kube, real_node, {HCA: 9})
        name = await pods.create(
            kube, node_namespace, pods.pod_body("cdi", ["sh", "-c", VIEW], limits={HCA: 1})
        )
        devices, env, _ = await view(kube, node_namespace, name)
        given = (await held(real_node, node_namespace))[name]
    hcas = hcas_of(topo, given.devices[HCA])
    assert (real_node.cdi_dir / "rdmaplane.io-hca.json").is_file()
    assert devices == device_files(hcas)
    want = expected_env(topo, hcas, config)
    assert {k: env.get(k) for k in want} == want
