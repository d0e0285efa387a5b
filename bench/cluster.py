"""kube-scheduler alone vs. kube-scheduler with the rdmaplane extender vs. DRA (kube-scheduler
allocating each GPU a NIC on its PCIe root, no extender) vs. DRA unpaired (the same devices, no
pairing), on a real control plane with thousands of KWOK GPU nodes; then the extender killed
mid-stream.

    .venv/bin/python bench/cluster.py [--nodes 1000 5000] [--rounds 3] [--burst 1000]
                                      [--paced 300] [--rate 20] [--failover 300] [--seed 7]
                                      [--within 300] [--stall 60] [--configs a n b d s u v]
                                      [--profile-dir DIR] [--profile-s 20]

Per node count: etcd, kube-apiserver, the NRT CRD and KWOK (the e2e fixtures' code; `make
k8s-bins` first), a fleet of KWOK nodes made from the bundled samples with mixed Topology
Manager policies, each with the NodeResourceTopology its agent would publish and RDMAReady
(tests/e2e/fleet.py), and the extender as deployed: `rdmaplane scheduler-extender` in its own
process, as its ServiceAccount with the RBAC of deploy/scheduler/extender.yaml. Every node also
carries the ResourceSlices of DRA (tests/e2e/drafleet.py): its NIC ports as rdmaplane's DRA
driver publishes them (the driver's own code, without binding conditions: no driver runs beside
a KWOK node to say a port is ready) and its GPUs as NVIDIA's GPU DRA driver does.

Rounds alternate seven configurations on the same stream of GPU counts: 1/2/4/8-GPU pods with
one exclusive HCA per GPU, and CPU-only pods the extender never sees (fleet.SHAPES), in a fresh
namespace, the cluster emptied between rounds:

  (a) kube-scheduler alone;
  (n) kube-scheduler with a do-nothing extender (every node passes, no scores; a bare asyncio
      server in its own process), configured like (b): the cost of calling any extender;
  (b) kube-scheduler with deploy/scheduler/kube-scheduler-config.yaml: the rdmaplane extender
      (managedResources, nodeCacheCapable, ignorable);
  (d) kube-scheduler alone, the pods asking through DRA: a claim from deploy/dra/'s shipped
      ResourceClaimTemplate for their GPU count, by the webhook's default table (the settings'
      CLAIM_TEMPLATES: 1 gpu-nic-pcie-x1 and 2 gpu-nic-pcie-x2, a pcieRoot constraint per pair;
      4 gpu-nic-numa-x4, count 4 per class on one NUMA node; 8 gpu-nic-node-x8, every compute
      NIC and 8 GPUs), made by kube-controller-manager's resourceclaim controller (running in
      these rounds only);
  (s) as (d), kube-scheduler configured by deploy/dra/kube-scheduler-config.yaml, the settings
      docs/dra.md recommends for DRA (percentageOfNodesToScore, filterTimeout), its client
      limits set as every configuration's (--scheduler-qps): what the settings change; (v) is
      (u) configured so;
  (u) the anchor: as (d), the same pods asking as many GPUs and NIC ports through the simplest
      claim upstream's DRA benchmark uses (kubernetes v1.37 test/integration/scheduler_perf/dra,
      SchedulingWithResourceClaimTemplate: one request of one class, no selector, no
      constraint), here one request per class with `count: N` and no constraint
      (tests/e2e/drafleet.unpaired_template; `count: N` rather than N one-device requests,
      which without a constraint would bring back the search over the requests' orders on a
      node one device short). DRA ÷ (u) is what pairing costs beyond what DRA itself costs,
      measured on this machine in the same run.

- burst: the pods are created first (with DRA, and their claims), then the scheduler starts;
  pods/s from its first binding to its last, as a watch sees them (kube-scheduler's own
  throughput, not our pod creation's);
- DRA rounds also print how fast the controller made the burst's claims (from the first pod's
  create; --controller-qps is its API QPS, by default --scheduler-qps) and how many times
  kube-scheduler's log says a node's filter passed filterTimeout ("timed out trying to
  allocate devices"); with
  --profile-dir, kube-scheduler's CPU profile over the first --profile-s seconds of each DRA
  configuration's first burst (`go tool pprof -top FILE` reads it);
- paced: with the scheduler running, pods created at --rate per second; creation→binding is
  from sending the create to the watch seeing spec.nodeName (p50/p99); with DRA it includes
  the controller making the pod's claim.

Every scheduler runs with clientConnection qps/burst raised (--scheduler-qps): kube-scheduler's
default 50 QPS caps bindings at 50 pods/s, which would hide any difference; so does
kube-controller-manager in the DRA rounds (its default 20 QPS, two writes a claim). The burst,
then the paced stream, waits for its pods at most --within seconds, and stops once no pod was
bound for --stall seconds; the pods left are "unbound" (latencies are the bound pods'). Extender
CPU is its process's CPU time over the burst per pod that asks for devices (the pods the
scheduler calls it for); it includes its watches of every pod. Measured the same way, the
do-nothing extender's in (n) is the calls' own cost (HTTP and JSON, no watch, no decision), and
rdmaplane's in (a), where nobody calls it, the cost of its watches alone. RSS is its resident
memory after the round (and its peak). "refused": bound pods the kubelet would refuse, by our
model of its admission (fleet.refused: the extender's policy, itself checked against the kubelet's
own code in tests/kubelet): each node's pods replayed in binding order on its published NRT. The
DRA rounds' claims, as the API server holds their allocations, are judged by one judge
(drafleet.judge_allocation, against each claim's own spec): "wrong" counts a claim's terms
broken (devices of the wrong driver, too few, a per-pair template's pair not on one PCIe root),
devices elsewhere or allocated twice, and, in (d), GPUs with no NIC port of their claim on their
root where the template promises one on that node's shape (its comment); "beside a NIC" is how
many GPUs have a NIC of their claim on their own root, each NIC once (in (u): what chance
paired); "loose" (d) the GPUs without one where the template promises only NUMA or the whole
node there (gpu-nic-node-x8 on the L40S server).
The ratios are of the configurations' medians over rounds: pods/s, paced latencies and
kube-scheduler's CPU per pod in the burst.

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
import math
import multiprocessing
import os
import socket
import ssl
import statistics
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the e2e control-plane code lives under tests/

import httpx2  # noqa: E402
import orjson  # noqa: E402
import yaml  # noqa: E402
from agent_footprint import cpu_seconds, status_kb  # noqa: E402
from lightkube import AsyncClient, codecs  # noqa: E402

from rdmaplane.adapters.kube import load_config  # noqa: E402
from tests.e2e import drafleet, fleet, scalerig  # noqa: E402
from tests.e2e.controlplane import (  # noqa: E402
    KubeCluster,
    Process,
    build_dir,
    control_plane,
    free_port,
    launch_controller_manager,
    launch_extender,
    launch_kwok,
    launch_scheduler,
)
from tests.e2e.dra import DRA_SCHEDULER_CONFIG, ensure_device_classes  # noqa: E402

NRT_CRD = REPO / "deploy" / "crds" / "noderesourcetopology.yaml"
CONFIGS = {
    "a": "kube-scheduler alone",
    "n": "with a do-nothing extender",
    "b": "with the rdmaplane extender",
    "d": "DRA: shipped templates, no extender",
    "s": "DRA: (d), docs' scheduler settings",
    "u": "DRA unpaired: count per class (anchor)",
    "v": "DRA unpaired: (u), docs' settings",
}
# The DRA configurations: whether their claims pair each GPU with a NIC on its PCIe root.
PAIRED = {"d": True, "s": True, "u": False, "v": False}
TUNED = ("s", "v")  # kube-scheduler configured by deploy/dra/kube-scheduler-config.yaml
TIMED_OUT = "timed out trying to allocate devices"  # the DynamicResources plugin's filterTimeout
# The ratios the issue names (and the do-nothing extender's cost), printed together.
RATIOS = (
    ("b", "a", "extender ÷ alone"),
    ("b", "n", "extender ÷ do-nothing"),
    ("d", "a", "DRA ÷ alone"),
    ("n", "a", "do-nothing ÷ alone"),
    ("d", "b", "DRA ÷ extender"),
    ("d", "u", "DRA ÷ unpaired DRA"),
    ("s", "a", "DRA, docs' settings ÷ alone"),
    ("s", "d", "docs' settings ÷ defaults"),
    ("s", "v", "DRA ÷ unpaired, both tuned"),
    ("u", "a", "unpaired DRA ÷ alone"),
)


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
def null_extender() -> Iterator[tuple[str, int]]:
    """The do-nothing extender's URL and process id (its CPU: the calls' own cost)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    proc = multiprocessing.get_context("fork").Process(target=_serve_null, args=(sock,))
    proc.start()
    try:
        assert proc.pid is not None  # started
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", proc.pid
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
    null_pid: int
    args: argparse.Namespace

    def url(self, config: str) -> str | None:
        return {"n": self.null_url, "b": self.extender_url}.get(config)

    def extender_pid(self, config: str) -> int:
        """The process whose CPU a round reports: the do-nothing extender in (n), rdmaplane's
        otherwise (in (a), where nobody calls it, that is the cost of its watches alone)."""
        return self.null_pid if config == "n" else self.extender.popen.pid


