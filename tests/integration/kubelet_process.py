"""A kubelet stand-in in a process of its own, restarting the way a kubelet does, instantly.

Run as `python kubelet_process.py KUBELET_DIR [--plugins-registry]` (or through
`KubeletProcess` below); it reads commands on stdin (`restart`, `restart wipe-registry`, `quit`)
and prints one JSON object per line on stdout, timed with CLOCK_MONOTONIC (the same clock in
every process of the machine):

    {"ev": "up", "t": ...}                                  kubelet.sock is listening
    {"ev": "registered", "resource": ..., "t": ...}         a plugin registered (or was found)
    {"ev": "list", "resource": ..., "devices": N, "healthy": N, "t": ...}   a ListAndWatch reply
    {"ev": "refused", "resource": ..., "error": ..., "t": ...}   a Register refused

A restart is what a kubelet restart looks like on the node, compressed to milliseconds: the
old server and every stream to plugins die, every file in `device-plugins/` is deleted (as a
starting kubelet does), and a new `kubelet.sock` listens at once, no pause. On a
disk file system the new socket often gets the old one's inode, and within the same timestamp
tick, its mtime too. With `--plugins-registry` the stand-in also plays the plugin watcher:
sockets in `plugins_registry/` (at start, and whenever one is created, by inotify) are asked
`GetInfo`, dialled and told `NotifyRegistrationStatus` (a `DRAPlugin` is validated as the DRA
manager does and reported as registered; its endpoint is dialled when used, not here).
`restart wipe-registry` deletes the sockets in `plugins_registry/` too (harsher than a
kubelet: the plugin must serve again). A stopping kubelet registers nothing more: what its
watcher finds while it stops is dropped, and its registrations in flight are cancelled.

It shares no code with the plugin: its own process, its own event loop, only the generated
stubs of the kubelet's .proto files. Like the v1.37.2 kubelet it refuses a second Register from
a socket it is connected to, and is then stuck the same way (`DeviceManagerRecords`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from asyncinotify import Inotify, Mask

from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from rdmaplane.adapters.kubelet.api.pluginregistration.v1 import api_pb2 as reg
from rdmaplane.adapters.kubelet.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc


def say(ev: str, **fields: object) -> None:
    print(json.dumps({"ev": ev, "t": time.monotonic(), **fields}), flush=True)


_serial = itertools.count()


async def listen(servicer: dp_grpc.RegistrationServicer, socket: Path) -> grpc.aio.Server:
    """A started Registration server on `socket`, bound under a hidden name and renamed into
    place. Binding `socket` itself would race the server of the previous life: gRPC-Python
    unlinks the path a server bound when its listener is torn down, which can happen after
    `stop()` returned and after the next server bound the same path; the new `kubelet.sock`
    was then deleted under a running stand-in (seen here in restart storms: a plugin found no
    `kubelet.sock` mid-life and no registration was possible until the next restart). A Go
    kubelet that exits leaves its socket file to the next one, which wipes the folder first."""
    hidden = socket.parent / f".kubelet-{os.getpid()}-{next(_serial)}.sock"
    server = grpc.aio.server()
    dp_grpc.add_RegistrationServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{hidden}")
    await server.start()
    os.rename(hidden, socket)
    return server


def dial(socket: Path) -> grpc.aio.Channel:
    """A connection of its own, as each Go ClientConn has: Python's gRPC would otherwise reuse
    another channel's live connection to the same path, to a server that is going away."""
    return grpc.aio.insecure_channel(
        f"unix://{socket}", options=[("grpc.use_local_subchannel_pool", 1)]
    )


class DeviceManagerRecords:
    """What the v1.37.2 kubelet keeps per plugin socket path: the device manager's endpoint and
    the plugin server's client record (`plugin/v1beta1/handler.go`, `devicemanager/manager.go`).

    A Register adds a client record, dials the plugin, then connects the endpoint, refusing one
    that exists ("device plugin already connected"). Any failure there deregisters every client
    record of that path, the live one's too, while the endpoint stays: when that stream ends
    nothing removes the endpoint, so every later Register from the path is refused until the
    kubelet restarts. A stream that ends with its client record still there removes both."""

    def __init__(self) -> None:
        self.endpoints: set[str] = set()
        self.clients: set[str] = set()

    async def register(
        self, path: str, stub: dp_grpc.DevicePluginStub
    ) -> tuple[dp.DevicePluginOptions | None, str | None]:
        """Dial the plugin at `path` (the kubelet's blocking dial waits up to 10 s for the
        socket), then connect its endpoint: (its options, None) or (None, the refusal)."""
        self.clients.add(path)
        try:
            options = await stub.GetDevicePluginOptions(dp.Empty(), timeout=10, wait_for_ready=True)
        except grpc.aio.AioRpcError as e:
            self.clients.discard(path)
            return None, f"failed to dial device plugin: {e.details()}"
        if path in self.endpoints:
            self.clients.discard(path)
            return None, f"device plugin already connected: {path}"
        self.endpoints.add(path)
        return options, None

    def stream_ended(self, path: str) -> None:
        if path in self.clients:
            self.deregister(path)

    def deregister(self, path: str) -> None:
        self.clients.discard(path)
        self.endpoints.discard(path)


