"""Device plugin figures, ours beside the Go k8s-rdma-shared-dev-plugin, in one run.

Both plugins serve the same node (the hgx-h100-roce sample: 9 HCAs, 2 NUMA nodes) from the
same config (a shared-RDMA-plugin `configList`: one shared pool of every Mellanox HCA, 100
slots; only the resource names differ) to one kubelet stand-in in a process of its own
(tests/integration/kubelet_process.py), and are started the same way: in a private mount and
network namespace where the sample's tree is bind-mounted over /sys, its device nodes over
/dev/infiniband, the kubelet folder over /var/lib/kubelet, and each netdev of the sample
exists as a bridge; through a seccomp wrapper that makes RDMA netlink sockets fail with EINVAL
(bench/netlink_rdma_einval.c), as on a kernel without RDMA. Measured side by side:

* start (the exec of the plugin, after the namespace setup) to the first ListAndWatch reply at
  the kubelet, median of --starts, and the CPU time the process used until then (less noisy
  than the wall time on a loaded machine);
* RSS of each plugin's process tree, idle CPU over --idle seconds (both at once);
* Allocate p50/p99 at a Go gRPC client (bench/deviceplugin_client.go: the kubelet's language
  and library), both plugins in the same rounds;
* kubelet restarts (--restarts): the stand-in deletes the sockets and serves a new kubelet.sock
  within milliseconds; time until each plugin registered again and the kubelet had its list.

Then ours alone: every call at the Python gRPC client against the gRPC floor, the resource
manager in-process, and where its memory and start time go: step by step, what the serving
process loads (and keeps) and what the command loads to check its input before it execs the
serving process (see rdmaplane.services.deviceplugin.root).

The Go plugin is the release on the Go module proxy (--peer-version), built with the local Go
toolchain into ${XDG_CACHE_HOME:-~/.cache}/rdmaplane/bench-deviceplugin/ (once; ~1 min cold),
with the wrapper (cc) and the client. Needs root (namespaces, mounts), `unshare`, `ip`.

    .venv/bin/python bench/deviceplugin.py [--calls 2000] [--restarts 30] [--idle 60]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the kubelet stand-in in tests/integration

import grpc  # noqa: E402

from rdmaplane.adapters.discovery import read_node, samples  # noqa: E402
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp  # noqa: E402
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc  # noqa: E402
from rdmaplane.core.model import NodeTopology  # noqa: E402
from rdmaplane.core.settings.deviceplugin import PluginSettings  # noqa: E402
from rdmaplane.services.deviceplugin.grpc import socket_name  # noqa: E402
from rdmaplane.services.deviceplugin.manager import ResourceManager  # noqa: E402
from tests.integration.kubelet_process import KubeletProcess  # noqa: E402
from tests.integration.kubelet_standin import device_nodes  # noqa: E402

SAMPLE = "hgx-h100-roce"
PEER_MODULE = "github.com/Mellanox/k8s-rdma-shared-dev-plugin"
POLL_S = 5  # both: periodicUpdateInterval
WITHIN = 60.0

# The namespace both plugins run in: NODE KUBELET_DIR WRAPPER COMMAND...
LAUNCH = r"""set -e
node=$1 kubelet=$2 wrapper=$3; shift 3
mount --make-rprivate /
mount --bind "$node/sys" /sys
mkdir -p "$node/host-dev"
mount --bind /dev "$node/host-dev"
mount -t tmpfs tmpfs /dev
for d in null zero random urandom; do
  touch "/dev/$d" && mount --bind "$node/host-dev/$d" "/dev/$d"
done
mkdir /dev/infiniband
mount --bind "$node/dev/infiniband" /dev/infiniband
mount -t tmpfs tmpfs /var/lib
mkdir /var/lib/kubelet
mount --bind "$kubelet" /var/lib/kubelet
ip link set lo up
for n in $(ls /sys/class/net); do
  [ "$n" = lo ] || { ip link add "$n" type bridge && ip link set "$n" up; }
