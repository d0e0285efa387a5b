"""The device plugin against the kubelet stand-in, over real unix sockets, on sample sysfs trees."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubelet_standin import KubeletStandIn, device_nodes

from rdmaplane.adapters.config import parse
from rdmaplane.adapters.config.base import validate
from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG
from rdmaplane.adapters.discovery import read_node, samples
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from rdmaplane.core.nccl import nccl_env
from rdmaplane.core.selectors import Selectors, compute_ports
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.services.deviceplugin import RdmaDevicePlugin
from rdmaplane.services.deviceplugin import plugin as plugin_module
from rdmaplane.services.deviceplugin.manager import device_id
from rdmaplane.services.deviceplugin.plugin import poll_topology

POLL = 0.05


@pytest.fixture(scope="module")
def sysfs() -> Iterator[Path]:
    """This module's own tree (its tests change it, and put it back)."""
    with samples.materialised("hgx-h100-roce") as root:
        yield root


@pytest.fixture(scope="module")
def dev_root(tmp_path_factory: pytest.TempPathFactory, sysfs: Path) -> Path:
    """Device nodes as plain files: every uverbs/umad/issm the sample has, and rdma_cm."""
    return device_nodes(sysfs, tmp_path_factory.mktemp("dev"))


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    """Short: unix socket paths are limited to 107 bytes, pytest's tmp_path can be longer."""
    with tempfile.TemporaryDirectory(prefix="kl-") as short:
        yield Path(short)


def make_plugin(config: dict[str, object], kubelet_dir: Path, dev_root: Path) -> RdmaDevicePlugin:
    cfg = validate(PluginSettings, {"healthPollInterval": POLL, "resendInterval": 5, **config})
    return RdmaDevicePlugin(cfg, kubelet_dir=kubelet_dir, dev_root=str(dev_root), max_backoff=0.2)


@contextlib.asynccontextmanager
async def running(
    plugin: RdmaDevicePlugin, sysfs: Path, kubelet: KubeletStandIn | None
) -> AsyncIterator[None]:
    if kubelet:
        await kubelet.start()
    plugin.update(read_node(str(sysfs)))
    await plugin.start()
    poller = asyncio.create_task(poll_topology(plugin, str(sysfs), POLL))
    try:
        yield
    finally:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
        await plugin.stop()
        if kubelet:
            await kubelet.stop()


def allocate_request(ids: list[str]) -> dp.AllocateRequest:
    return dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])


def device_count(kubelet: KubeletStandIn, resource: str = "rdmaplane.io/hca") -> int:
    plugin = kubelet.plugins.get(resource)
    return len(plugin.devices) if plugin else 0


def expected_devices(sysfs: Path) -> dict[str, tuple[int, ...]]:
    topo = read_node(str(sysfs))
    return {device_id(h): (h.numa,) for h in topo.hcas if h.numa is not None}


async def test_registers_every_hca_with_its_numa_node(
    sysfs: Path, dev_root: Path, kubelet_dir: Path
) -> None:
    kubelet = KubeletStandIn(kubelet_dir)
    plugin = make_plugin({}, kubelet_dir, dev_root)
    async with running(plugin, sysfs, kubelet):
        await kubelet.wait_for(lambda: "rdmaplane.io/hca" in kubelet.plugins)
        seen = kubelet.plugins["rdmaplane.io/hca"]
        await kubelet.wait_for(lambda: seen.lists > 0)
        assert kubelet.registrations[0].version == "v1beta1"
        assert kubelet.registrations[0].options.get_preferred_allocation_available
        assert {i: d.numa for i, d in seen.devices.items()} == expected_devices(sysfs)
        assert len(seen.devices) == 9
        assert {d.health for d in seen.devices.values()} == {"Healthy"}