class Kubelet(dp_grpc.RegistrationServicer):
    def __init__(self, root: Path, registry: bool) -> None:
        self.plugins_dir = root / "device-plugins"
        self.registry_dir = root / "plugins_registry"
        self.registry = registry
        self.server: grpc.aio.Server | None = None
        self.streams: set[asyncio.Task[None]] = set()
        self.records = DeviceManagerRecords()
        self.watched: dict[str, int] = {}
        self.running = False  # between a start and the next stop

    async def start(self, wipe_registry: bool = False) -> None:
        self.records = DeviceManagerRecords()  # a new kubelet knows no plugin
        self.watched: dict[str, int] = {}  # the plugin watcher's sockets: path -> inode
        self.plugins_dir.mkdir(parents=True, exist_ok=True)
        for entry in self.plugins_dir.iterdir():  # every file, as a starting kubelet does
            with contextlib.suppress(OSError):
                entry.unlink()
        if wipe_registry:
            for entry in self.registry_dir.iterdir():
                with contextlib.suppress(OSError):
                    if stat.S_ISSOCK(entry.stat().st_mode):
                        entry.unlink()
        self.server = await listen(self, self.plugins_dir / "kubelet.sock")
        self.running = True
        say("up")
        if self.registry:
            for sock in sorted(self.registry_dir.glob("*")):
                self.found(sock)

    async def stop(self) -> None:
        self.running = False  # a kubelet that stops finds (and registers) nothing more
        streams = list(self.streams)
        for task in streams:
            task.cancel()
        for task in streams:  # every connection of the old kubelet closed before the new one
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.server is not None:
            await self.server.stop(None)
            self.server = None

    async def Register(
        self, request: dp.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> dp.Empty:
        # the device manager dials the plugin before it answers
        path = self.plugins_dir / request.endpoint
        refusal = await self.connect(request.resource_name, path)
        if refusal is not None:
            await context.abort(grpc.StatusCode.UNKNOWN, refusal)  # a Go error, as it is
        return dp.Empty()

    async def connect(self, resource: str, path: Path) -> str | None:
        """Dial the plugin, connect its endpoint, follow its ListAndWatch; None, or why not."""
        channel = dial(path)
        _, refusal = await self.records.register(str(path), dp_grpc.DevicePluginStub(channel))
        if refusal is not None:
            await channel.close()
            say("refused", resource=resource, error=refusal)
            return refusal
        say("registered", resource=resource)
        self.spawn(self._list_and_watch(resource, channel, self.records, str(path)))
        return None

    def found(self, sock: Path) -> None:
        """The plugin watcher saw a socket: ask it who it is, connect, notify. Its cache is keyed
        by path: a socket seen twice (at start and by inotify) registers once; a new socket at a
        known path replaces the old registration (DeRegisterPlugin, then RegisterPlugin)."""
        if not self.running or sock.name.startswith(".") or not sock.is_socket():
            return
        identity = sock.stat().st_ino
        if self.watched.get(str(sock)) == identity:
            return
        if str(sock) in self.watched:
            self.records.deregister(str(sock))
        self.watched[str(sock)] = identity
        self.spawn(self._register_found(sock, identity))

    async def _register_found(self, sock: Path, identity: int) -> None:
        channel = dial(sock)
        try:
            watcher = reg_grpc.RegistrationStub(channel)
            try:
                info = await watcher.GetInfo(reg.InfoRequest(), timeout=10)
            except grpc.aio.AioRpcError as e:
                # nothing registered: tried again when seen again (an event, the next start),
                # as the kubelet's reconciler retries too
                say("watcher-error", error=f"{sock.name}: {e.code().name} {e.details()}")
                if self.watched.get(str(sock)) == identity:
                    del self.watched[str(sock)]
                return
            if info.type == "DRAPlugin":  # the DRA manager: validated, dialled when used
                refusal = dra_refusal(info) or None
                say("refused" if refusal else "registered", resource=info.name, error=refusal)
            else:
                refusal = await self.connect(info.name, Path(info.endpoint or sock))
            with contextlib.suppress(grpc.aio.AioRpcError):  # registered (or not) all the same
                await watcher.NotifyRegistrationStatus(
                    reg.RegistrationStatus(plugin_registered=refusal is None, error=refusal or ""),
                    timeout=10,
                )
        finally:
            await channel.close()

    def spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self.streams.add(task)
        task.add_done_callback(self.streams.discard)

    async def _list_and_watch(
        self, resource: str, channel: grpc.aio.Channel, records: DeviceManagerRecords, path: str
    ) -> None:
        try:
            with contextlib.suppress(grpc.aio.AioRpcError):
                async for response in dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty()):
                    healthy = sum(d.health == "Healthy" for d in response.devices)
                    say("list", resource=resource, devices=len(response.devices), healthy=healthy)
        finally:
            records.stream_ended(path)
            await channel.close()


