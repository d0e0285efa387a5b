"""The agent and the RDMA netns mode, in one process on sample trees: the label, RDMAReady's
`NetnsExclusive` while shared pools cannot be served and its recovery when the mode changes,
and `fixNetnsMode` against the kernel's recorded RDMA netlink answers (`tests/rdma_kernel.py`).
The same against a real API server and kube-scheduler: tests/e2e/test_netns_mode.py."""

from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path

import grpc
import pytest

from rdmaplane.adapters.discovery.rdma_netlink import RdmaNetlink
from rdmaplane.adapters.discovery.sysfs import NETNS_PARAMETER
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from rdmaplane.core import nrt
from rdmaplane.core.model import NetnsMode
from rdmaplane.core.settings.deviceplugin import PluginSettings, Pool
from rdmaplane.services.agent.deviceplugin import EmbeddedPlugin
from rdmaplane.services.agent.root import Agent
from tests.integration.kubelet_standin import device_nodes
from tests.integration.test_agent_service import Running, config, next_health, until
from tests.rdma_kernel import SYS_SET_SHARED, FakeKernel, ack, error_reply

SHARED_POOL = (Pool(), Pool(mode="shared"))


def exclusive_tree(sample_trees: dict[str, Path], tmp_path: Path, name: str) -> Path:
    root = Path(shutil.copytree(sample_trees[name], tmp_path / "sys", symlinks=True))
    (root / NETNS_PARAMETER).write_text("N\n")
    return root


@pytest.fixture
def node(sample_trees: dict[str, Path], tmp_path: Path) -> Path:
    """The HGX node switched to exclusive mode."""
    return exclusive_tree(sample_trees, tmp_path, "hgx-h100-roce")


async def test_shared_pools_make_an_exclusive_node_unready_until_the_mode_changes(
    node: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="rdmaplane.services.agent")
    async with Running(Agent(config(node, tmp_path), pools=SHARED_POOL)) as run:
        agent = run.agent
        desired = agent.desired()
        assert desired.labels[nrt.LABEL_RDMA_NETNS] == "exclusive"
        ready = desired.condition
        assert (ready.status, ready.reason) == (False, "NetnsExclusive")
        assert "shared device plugin pools need shared mode: rdmaplane.io/hca-shared (" in (
            ready.message
        )
        assert "mlx5_0, mlx5_1" in ready.message and "netns_mode=1" in ready.message
        assert "exclusive pools" in ready.message  # what to do if exclusive mode is meant
        warned = [r for r in caplog.records if r.getMessage() == ready.message]
        assert [r.levelname for r in warned] == ["WARNING"]

        (node / NETNS_PARAMETER).write_text("Y\n")  # `rdma system set netns shared`
        await until(lambda: agent.condition is not None and agent.condition.status)
        assert agent.condition.reason == "AllDevicesHealthy"
        assert agent.desired().labels[nrt.LABEL_RDMA_NETNS] == "shared"
        assert "the shared pools are served again (RDMA netns mode shared)" in caplog.text

        (node / NETNS_PARAMETER).write_text("junk\n")  # the mode cannot be told: no label
        await until(lambda: agent.topo.netns_mode is NetnsMode.UNKNOWN)
        assert agent.desired().labels[nrt.LABEL_RDMA_NETNS] is None  # removed from the node
        assert agent.condition.status


async def test_the_embedded_plugin_holds_shared_slots_back_while_exclusive(
    node: Path, short_dir: Path
):
    """ListAndWatch: the shared pool's slots Unhealthy in exclusive mode, the exclusive pool's
    HCAs Healthy; both Healthy once the node shares."""
    cfg = config(node, short_dir)
    dev_root = device_nodes(node, short_dir / "dev")
    plugin_config = PluginSettings(pools=(Pool(), Pool(mode="shared", slots=4)))
    plugin = EmbeddedPlugin(plugin_config, kubelet_dir=cfg.kubelet_dir, dev_root=dev_root)
    async with Running(Agent(cfg, plugin=plugin, pools=plugin_config.pools)):
        sockets = sorted((cfg.kubelet_dir / "device-plugins").glob("rdmaplane-*.sock"))
        shared = next(s for s in sockets if "shared" in s.name)
        exclusive = next(s for s in sockets if "shared" not in s.name)
        async with (
            grpc.aio.insecure_channel(f"unix://{shared}") as to_shared,
            grpc.aio.insecure_channel(f"unix://{exclusive}") as to_exclusive,
        ):
            slots = dp_grpc.DevicePluginStub(to_shared).ListAndWatch(dp.Empty())
            hcas = dp_grpc.DevicePluginStub(to_exclusive).ListAndWatch(dp.Empty())
            assert set((await next_health(slots)).values()) == {"Unhealthy"}
            assert set((await next_health(hcas)).values()) == {"Healthy"}
            (node / NETNS_PARAMETER).write_text("Y\n")
            while set((await next_health(slots)).values()) != {"Healthy"}:
                pass
            slots.cancel()
            hcas.cancel()


