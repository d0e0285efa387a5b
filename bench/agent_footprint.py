"""The node agent's footprint on the largest sample: RSS, idle CPU over 60 s, publish latency.

Usage: python bench/agent_footprint.py [--idle-s 60] [--cycles 20] [--unreachable]

Runs `rdmaplane agent` as its own process on the HGX sample tree (on tmpfs, as /sys is) with the
device plugin embedded and a 5 s poll, and samples /proc/<pid> after a warm-up: RSS (VmRSS, and
the peak VmHWM) and CPU time (utime + stime) over the idle window. The API server is a real
kube-apiserver started from the e2e fixtures' code when its binaries are built
(`make k8s-bins`), else (or with `--unreachable`) a closed port, so the publisher sits in its
backoff. A kubelet stand-in in this process (built from the kubelet .proto stubs) accepts the
device plugin's registration, holds its ListAndWatch stream open as the kubelet does, and
answers PodResources (every GPU and HCA allocatable, no pods).

Then, in this process against the same API server, times publish cycles that write: the first
full publish (labels + annotation patch, status patch, NRT create) and NRT updates after an
allocation change. Goals (issue 6): RSS <= 80 MB, idle CPU <= 0.2 % of a core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the e2e control-plane code lives under tests/

from rdmaplane.adapters.discovery import read_node, samples  # noqa: E402
from rdmaplane.core.allocation import Allocations, PodDevices  # noqa: E402
from rdmaplane.core.settings.agent import AgentSettings, PublishSettings  # noqa: E402
from rdmaplane.services.agent.root import Agent  # noqa: E402

SAMPLE = "hgx-h100-roce"
EXTRA = os.environ.get("AGENT_EXTRA", "").split()
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def thread_ticks(pid: int) -> dict[tuple[str, str], int]:
    """CPU ticks per thread (id, name): the Python thread versus gRPC's event-engine threads."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            stat = (task / "stat").read_text()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            out[(task.name, name)] = int(fields[11]) + int(fields[12])
    return out


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


@contextlib.contextmanager
def api_server(unreachable: bool, workdir: Path) -> Iterator[tuple[str, Path, object | None]]:
    """(description, admin kubeconfig, cluster or None)."""
    bin_dir = Path(
        subprocess.run(
            [str(REPO / "scripts/build-k8s.sh"), "--bin-dir"], capture_output=True, text=True
        ).stdout.strip()
        or "/nonexistent"
    )
    if not unreachable and (bin_dir / "kube-apiserver").is_file():
        from lightkube import codecs
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Node

        from tests.e2e.controlplane import control_plane

        with control_plane(bin_dir) as cluster:
            with cluster.client() as client:
                for path in ("deploy/crds/noderesourcetopology.yaml", "deploy/agent/rbac.yaml"):
                    for obj in codecs.load_all_yaml((REPO / path).read_text()):
                        client.apply(obj, force=True)
                client.create(Node(metadata=ObjectMeta(name="hgx-h100-017")))
            time.sleep(2)  # the CRD becomes Established
            kubeconfig = cluster.kubeconfig_for("system:serviceaccount:rdmaplane:rdmaplane-agent")
            yield "a real kube-apiserver (e2e fixtures code)", kubeconfig, cluster
        return
    kubeconfig = workdir / "unreachable.kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: none}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    yield "an unreachable API server (closed port)", kubeconfig, None


class KubeletStandIn:
    """Registration + PodResources on the kubelet's sockets, served from a thread of its own."""

    def __init__(self, kubelet_dir: Path, topo: object) -> None:
        self.dir = kubelet_dir
        self.topo = topo
        self.streams = 0
        self.watches: list[asyncio.Future[None]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> KubeletStandIn:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.run_forever()

    async def _serve(self) -> None:
        import grpc

        from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
        from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
        from rdmaplane.adapters.kubelet.api.podresources.v1 import api_pb2 as pr
        from rdmaplane.adapters.kubelet.api.podresources.v1 import api_pb2_grpc as pr_grpc

        standin = self
        gpus = [g.uuid for g in self.topo.gpus]
        hcas = [h.pci.address for h in self.topo.hcas if h.pci]

        class Registration(dp_grpc.RegistrationServicer):
            async def Register(self, request, context):
                standin.watches.append(
                    asyncio.ensure_future(standin._watch(request.endpoint, dp, dp_grpc, grpc))
                )
                return dp.Empty()

        class Lister(pr_grpc.PodResourcesListerServicer):
            async def List(self, request, context):
                return pr.ListPodResourcesResponse()

            async def GetAllocatableResources(self, request, context):
                return pr.AllocatableResourcesResponse(
                    devices=[
                        pr.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=gpus),
                        pr.ContainerDevices(resource_name="rdmaplane.io/hca", device_ids=hcas),
                    ]
                )

        for sub in ("device-plugins", "pod-resources"):
            (self.dir / sub).mkdir(exist_ok=True)
        server = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(Registration(), server)
        server.add_insecure_port(f"unix://{self.dir}/device-plugins/kubelet.sock")
        pods = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(Lister(), pods)
        pods.add_insecure_port(f"unix://{self.dir}/pod-resources/kubelet.sock")
        await server.start()
        await pods.start()
        self._servers = (server, pods)
        self._ready.set()

    async def _watch(self, endpoint: str, dp: Any, dp_grpc: Any, grpc: Any) -> None:
        channel = grpc.aio.insecure_channel(f"unix://{self.dir}/device-plugins/{endpoint}")
        stub = dp_grpc.DevicePluginStub(channel)
        async for _ in stub.ListAndWatch(dp.Empty()):
            self.streams += 1