def dra_refusal(info: reg.PluginInfo) -> str:
    """Why kubelet v1.37 would refuse a DRA driver's registration ("" when it would not): no
    endpoint, or none of the gRPC services it knows (`servicesSupportedByKubelet`)."""
    if not info.endpoint:
        return "no endpoint"
    if not {"v1.DRAPlugin", "v1beta1.DRAPlugin"} & set(info.supported_versions):
        return f"none of {list(info.supported_versions)} is supported"
    return ""


async def watch_registry(kubelet: Kubelet, inotify: Inotify) -> None:
    async for event in inotify:
        if event.path is not None:
            kubelet.found(event.path)


async def main(root: Path, registry: bool) -> None:
    kubelet = Kubelet(root, registry)
    inotify = Inotify()
    watcher = None
    if registry:  # watching before the first look: no socket slips between the two
        kubelet.registry_dir.mkdir(parents=True, exist_ok=True)
        inotify.add_watch(kubelet.registry_dir, Mask.CREATE | Mask.MOVED_TO)
        watcher = asyncio.create_task(watch_registry(kubelet, inotify))
    await kubelet.start()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        if line.startswith("restart"):
            await kubelet.stop()
            await kubelet.start(wipe_registry=line.endswith("wipe-registry"))
        elif line == "quit":
            break
    if watcher is not None:
        watcher.cancel()
    inotify.close()
    await kubelet.stop()


@dataclass(frozen=True)
class Seen:
    """A plugin's registration and the first full list after it, as the stand-in saw them."""

    registered_at: float
    listed_at: float
    devices: int
    healthy: int


class KubeletProcess:
    """Runs this file as a child process and follows what it reports."""

    def __init__(self, kubelet_dir: Path, *, plugins_registry: bool = False) -> None:
        self.args = [str(kubelet_dir)] + (["--plugins-registry"] if plugins_registry else [])
        self.proc: asyncio.subprocess.Process | None = None
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.refused: list[dict[str, Any]] = []  # every Register refused, kept apart
        self.accepted = 0  # registrations the stand-in accepted, all told
        self.log: list[dict[str, Any]] = []  # every event, in order
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> KubeletProcess:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, *self.args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self._reader = asyncio.create_task(self._read())
        await self.next("up", within=60)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        with contextlib.suppress(ConnectionError):
            self.proc.stdin.write(b"quit\n")
            await self.proc.stdin.drain()
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            event = json.loads(line)
            self.log.append(event)
            if event["ev"] == "refused":
                self.refused.append(event)
            elif event["ev"] == "registered":
                self.accepted += 1
            await self.events.put(event)

    async def next(self, ev: str, within: float, resource: str | None = None) -> dict[str, Any]:
        """The next event `ev` (of `resource`, when given); earlier others are dropped."""
        async with asyncio.timeout(within):
            while True:
                event = await self.events.get()
                if event["ev"] == ev and resource in (None, event.get("resource")):
                    return event

    async def restart(self, *, wipe_registry: bool = False, within: float = 60) -> float:
        """Restart; returns when the new kubelet.sock listened (CLOCK_MONOTONIC)."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"restart wipe-registry\n" if wipe_registry else b"restart\n")
        await self.proc.stdin.drain()
        return float((await self.next("up", within))["t"])

    async def registered_dra(self, within: float) -> dict[str, Any]:
        """The next registration of a DRA driver (it has no ListAndWatch to wait for)."""
        return await self.next("registered", within)

    async def registered(self, within: float, resource: str | None = None) -> Seen:
        """The next registration (of `resource`) and the first ListAndWatch reply after it."""
        registered = await self.next("registered", within, resource)
        listed = await self.next("list", within, registered["resource"])
        return Seen(registered["t"], listed["t"], listed["devices"], listed["healthy"])


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), "--plugins-registry" in sys.argv[2:]))
