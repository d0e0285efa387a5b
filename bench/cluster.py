"""kube-scheduler alone vs. kube-scheduler with the rdmaplane extender, on a real control plane
with thousands of KWOK GPU nodes; then the extender killed mid-stream.

    .venv/bin/python bench/cluster.py [--nodes 1000 5000] [--rounds 3] [--burst 1000]
                                      [--paced 300] [--rate 20] [--failover 300] [--seed 7]

Per node count: etcd, kube-apiserver, the NRT CRD and KWOK (the e2e fixtures' code; `make
k8s-bins` first), a fleet of KWOK nodes made from the bundled samples with mixed Topology
Manager policies, each with the NodeResourceTopology its agent would publish and RDMAReady
(tests/e2e/fleet.py), and the extender as deployed: `rdmaplane scheduler-extender` in its own
process, as its ServiceAccount with the RBAC of deploy/scheduler/extender.yaml.

Rounds alternate three kube-schedulers on the same pod stream: 1/2/4/8-GPU pods with one
exclusive HCA per GPU, and CPU-only pods the extender never sees (fleet.SHAPES), in a fresh
namespace, the cluster emptied between rounds:

  (a) kube-scheduler alone;
  (n) kube-scheduler with a do-nothing extender (every node passes, no scores; a bare asyncio
      server in its own process), configured like (b): the cost of calling any extender;
  (b) kube-scheduler with deploy/scheduler/kube-scheduler-config.yaml: the rdmaplane extender
      (managedResources, nodeCacheCapable, ignorable).

- burst: the pods are created first, then the scheduler starts; pods/s from its first binding
  to its last, as a watch sees them (kube-scheduler's own throughput, not our pod creation's);
- paced: with the scheduler running, pods created at --rate per second; creation→binding is
  from sending the create to the watch seeing spec.nodeName (p50/p99).

Every scheduler runs with clientConnection qps/burst raised (--scheduler-qps): kube-scheduler's
default 50 QPS caps bindings at 50 pods/s, which would hide any difference. Extender CPU is its
process's CPU time over the burst per pod that asks for devices (the pods the scheduler calls
it for); it includes its watches of every pod. RSS is its resident memory after the round (and
its peak). "refused": bound pods the kubelet would refuse, by our model of its admission
(fleet.refused: placement.py, itself checked against the kubelet's own code in tests/kubelet):
each node's pods replayed in binding order on its published NRT.

Failover, with (b): two extender replicas behind one address (a TCP relay standing in for the
Service), pods streamed at --rate through five phases: both up, one killed (SIGKILL), it back,
both killed, both back (tests/e2e/scalerig.py). Per phase: pods bound, and how many filter
calls a replica answered; restart to /readyz (a full listing); whether the replicas answer
filter and prioritize identically for every pod shape over every node after each rejoin.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the e2e control-plane code lives under tests/

import httpx2  # noqa: E402
import orjson  # noqa: E402
from agent_footprint import cpu_seconds, status_kb  # noqa: E402
from lightkube import AsyncClient, codecs  # noqa: E402

from rdmaplane.kube import load_config  # noqa: E402
from tests.e2e import fleet, scalerig  # noqa: E402
from tests.e2e.controlplane import (  # noqa: E402
    KubeCluster,
    Process,
    build_dir,
    control_plane,
    free_port,
    launch_extender,
    launch_kwok,
    launch_scheduler,
)

NRT_CRD = REPO / "deploy" / "crds" / "noderesourcetopology.yaml"
CONFIGS = {
    "a": "kube-scheduler alone",
    "n": "with a do-nothing extender",
    "b": "with the rdmaplane extender",
}


# ---------------------------------------------------------------- the do-nothing extender


async def _null_reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Every node passes /filter, /prioritize scores none: HTTP/1.1 keep-alive, one send."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            size = next(
                (int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length")),
                0,
            )
            body = await reader.readexactly(size)
            if lines[0].split()[1].endswith(b"/filter"):
                names = orjson.loads(body)["NodeNames"]
                out = orjson.dumps({"NodeNames": names, "FailedNodes": {}, "Error": ""})
            else:
                out = b"[]"
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(out), out)
            )
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def _serve_null(sock: socket.socket) -> None:
    async def run() -> None:
        server = await asyncio.start_server(_null_reply, sock=sock)
        await server.serve_forever()

    asyncio.run(run())


@contextlib.contextmanager
def null_extender() -> Iterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    proc = multiprocessing.get_context("fork").Process(target=_serve_null, args=(sock,))
    proc.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        proc.kill()
        proc.join()
        sock.close()


# ---------------------------------------------------------------- one round


@dataclass(frozen=True)
class Usage:
    cpu_s: float
    rss_mb: float
    peak_mb: float


def usage(pid: int) -> Usage:
    rss, peak = status_kb(pid, "VmRSS"), status_kb(pid, "VmHWM")
    return Usage(cpu_seconds(pid), rss / 1024, peak / 1024)


@dataclass
class Env:
    cluster: KubeCluster
    kube: AsyncClient
    nodes: list[fleet.FleetNode]
    label: str
    extender: Process
    extender_url: str
    null_url: str
    args: argparse.Namespace

    def url(self, config: str) -> str | None:
        return {"a": None, "n": self.null_url, "b": self.extender_url}[config]


@dataclass
class Round:
    config: str
    pods_per_s: float
    burst: int
    latencies: list[float]
    extender_cpu_ms: float  # per pod the extender was asked about (burst)
    scheduler_cpu_ms: float  # per pod (burst)
    extender: Usage
    refused: int
    unbound: int


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_round(env: Env, config: str, index: int) -> Round:
    args, kube = env.args, env.kube
    namespace = await scalerig.create_namespace(kube, f"r{index}-{config}")
    burst = scalerig.bodies(namespace, env.label, "burst", fleet.stream(args.burst, args.seed))
    paced = scalerig.bodies(namespace, env.label, "paced", fleet.stream(args.paced, args.seed + 1))
    sent: dict[str, float] = {}
    pid = env.extender.popen.pid
    async with fleet.Bindings(kube, namespace) as seen:
        await scalerig.create_pods(kube, burst, sent)
        scheduler = launch_scheduler(
            env.cluster, scalerig.scheduler_config(env.url(config), args.scheduler_qps)
        )
        try:
            before = usage(pid), usage(scheduler.popen.pid)
            unbound = await seen.wait_for(sent, scalerig.BIND_WITHIN_S)
            after = usage(pid), usage(scheduler.popen.pid)
            times = sorted(b.at for b in seen.bound.values())
            rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
            await scalerig.create_paced(kube, paced, args.rate, sent)
            unbound |= await seen.wait_for(sent, scalerig.BIND_WITHIN_S)
        finally:
            scheduler.stop()
        names = [b["metadata"]["name"] for b in paced]
        latencies = [seen.bound[n].at - sent[n] for n in names if n in seen.bound]
        pods = {b["metadata"]["name"]: b for b in [*burst, *paced]}
        refused = fleet.refused(env.nodes, pods, seen.bound)
    asked = max(1, sum(map(scalerig.asks_devices, burst)))
    await scalerig.empty(kube, namespace, [env.extender_url])
    return Round(
        config,
        rate,
        len(burst),
        latencies,
        1000 * (after[0].cpu_s - before[0].cpu_s) / asked,
        1000 * (after[1].cpu_s - before[1].cpu_s) / len(burst),
        usage(pid),
        len(refused),
        len(unbound),
    )


# ---------------------------------------------------------------- the run


@contextlib.contextmanager
def cluster_with_kwok(
    bin_dir: Path, kwok_bin: Path, apiserver_flags: Sequence[str] = ()
) -> Iterator[KubeCluster]:
    """etcd, kube-apiserver (with `apiserver_flags`), the NRT CRD, the extender's RBAC, and
    KWOK."""
    with control_plane(bin_dir, lambda _: apiserver_flags) as cluster:
        with cluster.client() as client:
            for crd in codecs.load_all_yaml(NRT_CRD.read_text()):
                client.apply(crd, force=True)
            scalerig.install_extender_rbac(client)
        kwok = launch_kwok(cluster, kwok_bin)
        try:
            yield cluster
        finally:
            kwok.stop()


async def at_scale(cluster: KubeCluster, count: int, args: argparse.Namespace) -> None:
    label = f"fleet{count}"
    nodes = fleet.plan(count, args.seed, label)
    config = load_config(cluster.kubeconfig)
    # a long timeout: deleting thousands of pods at once takes the loaded API server a while
    async with AsyncClient(config, timeout=httpx2.Timeout(120.0), trust_env=False) as kube:
        started = time.monotonic()
        await fleet.create(kube, nodes)
        made = time.monotonic() - started
        kubeconfig = scalerig.extender_kubeconfig(cluster)
        port = free_port()
        started = time.monotonic()
        extender = await asyncio.to_thread(launch_extender, cluster, kubeconfig, port)
        synced = time.monotonic() - started
        header(nodes, made, synced, usage(extender.popen.pid))
        replicas = scalerig.Replicas(cluster, kubeconfig, [port, free_port()], {port: extender})
        try:
            with null_extender() as null_url:
                env = Env(cluster, kube, nodes, label, extender, f"http://127.0.0.1:{port}",
                          null_url, args)  # fmt: skip
                rounds = []
                for i in range(args.rounds):
                    for config in CONFIGS:
                        rounds.append(await one_round(env, config, i))
                        report_round(rounds[-1])
            summary(rounds)
            if args.failover:
                result = await scalerig.failover(
                    kube,
                    replicas,
                    nodes,
                    lambda c: launch_scheduler(cluster, c),
                    args.failover,
                    args.rate,
                    args.seed + 2,
                )
                report_failover(result)
        finally:
            replicas.stop()


def header(nodes: list[fleet.FleetNode], made: float, synced: float, idle: Usage) -> None:
    samples = Counter(n.sample for n in nodes)
    policies = Counter(f"{n.policy}/{n.scope}" for n in nodes)
    gpus = sum(int(n.capacity.get(fleet.nrt.GPU, "0")) for n in nodes)
    print(f"== {len(nodes)} KWOK nodes, {gpus} GPUs: {dict(sorted(samples.items()))}")
    print(f"   policies {dict(sorted(policies.items()))}")
    print(
        f"   made in {made:.0f} s (nodes, NRTs, KWOK Ready); the extender listed everything "
        f"{synced:.1f} s after its start, then RSS {idle.rss_mb:.0f} MB"
    )


def report_round(r: Round) -> None:
    lat = r.latencies
    ext = f"extender CPU {r.extender_cpu_ms:.2f} ms/pod, " if r.config == "b" else ""
    print(
        f"  ({r.config}) burst {r.burst}: {r.pods_per_s:6.1f} pods/s   paced {len(lat)}: "
        f"creation→binding p50 {1000 * statistics.median(lat):6.1f} ms  p99 "
        f"{1000 * percentile(lat, 0.99):7.1f} ms   scheduler CPU {r.scheduler_cpu_ms:.2f} "
        f"ms/pod   {ext}refused {r.refused}, unbound {r.unbound}"
    )


def summary(rounds: list[Round]) -> None:
    """Medians of the rounds' throughput, percentiles of every round's latencies together."""
    rate, p50, p99 = {}, {}, {}
    for c, label in CONFIGS.items():
        mine = [r for r in rounds if r.config == c]
        lats = [x for r in mine for x in r.latencies]
        rate[c] = statistics.median(r.pods_per_s for r in mine)
        p50[c], p99[c] = statistics.median(lats), percentile(lats, 0.99)
        print(
            f"  {c} {label:<28} pods/s {rate[c]:6.1f}   creation→binding p50 "
            f"{1000 * p50[c]:6.1f} ms  p99 {1000 * p99[c]:7.1f} ms   refused "
            f"{sum(r.refused for r in mine)}, unbound {sum(r.unbound for r in mine)}"
        )
    ext = [r for r in rounds if r.config == "b"]
    for c in ("n", "b"):
        print(
            f"  ({c})/(a): pods/s {rate[c] / rate['a']:.2f}x   p50 {p50[c] / p50['a']:.2f}x   "
            f"p99 {p99[c] / p99['a']:.2f}x"
        )
    print(
        f"  extender: CPU {statistics.median(r.extender_cpu_ms for r in ext):.2f} ms per "
        f"device pod, RSS {max(r.extender.rss_mb for r in ext):.0f} MB (peak "
        f"{max(r.extender.peak_mb for r in ext):.0f} MB)"
    )


def report_failover(f: scalerig.Failover) -> None:
    print("  failover, two replicas behind one address:")
    for phase in f.phases:
        print(
            f"    {phase.name:<12} {phase.bound}/{phase.pods} pods bound; {phase.asked} asked "
            f"for devices, a replica answered {phase.answered} filter calls"
        )
    restarts = ", ".join(f"{s:.1f}" for s in f.restart_to_ready_s)
    print(f"    restart to ready: {restarts} s; unbound {f.unbound}")
    print(f"    refused among pods bound while a replica ran: {len(f.refused)}")
    for line in f.answers:
        print(f"    replicas compared after a rejoin: {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--rounds", type=int, default=3, help="of each configuration")
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--paced", type=int, default=300)
    parser.add_argument("--rate", type=float, default=20.0, help="paced pods per second")
    parser.add_argument("--failover", type=int, default=300, help="pods; 0: no failover run")
    parser.add_argument("--scheduler-qps", type=float, default=1000.0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    bin_dir, kwok_bin = build_dir("--bin-dir"), build_dir("--kwok-bin-dir") / "kwok"
    missing = [str(p) for p in (bin_dir / "kube-apiserver", kwok_bin) if not p.is_file()]
    if missing:
        sys.exit(f"bench/cluster.py: {', '.join(missing)} missing: run `make k8s-bins` first")
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load} (1/5/15 min) at start")
    for count in args.nodes:
        with cluster_with_kwok(bin_dir, kwok_bin) as cluster:
            asyncio.run(at_scale(cluster, count, args))


if __name__ == "__main__":
    main()
