"""A kubelet stand-in in a process of its own, restarting the way a kubelet does, instantly.

Run as `python kubelet_process.py KUBELET_DIR [--plugins-registry]`; it reads commands on
stdin (`restart`, `quit`) and prints one JSON object per line on stdout, timed with
CLOCK_MONOTONIC (the same clock in every process of the machine):

    {"ev": "up", "t": ...}                                  kubelet.sock is listening
    {"ev": "registered", "resource": ..., "t": ...}         a plugin registered (or was found)
    {"ev": "list", "resource": ..., "devices": N, "healthy": N, "t": ...}   a ListAndWatch reply

A restart is what a kubelet restart looks like on the node, compressed to milliseconds: the
old server and every stream to plugins die, every socket in `device-plugins/` is deleted (the
device manager's CleanupPluginDirectory: sockets only), and a new `kubelet.sock` listens. On a
disk file system the new socket often gets the old one's inode, and within the same timestamp
tick, its mtime too. With `--plugins-registry` the stand-in also plays the plugin watcher:
sockets in `plugins_registry/` (at start, and whenever one is created, by inotify) are asked
`GetInfo`, dialled and told `NotifyRegistrationStatus`.

It shares no code with the plugin: its own process, its own event loop, only the generated
stubs of the kubelet's .proto files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import stat
import sys
import time
from pathlib import Path

import grpc
from asyncinotify import Inotify, Mask

from rdmaplane.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from rdmaplane.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from rdmaplane.kubelet.api.pluginregistration.v1 import api_pb2 as reg
from rdmaplane.kubelet.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc


def say(ev: str, **fields: object) -> None:
    print(json.dumps({"ev": ev, "t": time.monotonic(), **fields}), flush=True)


class Kubelet(dp_grpc.RegistrationServicer):
    def __init__(self, root: Path, registry: bool) -> None:
        self.plugins_dir = root / "device-plugins"
        self.registry_dir = root / "plugins_registry"
        self.registry = registry
        self.server: grpc.aio.Server | None = None
        self.streams: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.plugins_dir.mkdir(parents=True, exist_ok=True)
        for entry in self.plugins_dir.iterdir():  # CleanupPluginDirectory: sockets only
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(entry.stat().st_mode):
                    entry.unlink()
        self.server = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.plugins_dir / 'kubelet.sock'}")
        await self.server.start()
        say("up")
        if self.registry:
            for sock in sorted(self.registry_dir.glob("*")):
                self.found(sock)

    async def stop(self) -> None:
        for task in list(self.streams):
            task.cancel()
        if self.server is not None:
            await self.server.stop(None)
            self.server = None

    async def Register(self, request: dp.RegisterRequest, context: object) -> dp.Empty:
        # the device manager dials the plugin before it answers
        endpoint = str(self.plugins_dir / request.endpoint)
        channel = grpc.aio.insecure_channel(f"unix://{endpoint}")
        stub = dp_grpc.DevicePluginStub(channel)
        await stub.GetDevicePluginOptions(dp.Empty(), timeout=10, wait_for_ready=True)
        say("registered", resource=request.resource_name)
        self.follow(request.resource_name, channel)
        return dp.Empty()

    def found(self, sock: Path) -> None:
        """The plugin watcher saw a socket: ask it who it is, connect, notify."""
        if sock.name.startswith(".") or not sock.is_socket():
            return
        self.spawn(self._register_found(sock))

    async def _register_found(self, sock: Path) -> None:
        channel = grpc.aio.insecure_channel(f"unix://{sock}")
        with contextlib.suppress(grpc.aio.AioRpcError):
            watcher = reg_grpc.RegistrationStub(channel)
            info = await watcher.GetInfo(reg.InfoRequest(), timeout=10)
            await watcher.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=True), timeout=10
            )
            say("registered", resource=info.name)
            await self._list_and_watch(info.name, channel)

    def follow(self, resource: str, channel: grpc.aio.Channel) -> None:
        self.spawn(self._list_and_watch(resource, channel))

    def spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self.streams.add(task)
        task.add_done_callback(self.streams.discard)

    async def _list_and_watch(self, resource: str, channel: grpc.aio.Channel) -> None:
        try:
            with contextlib.suppress(grpc.aio.AioRpcError):
                async for response in dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty()):
                    healthy = sum(d.health == "Healthy" for d in response.devices)
                    say("list", resource=resource, devices=len(response.devices), healthy=healthy)
        finally:
            await channel.close()


async def watch_registry(kubelet: Kubelet) -> None:
    kubelet.registry_dir.mkdir(parents=True, exist_ok=True)
    with Inotify() as inotify:
        inotify.add_watch(kubelet.registry_dir, Mask.CREATE | Mask.MOVED_TO)
        async for event in inotify:
            if event.path is not None:
                kubelet.found(event.path)


async def main(root: Path, registry: bool) -> None:
    kubelet = Kubelet(root, registry)
    watcher = asyncio.create_task(watch_registry(kubelet)) if registry else None
    await kubelet.start()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        if line == "restart":
            await kubelet.stop()
            await kubelet.start()
        elif line == "quit":
            break
    if watcher is not None:
        watcher.cancel()
    await kubelet.stop()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), "--plugins-registry" in sys.argv[2:]))