async def test_exclusive_pools_are_served_in_exclusive_mode(
    sample_trees: dict[str, Path], tmp_path: Path
):
    """The SR-IOV node: exclusive mode with VFs in pods is what it is built for."""
    tree = Path(shutil.copytree(sample_trees["sriov-exclusive"], tmp_path / "sys", symlinks=True))
    agent = Agent(config(tree, tmp_path))
    await agent.discover("start")
    desired = agent.desired()
    assert desired.labels[nrt.LABEL_RDMA_NETNS] == "exclusive"
    assert (desired.condition.status, desired.condition.reason) == (True, "AllDevicesHealthy")


def flips_the_tree(node: Path) -> FakeKernel:
    """A kernel that switches when asked: ib_core's parameter follows, as it does."""

    def switch(request: bytes) -> list[bytes]:
        (node / NETNS_PARAMETER).write_text("Y\n")
        return [ack(request)]

    return FakeKernel(switch)


async def test_fix_netns_mode_switches_to_shared_at_start(
    node: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="rdmaplane.services.agent")
    kernel = flips_the_tree(node)
    cfg = config(node, tmp_path, fix_netns_mode=True)
    agent = Agent(cfg, pools=SHARED_POOL, netlink=RdmaNetlink(kernel.connect))
    async with Running(agent):
        assert kernel.requests == [SYS_SET_SHARED]
        assert agent.topo.netns_mode is NetnsMode.SHARED  # rediscovered before serving
        assert agent.condition.status
    assert "switched the RDMA subsystem from exclusive to shared network-namespace mode" in (
        caplog.text
    )


@pytest.mark.parametrize(
    ("code", "hint"),
    [(errno.EBUSY, "switch at boot instead"), (errno.EPERM, "needs the NET_ADMIN capability")],
)
async def test_a_refused_switch_is_said_and_the_agent_serves_on(
    node: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, code: int, hint: str
):
    kernel = FakeKernel([error_reply(code, SYS_SET_SHARED)])
    cfg = config(node, tmp_path, fix_netns_mode=True)
    async with Running(Agent(cfg, pools=SHARED_POOL, netlink=RdmaNetlink(kernel.connect))) as run:
        assert kernel.requests == [SYS_SET_SHARED]
        assert run.agent.condition.reason == "NetnsExclusive"
        assert (await run.get("/healthz")).status_code == 200
    refused = [r for r in caplog.records if r.getMessage().startswith("not switching")]
    assert len(refused) == 1 and refused[0].levelname == "WARNING"
    assert hint in refused[0].getMessage()


async def test_no_switch_while_hcas_are_in_other_namespaces(
    sample_trees: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """VFs an RDMA CNI moved into pods: exclusive mode is in use, the agent leaves it."""
    tree = Path(shutil.copytree(sample_trees["sriov-exclusive"], tmp_path / "sys", symlinks=True))
    kernel = FakeKernel()
    agent = Agent(config(tree, tmp_path, fix_netns_mode=True), netlink=RdmaNetlink(kernel.connect))
    async with Running(agent):
        assert agent.topo.netns_mode is NetnsMode.EXCLUSIVE
    assert kernel.requests == []  # never asked the kernel
    assert (
        "not switching the RDMA subsystem to shared network-namespace mode: mlx5_2, mlx5_6 are "
        "in other network namespaces" in caplog.text
    )


async def test_fix_netns_mode_leaves_a_shared_node_alone(
    sample_trees: dict[str, Path], tmp_path: Path
):
    tree = Path(shutil.copytree(sample_trees["workstation"], tmp_path / "sys", symlinks=True))
    kernel = FakeKernel()
    agent = Agent(config(tree, tmp_path, fix_netns_mode=True), netlink=RdmaNetlink(kernel.connect))
    async with Running(agent):
        assert agent.topo.netns_mode is NetnsMode.SHARED
    assert kernel.requests == []