def tree_base() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def measure_idle(
    root: Path, kubelet: Path, kubeconfig: Path, config: Path, warmup_s: float, idle_s: float
) -> tuple[int, int, float, float, dict[str, float]]:
    """RSS, peak RSS (kB), CPU % of a core, CPU seconds, and CPU seconds per thread name."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log = open(root.parent / "agent.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rdmaplane", "agent", "--node-name", "hgx-h100-017",
         "--sysfs-root", str(root), "--kubelet-dir", str(kubelet),
         "--kubeconfig", str(kubeconfig), "--config", str(config), "--metrics-port", "0",
         *EXTRA],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        time.sleep(warmup_s)
        if proc.poll() is not None:
            raise SystemExit(f"agent exited: {(root.parent / 'agent.log').read_text()[-2000:]}")
        threads0, cpu0, t0 = thread_ticks(proc.pid), cpu_seconds(proc.pid), time.monotonic()
        time.sleep(idle_s)
        threads1, cpu1, t1 = thread_ticks(proc.pid), cpu_seconds(proc.pid), time.monotonic()
        rss, hwm = status_kb(proc.pid, "VmRSS"), status_kb(proc.pid, "VmHWM")
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
    by_name: dict[str, float] = {}
    for (tid, name), ticks in threads1.items():
        by_name[name] = by_name.get(name, 0.0) + (ticks - threads0.get((tid, name), 0)) / TICK
    return rss, hwm, (cpu1 - cpu0) / (t1 - t0) * 100, cpu1 - cpu0, by_name


async def publish_latency(
    root: Path, kubelet: Path, cluster, cycles: int
) -> tuple[float, list[float]]:
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Node

    from rdmaplane.adapters.kube import async_client

    with cluster.client() as client:  # a node of its own: the idle agent published the other
        client.create(Node(metadata=ObjectMeta(name="hgx-latency")))
    config = AgentSettings(
        node_name="hgx-latency",
        sysfs_root=root,
        kubelet_dir=kubelet,
        device_plugin_enabled=False,
        metrics_port=0,
        # what one update costs is measured here, not how often they may go
        publish=PublishSettings(nrt_min_interval_s=0),
    )
    kubeconfig = cluster.kubeconfig_for("system:serviceaccount:rdmaplane:rdmaplane-agent")
    agent = Agent(config, kube=async_client(kubeconfig))
    await agent.discover("start")
    assert agent.publisher is not None
    agent.publisher.set_desired(agent.desired())
    started = time.perf_counter()
    assert await agent.publisher.publish_once()
    first = (time.perf_counter() - started) * 1000
    updates = []
    gpus = agent.topo.gpus
    for i in range(cycles):
        held = {"nvidia.com/gpu": frozenset({gpus[i % len(gpus)].uuid})}
        agent.node.allocations = Allocations(pods=(PodDevices("bench", f"p{i}", held),))
        agent.publisher.set_desired(agent.desired())
        started = time.perf_counter()
        assert await agent.publisher.publish_once()
        updates.append((time.perf_counter() - started) * 1000)
    return first, updates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--warmup-s", type=float, default=10.0)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--unreachable", action="store_true", help="never start an API server")
    parser.add_argument("--poll-s", type=float, default=5.0)
    parser.add_argument("--allocation-s", type=float, default=30.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rdmaplane-bench-", dir=tree_base()))
    try:
        root, kubelet = workdir / "sys", workdir / "kubelet"
        samples.build(samples.load(SAMPLE).spec, root)
        kubelet.mkdir()
        (kubelet / "config.yaml").write_text(
            "kind: KubeletConfiguration\ntopologyManagerPolicy: single-numa-node\n"
        )
        config = workdir / "agent.yaml"
        config.write_text(
            "apiVersion: rdmaplane.io/v1alpha1\nkind: AgentConfig\n"
            f"pollInterval: {args.poll_s}\nallocationInterval: {args.allocation_s}\n"
        )
        with (
            api_server(args.unreachable, workdir) as (what, kubeconfig, cluster),
            KubeletStandIn(kubelet, read_node(str(root))) as standin,
        ):
            rss, hwm, cpu_pct, cpu_s, threads = measure_idle(
                root, kubelet, kubeconfig, config, args.warmup_s, args.idle_s
            )
            print(
                f"agent on sample {SAMPLE}, poll {args.poll_s:g} s, PodResources every "
                f"{args.allocation_s:g} s, device plugin embedded, against {what}"
            )
            print(f"kubelet stand-in: {standin.streams} ListAndWatch updates received")
            print(f"RSS            {rss / 1024:6.1f} MB (peak {hwm / 1024:.1f} MB; goal <= 80 MB)")
            print(
                f"idle CPU       {cpu_pct:6.3f} % of a core "
                f"({cpu_s:.2f} s CPU in {args.idle_s:.0f} s; goal <= 0.2 %)"
            )
            spent = ", ".join(f"{n} {s:.2f} s" for n, s in sorted(threads.items()) if s)
            print(f"  by thread    {spent or 'nothing measurable'}")
            if cluster is None:
                print("publish cycle  n/a (no API server; run without --unreachable)")
                return
            first, updates = asyncio.run(publish_latency(root, kubelet, cluster, args.cycles))
            updates.sort()
            print(
                f"publish cycle  first full publish {first:.1f} ms "
                "(read back node and NRT, node patch, status patch, NRT create)"
            )
            median = statistics.median(updates)
            print(
                f"publish cycle  NRT update after an allocation change: median {median:.1f} ms, "
                f"max {updates[-1]:.1f} ms ({len(updates)} cycles)"
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