async def test_port_down_turns_unhealthy_and_back(
    sysfs: Path, dev_root: Path, kubelet_dir: Path
) -> None:
    kubelet = KubeletStandIn(kubelet_dir)
    plugin = make_plugin({}, kubelet_dir, dev_root)
    state = sysfs / "class/infiniband/mlx5_3/ports/1/state"
    victim = device_id(read_node(str(sysfs)).hca("mlx5_3"))  # type: ignore[arg-type]
    async with running(plugin, sysfs, kubelet):
        await kubelet.wait_for(lambda: "rdmaplane.io/hca" in kubelet.plugins)
        seen = kubelet.plugins["rdmaplane.io/hca"]
        await kubelet.wait_for(lambda: seen.devices.get(victim, None) is not None)
        try:
            state.write_text("1: DOWN\n")
            await kubelet.wait_for(lambda: seen.devices[victim].health == "Unhealthy")
            others = {d.health for i, d in seen.devices.items() if i != victim}
            assert others == {"Healthy"}
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await kubelet.stub("rdmaplane.io/hca").Allocate(
                    allocate_request([victim]), timeout=5
                )
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "mlx5_3" in (refused.value.details() or "")
            assert "DOWN" in (refused.value.details() or "")
        finally:
            state.write_text("4: ACTIVE\n")
        await kubelet.wait_for(lambda: seen.devices[victim].health == "Healthy")


