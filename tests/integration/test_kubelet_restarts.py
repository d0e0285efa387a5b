"""Kubelet restarts, against a kubelet stand-in in its own process that restarts instantly.

The stand-in (`kubelet_process.py`) shares nothing with the plugin but the generated stubs: it
deletes the sockets in `device-plugins/` and listens on a new `kubelet.sock` within
milliseconds, as a starting kubelet does (on this disk file system the new socket may well get
the old inode). The plugin's periodic safety check is set to an hour, so every re-registration
here was driven by inotify. How fast is measured by bench/deviceplugin.py, not asserted here.
Like the v1.37.2 kubelet the stand-in refuses a second Register from a connected socket (and is
stuck with it): across the 100 restarts the plugin registers exactly once each time.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from kubelet_process import KubeletProcess
from kubelet_standin import agent_with_plugin, device_nodes

from rdmaplane.adapters.discovery import read_node
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.services.agent.root import Agent
from rdmaplane.services.deviceplugin import RdmaDevicePlugin

HOUR = 3600.0
RESTARTS = 100
WITHIN = 30.0  # generous: the machine may be loaded; inotify answers in milliseconds


@pytest.fixture
def kubelet_dir(short_dir: Path) -> Path:
    return short_dir


@pytest.fixture
def dev_root(sample_trees: dict[str, Path], tmp_path: Path) -> Path:
    return device_nodes(sample_trees["hgx-h100-roce"], tmp_path / "dev")


@pytest.mark.parametrize("registration", ["kubelet", "plugins-registry"])
async def test_every_instant_restart_is_followed_by_registration_and_a_full_list(
    registration: str, sample_trees: dict[str, Path], kubelet_dir: Path, dev_root: Path
) -> None:
    sysfs = sample_trees["hgx-h100-roce"]
    topo = read_node(str(sysfs))
    config = PluginSettings(registration=registration)
    plugin = RdmaDevicePlugin(
        config, kubelet_dir=kubelet_dir, dev_root=str(dev_root), recheck_interval=HOUR
    )
    plugin.update(topo)
    watcher = registration == "plugins-registry"
    async with KubeletProcess(kubelet_dir, plugins_registry=watcher) as kubelet:
        await plugin.start()
        try:
            first = await kubelet.registered(WITHIN)
            assert (first.devices, first.healthy) == (len(topo.hcas), len(topo.hcas))
            for _ in range(RESTARTS):
                # plugins-registry: the stand-in deletes our socket there too, so the plugin
                # must serve again for the watcher to find it
                up = await kubelet.restart(wipe_registry=watcher)
                try:
                    seen = await kubelet.registered(WITHIN)
                except TimeoutError:  # what the stand-in saw last
                    pytest.fail(f"no registration after a restart: {kubelet.log[-12:]}")
                assert seen.registered_at > up
                assert (seen.devices, seen.healthy) == (len(topo.hcas), len(topo.hcas))
            assert plugin.servers[0].socket.is_socket()
            if not watcher:  # one Register per restart (the watcher finds sockets itself)
                assert kubelet.accepted == RESTARTS + 1
            assert kubelet.refused == []
        finally:
            await plugin.stop()
    assert not plugin.servers[0].socket.exists()


async def test_the_agents_plugin_registers_again_after_each_restart(
    sample_trees: dict[str, Path], kubelet_dir: Path, tmp_path: Path
) -> None:
    sysfs = Path(shutil.copytree(sample_trees["hgx-h100-roce"], tmp_path / "sys", symlinks=True))
    cfg, plugin = agent_with_plugin(sysfs, kubelet_dir)
    plugin.plugin.servers[0].recheck_interval = HOUR
    agent = Agent(cfg, plugin=plugin)
    async with KubeletProcess(kubelet_dir) as kubelet:
        stop = asyncio.Event()
        run = asyncio.create_task(agent.run(stop))
        try:
            assert (await kubelet.registered(WITHIN)).healthy == 9
            for _ in range(10):
                up = await kubelet.restart()
                seen = await kubelet.registered(WITHIN)
                assert seen.registered_at > up and seen.healthy == 9
            assert kubelet.refused == []
        finally:
            stop.set()
            await asyncio.wait_for(run, 20)