@dataclass
class Round:
    config: str
    pods_per_s: float
    burst: int
    latencies: list[float]
    extender_cpu_ms: float  # per pod the extender was asked about (burst); see _CPU_OF
    scheduler_cpu_ms: float  # per pod (burst)
    extender: Usage
    refused: int
    unbound: int
    pairing: drafleet.Pairing | None = None  # DRA rounds: the claims' allocations judged
    controllers_cpu_ms: float = 0.0  # DRA rounds: kube-controller-manager's, per pod (burst)
    claims_per_s: float = 0.0  # DRA rounds: the burst's claims made by the controller
    timeouts: int = 0  # DRA rounds: filterTimeout expiries in kube-scheduler's log


def scheduler_config(env: Env, config: str) -> dict[str, object]:
    """The round's KubeSchedulerConfiguration: in (s) and (v) deploy/dra's as shipped, its
    client limits set as every configuration's are (--scheduler-qps), so that only its other
    settings differ from (d)'s and (u)'s."""
    qps = env.args.scheduler_qps
    if config not in TUNED:
        return scalerig.scheduler_config(env.url(config), qps)
    return tuned_config(qps)


def tuned_config(qps: float) -> dict[str, object]:
    """deploy/dra/kube-scheduler-config.yaml as shipped, its client limits set to `qps`."""
    shipped: dict[str, object] = yaml.safe_load(DRA_SCHEDULER_CONFIG.read_text())
    return {**shipped, "clientConnection": {"qps": qps, "burst": int(2 * qps)}}