async def test_full_reads_only_when_the_probe_sees_a_change(
    sysfs: Path, dev_root: Path, kubelet_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full read is two (the second proves the probe's baseline matches the first); after
    the start, only a change the probe sees causes one."""
    plugin = make_plugin({}, kubelet_dir, dev_root)
    state = sysfs / "class/infiniband/mlx5_5/ports/1/state"
    manager = plugin.servers[0].manager
    reads: list[str] = []

    def counting_read(root: str) -> Any:
        reads.append(root)
        return read_node(root)

    monkeypatch.setattr(plugin_module, "read_node", counting_read)

    def healthy() -> bool:
        return next(d for d in manager.devices if d.hcas == ("mlx5_5",)).healthy

    poller = asyncio.create_task(poll_topology(plugin, str(sysfs), POLL))
    try:
        await asyncio.sleep(POLL * 10)
        assert len(reads) == 2  # the start, then ten quiet polls: probes only
        state.write_text("1: DOWN\n")
        for _ in range(200):
            if not healthy():
                break
            await asyncio.sleep(POLL)
        assert not healthy()
        await asyncio.sleep(POLL * 5)
        assert len(reads) == 4
    finally:
        state.write_text("4: ACTIVE\n")
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller


async def test_vanished_hca_is_reported_unhealthy(
    sysfs: Path, dev_root: Path, kubelet_dir: Path
) -> None:
    kubelet = KubeletStandIn(kubelet_dir)
    plugin = make_plugin({}, kubelet_dir, dev_root)
    victim = device_id(read_node(str(sysfs)).hca("mlx5_7"))  # type: ignore[arg-type]
    async with running(plugin, sysfs, kubelet):
        await kubelet.wait_for(lambda: "rdmaplane.io/hca" in kubelet.plugins)
        seen = kubelet.plugins["rdmaplane.io/hca"]
        await kubelet.wait_for(lambda: victim in seen.devices)
        link = sysfs / "class/infiniband/mlx5_7"
        target = os.readlink(link)
        link.unlink()
        try:
            await kubelet.wait_for(lambda: seen.devices[victim].health == "Unhealthy")
            assert len(seen.devices) == 9
        finally:
            link.symlink_to(target)
        await kubelet.wait_for(lambda: seen.devices[victim].health == "Healthy")


async def test_waits_for_a_kubelet_that_is_not_there_yet(
    sysfs: Path, dev_root: Path, kubelet_dir: Path
) -> None:
    plugin = make_plugin({}, kubelet_dir, dev_root)
    async with running(plugin, sysfs, None):
        await asyncio.sleep(0.3)  # a few failed Register attempts
        kubelet = KubeletStandIn(kubelet_dir)
        await kubelet.start()
        try:
            await kubelet.wait_for(lambda: "rdmaplane.io/hca" in kubelet.plugins)
            seen = kubelet.plugins["rdmaplane.io/hca"]
            await kubelet.wait_for(lambda: len(seen.devices) == 9)
        finally:
            await kubelet.stop()


async def test_a_kubelet_holding_a_stale_endpoint_is_asked_once(
    sysfs: Path, dev_root: Path, kubelet_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A v1.37.2 kubelet that refused a second Register from our socket refuses every later one
    until it restarts: the plugin asks once and says so (retrying every 0.2 s would only add
    refusals); the next kubelet start registers."""
    kubelet = KubeletStandIn(kubelet_dir)
    plugin = make_plugin({}, kubelet_dir, dev_root)
    kubelet.records.endpoints.add(str(plugin.servers[0].socket))  # what that refusal left
    async with running(plugin, sysfs, kubelet):
        await kubelet.wait_for(lambda: bool(kubelet.refusals), within=10)
        await asyncio.sleep(10 * 0.2)  # ten of the plugin's retry intervals (max_backoff)
        assert len(kubelet.registrations) == 1
        assert kubelet.refusals == [f"device plugin already connected: {plugin.servers[0].socket}"]
        assert "refuses every later one too, until it restarts: not retrying" in caplog.text
        assert "rdmaplane.io/hca" not in kubelet.plugins
        await kubelet.restart()
        await kubelet.wait_for(lambda: device_count(kubelet) == 9)
        assert len(kubelet.registrations) == 2 and len(kubelet.refusals) == 1


async def test_a_restarted_registration_task_does_not_register_again(
    sysfs: Path, dev_root: Path, kubelet_dir: Path
) -> None:
    """The supervisor restarts a task that failed; the state is the pool's, not the task's, so
    the restarted loop knows it registered with this kubelet, or waits for the answer of the
    Register it had sent (a second Register is fatal)."""
    kubelet = KubeletStandIn(kubelet_dir)
    kubelet.register_delay = 0.5
    plugin = make_plugin({}, kubelet_dir, dev_root)
    async with running(plugin, sysfs, kubelet):
        pool = plugin.servers[0]
        tasks = plugin._own_tasks
        assert tasks is not None
        await asyncio.wait_for(kubelet.register_received.wait(), 10)  # answered in 0.5 s
        for _ in range(3):  # the first while the Register waits for its answer
            await tasks.cancel(pool.task_name)
            tasks.spawn(pool.task_name, pool.kept.run)
            (kubelet_dir / "device-plugins" / "wake").touch()  # a change: it looks again
            await asyncio.sleep(0.3)
        await kubelet.wait_for(lambda: device_count(kubelet) == 9)
        assert len(kubelet.registrations) == 1 and kubelet.refusals == []
        assert pool.registrations == 1
        await kubelet.restart()
        await kubelet.wait_for(lambda: device_count(kubelet) == 9)
        assert len(kubelet.registrations) == 2 and kubelet.refusals == []


async def test_allocate_returns_exactly_the_allocated_set(
    sysfs: Path, dev_root: Path, kubelet_dir: Path
) -> None:
    kubelet = KubeletStandIn(kubelet_dir)
    plugin = make_plugin({"pools": [{"nccl": {"socketIfname": "eno1"}}]}, kubelet_dir, dev_root)
    topo = read_node(str(sysfs))
    async with running(plugin, sysfs, kubelet):
        await kubelet.wait_for(lambda: device_count(kubelet) == 9)
        ids, response = await kubelet.admit("rdmaplane.io/hca", 2, numa_affinity={1})
    hcas = [h for h in topo.hcas if device_id(h) in ids]
    assert len(hcas) == 2 and {h.numa for h in hcas} == {1}
    want_nodes = {f"/dev/infiniband/{h.uverbs}" for h in hcas}
    want_nodes |= {f"/dev/infiniband/{p.umad}" for h in hcas for p in h.ports if p.umad}
    want_nodes |= {"/dev/infiniband/rdma_cm"}
    assert {d.host_path for d in response.devices} == want_nodes
    assert all(d.container_path == d.host_path for d in response.devices)
    assert {d.permissions for d in response.devices} == {"rw"}
    ports = [(h, p) for h, p in compute_ports(topo, Selectors()) if h in hcas]
    want_env = dict(nccl_env(topo, ports, plugin.servers[0].manager.pool.nccl))
    want_env["RDMAPLANE_HCAS"] = ",".join(h.name for h in hcas)
    assert dict(response.envs) == want_env
    assert not response.cdi_devices


async def test_a_repeated_allocate_answers_from_the_current_state(
    sysfs: Path, dev_root: Path, kubelet_dir: Path
) -> None:
    """The answer for a set of devices is built once and kept, but never past a change: a
    device node that went is gone from the next answer for the same device."""
    kubelet = KubeletStandIn(kubelet_dir)
    plugin = make_plugin({}, kubelet_dir, dev_root)
    hca = read_node(str(sysfs)).hca("mlx5_0")
    assert hca is not None and hca.ports[0].umad
    umad = dev_root / "infiniband" / hca.ports[0].umad
    async with running(plugin, sysfs, kubelet):
        await kubelet.wait_for(lambda: device_count(kubelet) == 9)
        stub = kubelet.stub("rdmaplane.io/hca")
        request = allocate_request([device_id(hca)])
        first, again = [await stub.Allocate(request, timeout=5) for _ in range(2)]
        assert first == again
        assert f"/dev/infiniband/{umad.name}" in {
            d.host_path for d in first.container_responses[0].devices
        }
        umad.unlink()
        try:
            plugin.recheck()
            after = (await stub.Allocate(request, timeout=5)).container_responses[0]
        finally:
            umad.touch()
            plugin.recheck()
    paths = {d.host_path for d in after.devices}
    assert f"/dev/infiniband/{hca.uverbs}" in paths
    assert f"/dev/infiniband/{umad.name}" not in paths


async def test_preferred_allocation_keeps_to_one_numa_node(
    sysfs: Path, dev_root: Path, kubelet_dir: Path
) -> None:
    kubelet = KubeletStandIn(kubelet_dir)
    plugin = make_plugin({}, kubelet_dir, dev_root)
    topo = read_node(str(sysfs))
    async with running(plugin, sysfs, kubelet):
        await kubelet.wait_for(lambda: device_count(kubelet) == 9)
        ids, _ = await kubelet.admit("rdmaplane.io/hca", 4)
    numa = {h.numa for h in topo.hcas if device_id(h) in ids}
    assert len(ids) == 4 and len(numa) == 1


async def test_bad_device_id_is_a_clear_grpc_error(
    sysfs: Path, dev_root: Path, kubelet_dir: Path
) -> None:
    kubelet = KubeletStandIn(kubelet_dir)
    plugin = make_plugin({}, kubelet_dir, dev_root)
    async with running(plugin, sysfs, kubelet):
        await kubelet.wait_for(lambda: device_count(kubelet) == 9)
        stub = kubelet.stub("rdmaplane.io/hca")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.Allocate(allocate_request(["0000:ff:00.0"]), timeout=5)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert "unknown device ID '0000:ff:00.0'" in (e.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.GetPreferredAllocation(
                dp.PreferredAllocationRequest(
                    container_requests=[
                        dp.ContainerPreferredAllocationRequest(
                            available_deviceIDs=["a", "b"], allocation_size=3
                        )
                    ]
                ),
                timeout=5,
            )
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "allocation size 3 exceeds 2 available" in (e.value.details() or "")
        ids, response = await kubelet.admit("rdmaplane.io/hca", 1)  # still serving
        assert len(ids) == 1 and response.devices


async def test_shared_pool_from_the_shared_rdma_plugin_config(
    sysfs: Path, dev_root: Path, kubelet_dir: Path
) -> None:
    legacy = {
        "periodicUpdateInterval": POLL,
        "configList": [
            {
                "resourceName": "hca_shared_devices_a",
                "resourcePrefix": "rdma",
                "rdmaHcaMax": 5,
                "selectors": {"vendors": ["15b3"], "ifNames": ["ens112np0", "ens113np0"]},
            }
        ],
    }
    cfg = parse(legacy, DEVICE_PLUGIN_CONFIG, "legacy.json")
    plugin = RdmaDevicePlugin(cfg, kubelet_dir=kubelet_dir, dev_root=str(dev_root))
    kubelet = KubeletStandIn(kubelet_dir)
    topo = read_node(str(sysfs))
    async with running(plugin, sysfs, kubelet):
        name = "rdma/hca_shared_devices_a"
        await kubelet.wait_for(lambda: device_count(kubelet, name) == 5)
        assert {d.numa for d in kubelet.plugins[name].devices.values()} == {(1,)}
        _, response = await kubelet.admit(name, 1)
    pool = [topo.hca("mlx5_4"), topo.hca("mlx5_5")]
    want = {f"/dev/infiniband/{h.uverbs}" for h in pool if h}
    want |= {f"/dev/infiniband/{p.umad}" for h in pool if h for p in h.ports}
    assert {d.host_path for d in response.devices} == want | {"/dev/infiniband/rdma_cm"}
    assert response.envs["RDMAPLANE_HCAS"] == "mlx5_4,mlx5_5"


async def test_plugins_registry_mode(sysfs: Path, dev_root: Path, kubelet_dir: Path) -> None:
    plugin = make_plugin({"registration": "plugins-registry"}, kubelet_dir, dev_root)
    kubelet = KubeletStandIn(kubelet_dir)
    async with running(plugin, sysfs, kubelet):
        infos = await kubelet.discover_registry()
        assert [(i.type, i.name, list(i.supported_versions)) for i in infos] == [
            ("DevicePlugin", "rdmaplane.io/hca", ["v1beta1"])
        ]
        await kubelet.wait_for(lambda: len(kubelet.plugins["rdmaplane.io/hca"].devices) == 9)
        assert not kubelet.registrations  # nothing went through device-plugins/kubelet.sock
        await kubelet.wait_for(lambda: plugin.servers[0].registrations == 1)


async def test_cdi_mode_names_cdi_devices_and_writes_the_spec(
    sysfs: Path, dev_root: Path, kubelet_dir: Path, tmp_path: Path
) -> None:
    spec_dir = tmp_path / "cdi"
    plugin = make_plugin(
        {"cdi": {"enabled": True, "specDir": str(spec_dir)}}, kubelet_dir, dev_root
    )
    kubelet = KubeletStandIn(kubelet_dir)
    topo = read_node(str(sysfs))
    async with running(plugin, sysfs, kubelet):
        await kubelet.wait_for(lambda: device_count(kubelet) == 9)
        ids, response = await kubelet.admit("rdmaplane.io/hca", 1)
    hca = next(h for h in topo.hcas if device_id(h) == ids[0])
    assert [c.name for c in response.cdi_devices] == [f"rdmaplane.io/hca={hca.name}"]
    assert not response.devices and response.envs["RDMAPLANE_HCAS"] == hca.name
    spec = json.loads((spec_dir / "rdmaplane.io-hca.json").read_text())
    assert spec["kind"] == "rdmaplane.io/hca"
    entry = next(d for d in spec["devices"] if d["name"] == hca.name)
    paths = {n["path"] for n in entry["containerEdits"]["deviceNodes"]}
    assert f"/dev/infiniband/{hca.uverbs}" in paths


@contextlib.contextmanager
def standalone(
    sysfs: Path, dev_root: Path, kubelet_dir: Path, config: Path, **env: str
) -> Iterator[subprocess.Popen[bytes]]:
    """`rdmaplane device-plugin` in a process of its own, serving: yields once its socket is
    there; killed if still running at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rdmaplane", "device-plugin", "--config", str(config),
         "--sysfs-root", str(sysfs), "--dev-root", str(dev_root),
         "--kubelet-dir", str(kubelet_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **env},
    )  # fmt: skip
    socket = kubelet_dir / "device-plugins" / "rdmaplane-rdmaplane.io_hca.sock"
    try:
        deadline = time.monotonic() + 60
        while not socket.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert socket.exists(), proc.stdout.read().decode() if proc.poll() is not None else ""
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_shuts_down_cleanly_and_removes_the_socket(
    sysfs: Path, dev_root: Path, kubelet_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "dp.yaml"
    config.write_text(
        "apiVersion: rdmaplane.io/v1alpha1\nkind: DevicePluginConfig\nhealthPollInterval: 0.05\n"
    )
    with standalone(sysfs, dev_root, kubelet_dir, config) as proc:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out.decode()
    assert not (kubelet_dir / "device-plugins" / "rdmaplane-rdmaplane.io_hca.sock").exists()
    assert b"shutting down" in out


# What the command needs to check its input, and the serving process must not carry; and
# OpenSSL's module, which asyncio would load (`ssl` itself is looked up and refused). YAML is
# loaded here only for the sample tree's sidecar, which a live /sys does not have.
CHECKING_ONLY = {"pydantic", "pydantic_core", "typer", "click", "rich", "_ssl"}


def test_the_standalone_plugin_serves_as_one_lean_process(
    sysfs: Path, dev_root: Path, kubelet_dir: Path, tmp_path: Path
) -> None:
    """The command checks its input, then becomes the serving process (the same PID, no
    child), which never imports the CLI, the validator or ssl: seen in the import log of
    the second interpreter (PYTHONPROFILEIMPORTTIME survives the exec)."""
    config = tmp_path / "dp.yaml"
    config.write_text("apiVersion: rdmaplane.io/v1alpha1\nkind: DevicePluginConfig\n")
    with standalone(sysfs, dev_root, kubelet_dir, config, PYTHONPROFILEIMPORTTIME="1") as proc:
        argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=20)[0].decode()
    assert argv[1:3] == [b"-m", b"rdmaplane.services.deviceplugin.root"] and not children
    lines = out.splitlines()
    starts = [i for i, line in enumerate(lines) if line.endswith("| site")]
    assert len(starts) == 2, "expected two interpreters: the command's and the serving one"
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in lines[starts[1] :]
        if line.startswith("import time:")
    }
    assert {"grpc", "asyncio", "rdmaplane.services.deviceplugin.plugin"} <= imported
    assert not {m for m in imported if m.split(".")[0] in CHECKING_ONLY}


async def test_list_is_resent_on_the_periodic_tick(
    sysfs: Path, dev_root: Path, kubelet_dir: Path
) -> None:
    kubelet = KubeletStandIn(kubelet_dir)
    plugin = make_plugin({"resendInterval": 0.1}, kubelet_dir, dev_root)
    async with running(plugin, sysfs, kubelet):
        await kubelet.wait_for(lambda: device_count(kubelet) == 9)
        seen = kubelet.plugins["rdmaplane.io/hca"]
        first = seen.lists
        await kubelet.wait_for(lambda: seen.lists >= first + 3)  # nothing changed meanwhile
        assert device_count(kubelet) == 9


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "run `rdmaplane device-plugin`"),
        (["0"], "fd 0: cannot read the handed-over settings"),
        (["99"], "fd 99: cannot read the handed-over settings: [Errno 9]"),
    ],
)
def test_the_serving_module_alone_says_what_it_is_for(args: list[str], said: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rdmaplane.services.deviceplugin.root", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {said}") and done.stderr.count("\n") == 1