done
exec "$wrapper" "$@"
"""


# ------------------------------------------------------------------ building and laying out


def cache_dir(version: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "rdmaplane" / "bench-deviceplugin" / version


def run(*cmd: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed:\n{done.stderr[-3000:]}")
    return done.stdout


@dataclass(frozen=True)
class Tools:
    peer: Path  # the Go k8s-rdma-shared-dev-plugin
    client: Path  # the Go Allocate client
    wrapper: Path  # RDMA netlink -> EINVAL


def build_tools(version: str) -> Tools:
    """The peer from the Go module proxy, built once per version; the client inside its module
    (it already requires k8s.io/kubelet and grpc); the wrapper with cc."""
    out = cache_dir(version)
    tools = Tools(out / "k8s-rdma-shared-dp", out / "deviceplugin-client", out / "netlink-rdma")
    sources = [HERE / "deviceplugin_client.go", HERE / "netlink_rdma_einval.c"]
    built = [p.stat().st_mtime for p in (tools.peer, tools.client, tools.wrapper) if p.exists()]
    if len(built) == 3 and min(built) > max(p.stat().st_mtime for p in sources):
        return tools
    print(f"building {PEER_MODULE}@{version} into {out} (once)", file=sys.stderr)
    started = time.perf_counter()
    module = json.loads(run("go", "mod", "download", "-json", f"{PEER_MODULE}@{version}"))
    src = out / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(module["Dir"], src)
    for path in src.rglob("*"):
        path.chmod(path.stat().st_mode | 0o200)  # the module cache is read-only
    client_dir = src / "cmd" / "rdmaplane-bench-client"
    client_dir.mkdir()
    shutil.copy(HERE / "deviceplugin_client.go", client_dir / "main.go")
    run("go", "build", "-o", tools.peer, "./cmd/k8s-rdma-shared-dp", cwd=src)
    run("go", "build", "-o", tools.client, "./cmd/rdmaplane-bench-client", cwd=src)
    run("cc", "-O2", "-o", tools.wrapper, HERE / "netlink_rdma_einval.c")
    print(f"built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return tools


# The Go plugin names devices from pci.ids (its PCI library needs the file); only what the
# sample holds is listed, in pci.ids' layout.
PCI_IDS = """15b3  Mellanox Technologies
\t101d  MT2892 Family [ConnectX-6 Dx]
\t1021  MT2910 Family [ConnectX-7]
C 02  Network controller
\t00  Ethernet controller
\t07  Infiniband controller
"""


def lay_out_node(root: Path) -> Path:
    """The sample's sysfs and /dev, plus what the Go plugin's PCI library reads beyond what
    ours does: a `modalias` per PCI function, and a pci.ids."""
    samples.build(samples.load(SAMPLE).spec, root / "sys")
    device_nodes(root / "sys", root / "dev")
    for fn in (root / "sys" / "bus" / "pci" / "devices").iterdir():
        vendor, device = ((fn / n).read_text().strip()[2:].upper() for n in ("vendor", "device"))
        cls = (fn / "class").read_text().strip()[2:].upper()
        (fn / "modalias").write_text(
            f"pci:v0000{vendor}d0000{device}sv0000{vendor}sd00000000"
            f"bc{cls[0:2]}sc{cls[2:4]}i{cls[4:6]}\n"
        )
    (root / "pci.ids").write_text(PCI_IDS)
    (root / "launch.sh").write_text(LAUNCH)
    return root


def shared_config(path: Path, name: str) -> Path:
    """The config both read: the shared RDMA device plugin's format (ours reads it too)."""
    pool = {"resourceName": name, "rdmaHcaMax": 100, "selectors": {"vendors": ["15b3"]}}
    path.write_text(json.dumps({"periodicUpdateInterval": POLL_S, "configList": [pool]}))
    return path


# ------------------------------------------------------------------ running a plugin


@dataclass
class Plugin:
    label: str
    resource: str
    socket: str  # its socket's name in device-plugins/
    argv: list[str]
    proc: asyncio.subprocess.Process | None = None
    figures: dict[str, str] = field(default_factory=dict)

    async def start(self, node: Path, kubelet_dir: Path, wrapper: Path) -> None:
        """Start in the namespace (`node/exec-stamp` gets the time of the plugin's exec)."""
        self.proc = await launch(node, kubelet_dir, wrapper, self.argv)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self.proc = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