def profile(scheduler: Process, context: ssl.SSLContext, seconds: int, path: Path) -> None:
    """kube-scheduler's CPU profile over the next `seconds` (its /debug/pprof, as the cluster's
    admin), written to `path` for `go tool pprof`."""
    url = f"{scheduler.url}/debug/pprof/profile?seconds={seconds}"
    with urllib.request.urlopen(url, context=context, timeout=seconds + 30) as reply:
        path.write_bytes(reply.read())
    print(f"      kube-scheduler CPU profile, {seconds} s: {path}")


def percentile(values: Sequence[float], q: float) -> float:
    """The `q` quantile; NaN when nothing was measured (no paced pod bound)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan


async def one_round(env: Env, config: str, index: int) -> Round:
    args, kube = env.args, env.kube
    dra = config in PAIRED
    namespace = await scalerig.create_namespace(kube, f"r{index}-{config}")
    make = fleet.pod_body
    if dra:
        make = drafleet.pod_body if PAIRED[config] else drafleet.unpaired_pod_body
    gpus = fleet.stream(args.burst, args.seed), fleet.stream(args.paced, args.seed + 1)
    burst = scalerig.bodies(namespace, env.label, "burst", gpus[0], make)
    paced = scalerig.bodies(namespace, env.label, "paced", gpus[1], make)
    sent: dict[str, float] = {}
    pid = env.extender_pid(config)
    claims, claims_per_s, timeouts, profiling = None, 0.0, 0, None
    if dra:
        await drafleet.create_templates(
            kube, namespace, [*gpus[0], *gpus[1]], paired=PAIRED[config]
        )
        qps = int(args.controller_qps or args.scheduler_qps)  # its default 20: ~10 claims/s
        claims = await asyncio.to_thread(
            launch_controller_manager,
            env.cluster,
            ("resourceclaim-controller",),
            (f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}"),
        )
    try:
        async with fleet.Bindings(kube, namespace) as seen:
            await scalerig.create_pods(kube, burst, sent)
            if dra:
                asking = sum(1 for b in burst if drafleet.pairs_of(b))
                await drafleet.wait_for_claims(kube, namespace, asking, scalerig.BIND_WITHIN_S)
                claims_per_s = asking / (time.monotonic() - min(sent.values()))
            scheduler = launch_scheduler(env.cluster, scheduler_config(env, config))
            if dra and args.profile_dir is not None and index == 0:
                path = args.profile_dir / f"scheduler-{len(env.nodes)}-{config}.pprof"
                profiling = asyncio.create_task(
                    asyncio.to_thread(
                        profile, scheduler, env.cluster.tls_context(), args.profile_s, path
                    )
                )
            watched = [pid, scheduler.popen.pid, *([claims.popen.pid] if claims else [])]
            try:
                before = [usage(p) for p in watched]
                unbound = await seen.wait_for(sent, args.within, args.stall)
                after = [usage(p) for p in watched]
                times = sorted(b.at for b in seen.bound.values())
                rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
                await scalerig.create_paced(kube, paced, args.rate, sent)
                unbound = await seen.wait_for(sent, args.within, args.stall)
                if profiling is not None:
                    await profiling
            finally:
                scheduler.stop()
                timeouts = scheduler.log_path.read_text(errors="replace").count(TIMED_OUT)
            names = [b["metadata"]["name"] for b in paced]
            latencies = [seen.bound[n].at - sent[n] for n in names if n in seen.bound]
            pods = {b["metadata"]["name"]: b for b in [*burst, *paced]}
            refused = fleet.refused(env.nodes, pods, seen.bound)
            pairing = (
                await drafleet.judge(kube, namespace, env.nodes, pods, seen.bound) if dra else None
            )
        await scalerig.empty(kube, namespace, [env.extender_url], claims=dra)
    finally:
        if claims is not None:
            claims.stop()
    asked = max(1, sum(map(scalerig.asks_devices, burst)))
    cpu = [1000 * (b.cpu_s - a.cpu_s) for a, b in zip(before, after, strict=True)]
    return Round(
        config,
        rate,
        len(burst),
        latencies,
        cpu[0] / asked,
        cpu[1] / len(burst),
        usage(env.extender.popen.pid),
        len(refused),
        len(unbound),
        pairing,
        cpu[2] / len(burst) if dra else 0.0,
        claims_per_s,
        timeouts,
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
        started = time.monotonic()
        await ensure_device_classes(kube)
        slices = await drafleet.create_slices(kube, nodes)
        published = time.monotonic() - started
        kubeconfig = scalerig.extender_kubeconfig(cluster)
        port = free_port()
        started = time.monotonic()
        extender = await asyncio.to_thread(launch_extender, cluster, kubeconfig, port)
        synced = time.monotonic() - started
        header(nodes, made, synced, usage(extender.popen.pid))
        print(f"   {slices} ResourceSlices (NIC ports and GPUs) published in {published:.0f} s")
        replicas = scalerig.Replicas(cluster, kubeconfig, [port, free_port()], {port: extender})
        try:
            with null_extender() as (null_url, null_pid):
                env = Env(cluster, kube, nodes, label, extender, f"http://127.0.0.1:{port}",
                          null_url, null_pid, args)  # fmt: skip
                rounds = []
                for i in range(args.rounds):
                    for config in args.configs:
                        rounds.append(await one_round(env, config, i))
                        report_round(rounds[-1])
            summary(rounds, args.configs)
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


# Whose CPU each round reports, per pod that asks for devices (see Env.extender_pid).
_CPU_OF = {"a": "its watches alone", "n": "do-nothing extender", "b": "extender"}


def report_round(r: Round) -> None:
    lat = r.latencies
    ext = f"{_CPU_OF[r.config]} CPU {r.extender_cpu_ms:.2f} ms/pod, " if r.config in _CPU_OF else ""
    if r.pairing is not None:
        ext = (
            f"controller-manager CPU {r.controllers_cpu_ms:.2f} ms/pod, claims "
            f"{r.claims_per_s:.0f}/s, filterTimeout expiries {r.timeouts}, {judged(r)}, "
        )
    print(
        f"  ({r.config}) burst {r.burst}: {r.pods_per_s:6.1f} pods/s   paced {len(lat)}: "
        f"creation→binding p50 {1000 * percentile(lat, 0.5):6.1f} ms  p99 "
        f"{1000 * percentile(lat, 0.99):7.1f} ms   scheduler CPU {r.scheduler_cpu_ms:.2f} "
        f"ms/pod   {ext}refused {r.refused}, unbound {r.unbound}"
    )
    if r.pairing is not None:
        p = r.pairing
        for line in [*p.wrong, *p.elsewhere, *p.unallocated, *p.doubled][:5]:
            print(f"      wrong: {line}")
        for line in p.loose_where[:2]:
            print(f"      loose: {line}")


def judged(*rounds: Round) -> str:
    """The DRA rounds' claims judged, together: wrong, GPUs beside a NIC of their claim on
    their root, and in (d) the GPUs without one where the template does not promise it."""
    j = [r.pairing for r in rounds if r.pairing is not None]
    problems, pairs = sum(x.problems for x in j), sum(x.pairs for x in j)
    aligned = sum(x.aligned for x in j)
    said = f"wrong {problems}, GPUs beside a NIC {aligned} of {pairs}"
    if all(PAIRED.get(r.config, True) for r in rounds):
        said += f" (loose {sum(x.loose for x in j)})"
    return said


def summary(rounds: list[Round], configs: Sequence[str]) -> None:
    """Medians of the rounds' throughput and kube-scheduler CPU per pod, percentiles of every
    round's latencies together; then the ratios, all from this run's rounds."""
    rate, p50, p99, sched = {}, {}, {}, {}
    for c in configs:
        mine = [r for r in rounds if r.config == c]
        lats = [x for r in mine for x in r.latencies]
        rate[c] = statistics.median(r.pods_per_s for r in mine)
        sched[c] = statistics.median(r.scheduler_cpu_ms for r in mine)
        p50[c], p99[c] = percentile(lats, 0.5), percentile(lats, 0.99)
        pairs = ""
        if c in PAIRED:
            pairs = (
                f", {judged(*mine)}, filterTimeout expiries {sum(r.timeouts for r in mine)}, "
                f"claims {statistics.median(r.claims_per_s for r in mine):.0f}/s"
            )
        print(
            f"  {c} {CONFIGS[c]:<40} pods/s {rate[c]:6.1f}   creation→binding p50 "
            f"{1000 * p50[c]:6.1f} ms  p99 {1000 * p99[c]:7.1f} ms   scheduler CPU "
            f"{sched[c]:.2f} ms/pod   refused {sum(r.refused for r in mine)}, unbound "
            f"{sum(r.unbound for r in mine)}{pairs}"
        )
    print(f"  ratios ({len(rounds) // max(1, len(configs))} alternating rounds of each, one run):")
    for top, bottom, name in RATIOS:
        if top in rate and bottom in rate:
            print(
                f"    {name:<28} ({top})/({bottom}): pods/s {ratio(rate[top], rate[bottom])}   "
                f"p50 {ratio(p50[top], p50[bottom])}   p99 {ratio(p99[top], p99[bottom])}   "
                f"scheduler CPU/pod {ratio(sched[top], sched[bottom])}"
            )
    cpu = {
        c: statistics.median(r.extender_cpu_ms for r in rounds if r.config == c)
        for c in _CPU_OF
        if c in configs
    }
    if "b" in cpu:
        ext = [r for r in rounds if r.config == "b"]
        also = "".join(f"; {_CPU_OF[c]} {cpu[c]:.2f} ms" for c in "an" if c in cpu)
        print(
            f"  extender: CPU {cpu['b']:.2f} ms per device pod{also}; RSS "
            f"{max(r.extender.rss_mb for r in ext):.0f} MB (peak "
            f"{max(r.extender.peak_mb for r in ext):.0f} MB)"
        )


def ratio(top: float, bottom: float) -> str:
    return f"{top / bottom:.2f}x" if bottom else "n/a"


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--rounds", type=int, default=3, help="of each configuration")
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--paced", type=int, default=300)
    parser.add_argument("--rate", type=float, default=20.0, help="paced pods per second")
    parser.add_argument("--failover", type=int, default=300, help="pods; 0: no failover run")
    parser.add_argument("--scheduler-qps", type=float, default=1000.0)
    parser.add_argument(
        "--controller-qps", type=float, default=None,
        help="kube-controller-manager's API QPS in the DRA rounds (default: --scheduler-qps; "
        "its own default is 20)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--within", type=float, default=scalerig.BIND_WITHIN_S,
        help="seconds the burst, then the paced stream, waits for its pods at most",
    )  # fmt: skip
    parser.add_argument(
        "--stall", type=float, default=60.0,
        help="seconds without a binding after which a round stops waiting (the rest: unbound)",
    )  # fmt: skip
    parser.add_argument(
        "--profile-dir", type=Path, default=None,
        help="write kube-scheduler's CPU profile of each DRA configuration's first burst here",
    )  # fmt: skip
    parser.add_argument(
        "--profile-s", type=int, default=20, help="seconds each profile covers (from the start)"
    )
    parser.add_argument(
        "--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS),
        help="which schedulers alternate (see above)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
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