async def launch(
    node: Path, kubelet_dir: Path, wrapper: Path, argv: list[str]
) -> asyncio.subprocess.Process:
    """unshare -m -n without --fork execs the shell, which execs the wrapper, which execs the
    plugin: the process started here is the plugin."""
    env = {
        **os.environ,
        "PCIDB_PATH": str(node / "pci.ids"),
        "EXEC_STAMP": str(node / "exec-stamp"),
    }
    return await asyncio.create_subprocess_exec(
        "unshare", "-m", "-n", "sh", str(node / "launch.sh"), str(node), str(kubelet_dir),
        str(wrapper), *argv,
        env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


# ------------------------------------------------------------------ measuring


def percentiles(samples_ms: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(samples_ms, n=100, method="inclusive")
    return q[49], q[98]


def process_tree() -> dict[int, tuple[int, float, float]]:
    """pid -> (ppid, CPU seconds, RSS MB) of every process, from /proc."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/status") as f:
                rss = next((int(x.split()[1]) for x in f if x.startswith("VmRSS:")), 0)
        except OSError:
            continue
        out[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, rss / 1024)
    return out


def tree_of(pid: int, procs: dict[int, tuple[int, float, float]]) -> set[int]:
    tree, grown = {pid}, True
    while grown:
        below = {p for p, (parent, _, _) in procs.items() if parent in tree} - tree
        tree |= below
        grown = bool(below)
    return tree & set(procs)


def usage(pid: int) -> tuple[int, float, float]:
    """(processes, CPU seconds, RSS MB) of a process and its descendants."""
    procs = process_tree()
    tree = tree_of(pid, procs)
    return len(tree), sum(procs[p][1] for p in tree), sum(procs[p][2] for p in tree)


async def starts(
    plugins: list[Plugin], kubelet: KubeletProcess, node: Path, kdir: Path, tools: Tools, n: int
) -> None:
    times: dict[str, list[float]] = {p.label: [] for p in plugins}
    cpu: dict[str, list[float]] = {p.label: [] for p in plugins}
    for _ in range(n):
        for plugin in plugins:  # alternating: both see the same noise
            await plugin.start(node, kdir, tools.wrapper)
            seen = await kubelet.registered(WITHIN, plugin.resource)
            cpu[plugin.label].append(usage(plugin.pid)[1])  # the launch shell's few ms too
            execed = float((node / "exec-stamp").read_text())
            times[plugin.label].append(seen.listed_at - execed)
            await plugin.stop()
    for plugin in plugins:
        plugin.figures[f"exec → first ListAndWatch ({n}×, median)"] = (
            f"{statistics.median(times[plugin.label]) * 1000:.0f} ms"
        )
        plugin.figures["  CPU time until then, median"] = (
            f"{statistics.median(cpu[plugin.label]) * 1000:.0f} ms"
        )


async def footprint(plugins: list[Plugin], idle_s: float) -> None:
    before = {p.label: usage(p.pid) for p in plugins}
    t = time.perf_counter()
    await asyncio.sleep(idle_s)
    wall = time.perf_counter() - t
    for plugin in plugins:
        procs, cpu, rss = usage(plugin.pid)
        used = cpu - before[plugin.label][1]
        plugin.figures["processes"] = str(procs)
        plugin.figures["RSS"] = f"{rss:.1f} MB"
        plugin.figures[f"idle CPU ({wall:.0f} s)"] = f"{100 * used / wall:.3f} %"


def go_allocate(plugins: list[Plugin], kdir: Path, client: Path, calls: int) -> None:
    sockets = [str(kdir / "device-plugins" / p.socket) for p in plugins]
    got = json.loads(run(client, "-n", str(calls), *sockets))
    for plugin, sock in zip(plugins, sockets, strict=True):
        figures = got[sock]
        plugin.figures["Allocate at a Go client, p50"] = f"{figures['p50_ms']:.3f} ms"
        plugin.figures["Allocate at a Go client, p99"] = f"{figures['p99_ms']:.3f} ms"
        plugin.figures["  no-op call (floor), p50"] = f"{figures['floor_p50_ms']:.3f} ms"


async def restarts(plugins: list[Plugin], kubelet: KubeletProcess, n: int) -> None:
    """After each instant restart: time until each plugin registered again, and until the
    kubelet had its full list (none with `--restarts 0`)."""
    if n == 0:
        return
    registered: dict[str, list[float]] = {p.resource: [] for p in plugins}
    listed: dict[str, list[float]] = {p.resource: [] for p in plugins}
    phase = random.Random(13)
    for _ in range(n):
        # at a random moment of the plugins' poll cycles: polling plugins are measured fairly
        await asyncio.sleep(phase.uniform(0, POLL_S))
        up = await kubelet.restart()
        pending = {p.resource for p in plugins}
        again: dict[str, float] = {}
        async with asyncio.timeout(WITHIN):
            while pending:
                event = await kubelet.events.get()
                resource = event.get("resource")
                if event["ev"] == "registered" and resource in pending:
                    again[resource] = event["t"]
                elif event["ev"] == "list" and resource in again and resource in pending:
                    registered[resource].append((again[resource] - up) * 1000)
                    listed[resource].append((event["t"] - up) * 1000)
                    pending.discard(resource)
    for plugin in plugins:
        reg, lst = registered[plugin.resource], listed[plugin.resource]
        plugin.figures[f"restart → registered ({n}×): p50 / max"] = (
            f"{statistics.median(reg):.0f} / {max(reg):.0f} ms"
        )
        plugin.figures["restart → full list: p50 / max"] = (
            f"{statistics.median(lst):.0f} / {max(lst):.0f} ms"
        )


def table(plugins: list[Plugin]) -> None:
    rows = list(dict.fromkeys(k for p in plugins for k in p.figures if p.figures[k]))
    width = max(map(len, rows)) + 2
    print(f"  {'':{width}s}" + "".join(f"{p.label:>24s}" for p in plugins))
    for row in rows:
        print(f"  {row:{width}s}" + "".join(f"{p.figures.get(row, '-'):>24s}" for p in plugins))


# ------------------------------------------------------------------ ours alone


Call = Callable[[], Awaitable[object]]


async def timed(calls: dict[str, Call], n: int) -> dict[str, list[float]]:
    """Each call once per round, `n` rounds: every call sees the same noise of this machine."""
    for _ in range(50):  # warm the channel and both processes
        for call in calls.values():
            await call()
    out: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(n):
        for name, call in calls.items():
            t = time.perf_counter()
            await call()
            out[name].append((time.perf_counter() - t) * 1000)
    return out


async def python_client(sock: Path, calls: int) -> None:
    """Every call of ours at a Python gRPC client, against the no-op call."""
    async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
        stub = dp_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        stream = stub.ListAndWatch(dp.Empty())
        ids = sorted(d.ID for d in (await stream.read()).devices)
        stream.cancel()

        def preferred(size: int) -> Call:
            request = dp.PreferredAllocationRequest(
                container_requests=[
                    dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=ids,
                        must_include_deviceIDs=ids[-1:],
                        allocation_size=size,
                    )
                ]
            )
            return lambda: stub.GetPreferredAllocation(request, timeout=5)

        def allocate(count: int) -> Call:
            request = dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=ids[:count])]
            )
            return lambda: stub.Allocate(request, timeout=5)

        floor = "GetDevicePluginOptions (floor)"
        results = await timed(
            {
                floor: lambda: stub.GetDevicePluginOptions(dp.Empty()),
                "GetPreferredAllocation 2 slots": preferred(2),
                "Allocate 1 slot": allocate(1),
                "Allocate 4 slots": allocate(4),
            },
            calls,
        )
    floor_p50, floor_p99 = percentiles(results[floor])
    print(f"  {'':32s} {'p50':>9s} {'p99':>9s}   above the floor: p50    p99")
    for name, samples_ms in results.items():
        p50, p99 = percentiles(samples_ms)
        above = "" if name == floor else f"{p50 - floor_p50:+8.3f} {p99 - floor_p99:+8.3f}"
        print(f"  {name:32s} {p50:6.3f} ms {p99:6.3f} ms   {above}")


ECHO = """
import os, socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
while data := s.recv(64):
    s.send(data)
"""


def transport_floor(calls: int) -> None:
    """A 40-byte ping-pong over a unix socket pair with an echo process: no gRPC, no Python
    work to speak of; what this machine's scheduler alone costs a request/response."""
    mine, theirs = socket.socketpair()
    echo = subprocess.Popen(
        [sys.executable, "-c", ECHO, str(theirs.fileno())], pass_fds=[theirs.fileno()]
    )
    theirs.close()
    out = []
    for i in range(calls + 50):
        t = time.perf_counter()
        mine.send(b"x" * 40)
        mine.recv(64)
        if i >= 50:
            out.append((time.perf_counter() - t) * 1000)
    mine.close()
    echo.wait(10)
    p50, p99 = percentiles(out)
    print(f"  {'unix socket ping-pong, no gRPC':32s} {p50:6.3f} ms {p99:6.3f} ms   (this machine)")


def handler_times(topo: NodeTopology, dev_root: str, calls: int) -> None:
    """The plugin's own share: the resource manager in-process, without gRPC. An allocation is
    worked out once per set of HCAs after each update, then reused: both are timed."""
    manager = ResourceManager(PluginSettings().pools[0], dev_root=dev_root)
    manager.update(topo)
    ids = [d.id for d in manager.devices]

    def first_allocation() -> object:
        manager.update(topo)  # forgets what allocations granted (cheap next to the rest)
        return manager.allocate(ids[:4])

    print("  in-process resource manager (the plugin's own work, exclusive pool of 9)")
    for name, call in [
        ("preferred 4 of 9", lambda: manager.preferred(ids, ids[-1:], 4)),
        ("allocate 4, after an update", first_allocation),
        ("allocate 4, again", lambda: manager.allocate(ids[:4])),
    ]:
        out = []
        for _ in range(calls):
            t = time.perf_counter()
            call()
            out.append((time.perf_counter() - t) * 1000)
        p50, p99 = percentiles(out)
        print(f"    {name:30s} p50 {p50:6.3f} ms   p99 {p99:6.3f} ms")


def rss_by_mapping(pid: int, top: int = 8) -> None:
    """Where a process's resident memory is: by mapped file, anonymous memory, heap."""
    agg: collections.Counter[str] = collections.Counter()
    current = "[anon]"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if parts[0] == "Rss:":
                agg[current] += int(parts[1])
            elif "-" in parts[0] and not parts[0].endswith(":"):
                current = os.path.basename(parts[5]) if len(parts) > 5 else "[anon]"
    print("  our plugin's RSS by mapping:")
    for name, kb in agg.most_common(top):
        print(f"    {kb / 1024:6.1f} MB  {name}")


# Where the start time and the memory go, step by step in fresh interpreters, in the order each
# process loads them (`-X importtime` tells the same per module). The serving process keeps
# what it loads; the command that checks the input loads the rest, then execs it away.
STEPS = """
import json, sys, time
def rss():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024
out, t, r = [], time.perf_counter(), rss()
for label, stmt in json.loads(sys.argv[1]):
    exec(stmt)
    now = time.perf_counter()
    out.append((label, (now - t) * 1000, rss() - r))
    t, r = now, rss()
print(json.dumps(out))
"""
SERVING = [
    ("asyncio (ssl refused, see below)", "sys.modules['ssl'] = None; import asyncio"),
    ("grpcio", "import grpc, grpc.aio"),
    (
        "protobuf + kubelet stubs",
        "import rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1.api_pb2_grpc,"
        " rdmaplane.adapters.kubelet.api.pluginregistration.v1.api_pb2_grpc",
    ),
    ("inotify (asyncinotify, ctypes)", "import asyncinotify"),
    ("model, gid, nccl, selectors (settings)", "import rdmaplane.core.settings.deviceplugin"),
    ("logs, discovery, plugin, server", "import rdmaplane.services.deviceplugin.root,"
        " rdmaplane.services.deviceplugin.plugin"),
]  # fmt: skip
SSL = [("ssl (what asyncio would load)", "import ssl")]
CHECKING = [
    ("typer + the command (rdmaplane.cli)", "import rdmaplane.cli"),
    ("the config layer (DevicePluginConfig)", "import rdmaplane.adapters.config.deviceplugin as c"),
    (
        "pydantic + reading + checking the file",
        "import rdmaplane.adapters.config as k; k.load(CONFIG_FILE, c.DEVICE_PLUGIN_CONFIG)",
    ),
]


def steps(plan: list[tuple[str, str]], runs: int, config: Path) -> list[tuple[str, float, float]]:
    """Each step's (label, least time of `runs`, median RSS growth)."""
    stmts = json.dumps(
        [(label, stmt.replace("CONFIG_FILE", repr(str(config)))) for label, stmt in plan]
    )
    got = [json.loads(run(sys.executable, "-c", STEPS, stmts)) for _ in range(runs)]
    return [
        (label, min(g[i][1] for g in got), statistics.median(g[i][2] for g in got))
        for i, (label, _) in enumerate(plan)
    ]


def interpreter(runs: int) -> tuple[float, float]:
    """A bare interpreter's start (least wall time of `runs`) and RSS."""
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        rss = run(sys.executable, "-c", STEPS.split("out,")[0] + "print(rss())")
        times.append((time.perf_counter() - t) * 1000)
    return min(times), float(rss)


def import_costs(config: Path, runs: int = 5) -> None:
    start_ms, base_mb = interpreter(runs)
    print(f"  where the start and the memory go (fresh interpreters, least time of {runs}):")
    print("    the serving process (what stays resident):")
    print(f"      {'interpreter (start and RSS)':40s} {base_mb:6.1f} MB  {start_ms:6.1f} ms")
    for label, ms, mb in steps(SERVING, runs, config) + steps(SSL, runs, config):
        print(f"      {label:40s} {mb:+6.1f} MB  {ms:6.1f} ms")
    print("    the command, before it execs the serving process (gone after the exec):")
    print(f"      {'interpreter':40s} {'':9s}  {start_ms:6.1f} ms")
    for label, ms, mb in steps(CHECKING, runs, config):
        print(f"      {label:40s} {mb:+6.1f} MB  {ms:6.1f} ms")


# ------------------------------------------------------------------ main


async def bench(args: argparse.Namespace) -> None:
    tools = build_tools(args.peer_version)
    with tempfile.TemporaryDirectory(prefix="dpb-") as tmp:
        node = lay_out_node(Path(tmp) / "node")
        kdir = Path(tmp) / "kubelet"
        ours_resource, go_resource = "rdma/hca_shared_devices_b", "rdma/hca_shared_devices_a"
        ours = Plugin(
            "rdmaplane (Python)",
            ours_resource,
            socket_name(ours_resource),
            [sys.executable, "-m", "rdmaplane", "device-plugin",
             "--config", str(shared_config(Path(tmp) / "ours.json", "hca_shared_devices_b"))],
        )  # fmt: skip
        go = Plugin(
            f"Go peer {args.peer_version}",
            go_resource,
            "hca_shared_devices_a.sock",
            [str(tools.peer), "--config-file",
             str(shared_config(Path(tmp) / "go.json", "hca_shared_devices_a"))],
        )  # fmt: skip
        plugins = [ours, go]
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"sample {SAMPLE}; one shared pool of 9 HCAs, 100 slots; {os.cpu_count()} CPUs")
        print(f"load average at the start: {load}")
        async with KubeletProcess(kdir) as kubelet:
            await starts(plugins, kubelet, node, kdir, tools, args.starts)
            try:
                for plugin in plugins:
                    await plugin.start(node, kdir, tools.wrapper)
                    await kubelet.registered(WITHIN, plugin.resource)
                await asyncio.sleep(POLL_S * 2)  # past the first polls
                await footprint(plugins, args.idle)
                go_allocate(plugins, kdir, tools.client, args.calls)
                await restarts(plugins, kubelet, args.restarts)
                table(plugins)
                print("\nours alone, at a Python gRPC client (the same unix socket):")
                await python_client(kdir / "device-plugins" / ours.socket, args.calls)
                transport_floor(args.calls)
                rss_by_mapping(ours.pid)
            finally:
                for plugin in plugins:
                    await plugin.stop()
        handler_times(read_node(str(node / "sys")), str(node / "dev"), args.calls)
        import_costs(Path(tmp) / "ours.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--restarts", type=int, default=30)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle CPU sampling")
    parser.add_argument("--starts", type=int, default=5, help="cold starts of each plugin")
    parser.add_argument("--peer-version", default="v1.5.3")
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
