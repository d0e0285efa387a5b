"""The fleet's load on the API server: thousands of node agents' publishers against a real
kube-apiserver, at start, in steady state and when a job starts on a thousand nodes at once.

    .venv/bin/python bench/apiserver_load.py [--nodes 1000 5000] [--steady 120]
                                             [--change-every 300] [--burst 1000] [--seed 7]

Per node count: etcd and kube-apiserver (the e2e fixtures' code; `make k8s-bins` first, default
flags: --max-requests-inflight 400, --max-mutating-requests-inflight 200, API Priority and
Fairness with its default FlowSchemas), the NRT CRD and the agent's RBAC (deploy/agent/rbac.yaml),
and one Node per agent. The agents are the real publisher
(`rdmaplane.services.agent.publisher.Publisher`),
many in one process, each with its own node, as the agent's ServiceAccount (so APF puts them
where it puts the DaemonSet: FlowSchema `service-accounts`, priority level `workload-low`, one
flow for the whole fleet); a client per 50 agents, each with a connection per agent. What each
publishes is what the agent builds for a bundled sample node (`Agent.desired()` after discovery
on the sample's sysfs tree): labels and the topology annotation, RDMAReady, the NRT; the fleet
mixes samples and Topology Manager policies as bench/cluster.py does.

- start: every agent starts at once (a fresh DaemonSet): each reads back its Node and NRT, then
  writes labels, the condition and the NRT. Time until every one is in sync.
- steady: for --steady seconds each node's allocations change now and then (a pod starting or
  ending, exponentially distributed, --change-every seconds apart on average per node):
  writes/s per node, all requests per second, by verb.
- burst: a job's pods start on --burst nodes at rest (no NRT change for `nrtMinInterval`) at
  the same moment: time until every NRT is written (p50, max), with the publisher as
  configured and, side by side, with `writeJitter: 0`.

Per phase, from the API server's /metrics: requests by verb, the agents' requests APF
dispatched, rejected (429) and their mean queue wait; bytes per NRT update is the size of the
PUT body (the whole object: NRT updates are replaces).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the e2e control-plane code lives under tests/

import httpx  # noqa: E402
import orjson  # noqa: E402
from lightkube import AsyncClient, codecs  # noqa: E402

from rdmaplane import nrt  # noqa: E402
from rdmaplane.adapters.discovery import samples  # noqa: E402
from rdmaplane.adapters.kube import load_config  # noqa: E402
from rdmaplane.core.allocation import Allocations, merge_containers  # noqa: E402
from rdmaplane.core.settings.agent import AgentSettings, FabricSettings, PublishSettings  # noqa: E402
from rdmaplane.core.settings.deviceplugin import PluginSettings  # noqa: E402
from rdmaplane.services.agent.deviceplugin import EmbeddedPlugin  # noqa: E402
from rdmaplane.services.agent.metrics import AgentMetrics, NodeView  # noqa: E402
from rdmaplane.services.agent.policy.inventory import gpu_ids  # noqa: E402
from rdmaplane.services.agent.publisher import Desired, Publisher  # noqa: E402
from rdmaplane.services.agent.root import Agent  # noqa: E402
from tests.e2e import fleet  # noqa: E402
from tests.e2e.controlplane import (  # noqa: E402
    KubeCluster,
    build_dir,
    control_plane,
    create_kwok_node,
)

NRT_CRD = REPO / "deploy" / "crds" / "noderesourcetopology.yaml"
AGENT_RBAC = REPO / "deploy" / "agent" / "rbac.yaml"
AGENT_USER = "system:serviceaccount:rdmaplane:rdmaplane-agent"
AGENT_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:rdmaplane")
AGENTS_PER_CLIENT = 50
SETTLE_WITHIN_S = 600.0


# ---------------------------------------------------------------- what the agents publish


@dataclass(frozen=True)
class States:
    """What the agent publishes for one kind of node: idle, and with a job's pod holding every
    GPU and HCA (its NRT as a template named "template")."""

    idle: Desired
    busy: Desired


async def agent_states(sample: str, policy: str, scope: str) -> States:
    """`Agent.desired()` after the agent's own discovery of the sample's sysfs tree, without a
    pod and with one."""
    plugin_config = PluginSettings()  # CDI off, as by default
    with samples.materialised(sample) as tree, tempfile.TemporaryDirectory() as work:
        config = AgentSettings(
            node_name="template",
            sysfs_root=Path(tree),
            kubelet_dir=Path(work),
            dev_root=Path("/dev"),
            topology_manager_policy=policy,  # type: ignore[arg-type]
            topology_manager_scope=scope,  # type: ignore[arg-type]
            fabric=FabricSettings(lldp="off"),
        )
        plugin = EmbeddedPlugin(plugin_config, kubelet_dir=Path(work), dev_root=Path("/dev"))
        agent = Agent(config, plugin=plugin, pools=plugin_config.pools)
        await agent.discover("start")
        idle = agent.desired()
        assert agent.topo is not None
        devices = [(nrt.GPU, list(gpu_ids(agent.topo).values()))]
        devices += [(o.resource, [o.device_id]) for o in plugin.offered()]
        agent.node.allocations = Allocations((merge_containers("jobs", "train", [devices]),))
        return States(idle, agent.desired())


def for_node(state: Desired, node: str, pod: str) -> Desired:
    """The template's state for `node`, its job pod named `pod`."""
    obj = orjson.loads(orjson.dumps(state.nrt))
    obj["metadata"]["name"] = node
    for attribute in obj.get("attributes") or []:
        if attribute["name"] == nrt.ATTR_ACCOUNTED_PODS and attribute["value"]:
            attribute["value"] = f"jobs/{pod}"
    return replace(state, nrt=obj)


# ---------------------------------------------------------------- the API server's figures


Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(cluster: KubeCluster) -> Sample:
    text = httpx.get(f"{cluster.server}/metrics", verify=cluster.tls_context(), timeout=60).text
    out: Sample = {}
    for line in text.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        name, rest = line.split("{", 1)
        labels, value = rest.rsplit("} ", 1)
        pairs = tuple(
            (k, v.strip('"')) for k, v in (p.split("=", 1) for p in labels.split('",') if "=" in p)
        )
        out[(name, pairs)] = float(value)
    return out


def total(sample: Sample, name: str, **match: str) -> float:
    return sum(
        v
        for (n, labels), v in sample.items()
        if n == name and all((k, w) in labels for k, w in match.items())
    )


@dataclass
class Load:
    seconds: float
    by_verb: Counter[str]  # requests on nodes, NRTs and events, by verb
    dispatched: float  # the agents' requests APF let through
    rejected: float  # ... and turned away (429)
    wait_ms: float  # their mean wait in APF's queues

    def line(self, nodes: int) -> str:
        writes = sum(n for v, n in self.by_verb.items() if v != "GET")
        every = ", ".join(f"{v} {n / self.seconds:.1f}/s" for v, n in sorted(self.by_verb.items()))
        return (
            f"{sum(self.by_verb.values()) / self.seconds:.1f} requests/s ({every}); writes/s per "
            f"node {writes / self.seconds / nodes:.4f}; APF: {self.dispatched:.0f} dispatched, "
            f"{self.rejected:.0f} rejected (429), mean queue wait {self.wait_ms:.1f} ms"
        )


def load_between(before: Sample, after: Sample, seconds: float) -> Load:
    by_verb: Counter[str] = Counter()
    for resource in ("nodes", "noderesourcetopologies", "events"):
        for verb in ("GET", "PATCH", "POST", "PUT"):
            n = total(after, "apiserver_request_total", resource=resource, verb=verb) - total(
                before, "apiserver_request_total", resource=resource, verb=verb
            )
            if n:
                by_verb[verb] += int(n)
    agents = {"flow_schema": "service-accounts"}

    def delta(name: str, **extra: str) -> float:
        return total(after, name, **agents, **extra) - total(before, name, **agents, **extra)

    waits = delta("apiserver_flowcontrol_request_wait_duration_seconds_count", execute="true")
    wait_s = delta("apiserver_flowcontrol_request_wait_duration_seconds_sum", execute="true")
    return Load(
        seconds,
        by_verb,
        delta("apiserver_flowcontrol_dispatched_requests_total"),
        delta("apiserver_flowcontrol_rejected_requests_total"),
        1000 * wait_s / waits if waits else 0.0,
    )


# ---------------------------------------------------------------- the fleet of publishers


@dataclass
class Fleet:
    publishers: list[Publisher]
    idle: list[Desired]
    busy: list[Desired]
    clients: list[AsyncClient]
    tasks: list[asyncio.Task[None]]


def _no_node() -> NodeView:
    return NodeView("", None, {}, None)


@contextlib.asynccontextmanager
async def publishers(
    kubeconfig: Path, nodes: Sequence[fleet.FleetNode], config: PublishSettings
) -> Any:
    templates: dict[tuple[str, str, str], States] = {}
    for n in nodes:
        key = (n.sample, n.policy, n.scope)
        if key not in templates:
            templates[key] = await agent_states(*key)
    metrics = AgentMetrics(_no_node)  # one for all: their write counters add up
    kube_config = load_config(kubeconfig)
    clients, pubs, idle, busy = [], [], [], []
    for i, n in enumerate(nodes):
        if i % AGENTS_PER_CLIENT == 0:
            clients.append(AsyncClient(kube_config, field_manager="rdmaplane", trust_env=False))
        states = templates[(n.sample, n.policy, n.scope)]
        idle.append(for_node(states.idle, n.name, f"train-{i}"))
        busy.append(for_node(states.busy, n.name, f"train-{i}"))
        pubs.append(Publisher(clients[-1], n.name, config, metrics))
    running = Fleet(pubs, idle, busy, clients, [])
    try:
        yield running
    finally:
        for task in running.tasks:
            task.cancel()
        await asyncio.gather(*running.tasks, return_exceptions=True)
        for client in clients:
            await client.close()


async def all_in_sync(pubs: Sequence[Publisher]) -> list[float]:
    """Seconds until each publisher is in sync (the server holds what it wants)."""
    start = time.monotonic()

    async def one(p: Publisher) -> float:
        await asyncio.wait_for(p.in_sync.wait(), SETTLE_WITHIN_S)
        return time.monotonic() - start

    return list(await asyncio.gather(*(one(p) for p in pubs)))


def spread(times: Sequence[float]) -> str:
    return f"p50 {statistics.median(times):.1f} s, max {max(times):.1f} s"


async def start_phase(cluster: KubeCluster, f: Fleet) -> None:
    before = scrape(cluster)
    began = time.monotonic()
    for p, state in zip(f.publishers, f.idle, strict=True):
        p.set_desired(state)
        f.tasks.append(asyncio.create_task(p.run()))
    times = await all_in_sync(f.publishers)
    load = load_between(before, scrape(cluster), time.monotonic() - began)
    print(f"  start, every agent at once: in sync {spread(times)}")
    print(f"    {load.line(len(f.publishers))}")


async def steady_phase(
    cluster: KubeCluster, f: Fleet, seconds: float, every: float, seed: int
) -> None:
    """Allocation changes as independent exponential arrivals per node, for `seconds`."""
    rng = random.Random(seed)
    n = len(f.publishers)
    busy = [False] * n
    events = [(rng.expovariate(1 / every), i) for i in range(n)]
    heapq.heapify(events)
    before = scrape(cluster)
    began = time.monotonic()
    changes = 0
    while events and events[0][0] < seconds:
        at, i = heapq.heappop(events)
        await asyncio.sleep(max(0.0, began + at - time.monotonic()))
        busy[i] = not busy[i]
        f.publishers[i].set_desired(f.busy[i] if busy[i] else f.idle[i])
        changes += 1
        heapq.heappush(events, (at + rng.expovariate(1 / every), i))
    await asyncio.sleep(max(0.0, began + seconds - time.monotonic()))
    load = load_between(before, scrape(cluster), time.monotonic() - began)
    print(
        f"  steady, {seconds:.0f} s, allocations changing every {every:.0f} s per node on "
        f"average ({changes / seconds / n:.4f} changes/s per node):"
    )
    print(f"    {load.line(n)}")
    for i in range(n):  # back to idle for the burst
        if busy[i]:
            f.publishers[i].set_desired(f.idle[i])
    await all_in_sync(f.publishers)


async def burst_phase(cluster: KubeCluster, f: Fleet, count: int, label: str) -> None:
    chosen = f.publishers[:count]
    before = scrape(cluster)
    began = time.monotonic()
    for p, state in zip(chosen, f.busy, strict=False):
        p.set_desired(state)
    times = await all_in_sync(chosen)
    load = load_between(before, scrape(cluster), time.monotonic() - began)
    print(f"  burst, a job starts on {count} nodes at once ({label}): NRTs written {spread(times)}")
    print(f"    {load.line(len(f.publishers))}")
    for p, state in zip(chosen, f.idle, strict=False):
        p.set_desired(state)
    await all_in_sync(chosen)


# ---------------------------------------------------------------- the run


def nrt_sizes(nodes: Sequence[fleet.FleetNode]) -> str:
    sizes = sorted({len(orjson.dumps(n.nrt)) for n in nodes})
    return f"{min(sizes) / 1024:.1f}-{max(sizes) / 1024:.1f} KiB"


async def at_scale(cluster: KubeCluster, count: int, args: argparse.Namespace) -> None:
    nodes = fleet.plan(count, args.seed, f"agent{count}")
    async with cluster.async_client() as kube:
        await fleet.bounded(
            fleet.CREATE_PARALLEL,
            (lambda n=n: create_kwok_node(kube, n.name, {}, n.capacity) for n in nodes),
        )
    kubeconfig = cluster.kubeconfig_for(AGENT_USER, AGENT_GROUPS)
    configs = [
        ("as configured", PublishSettings()),
        ("writeJitter 0", PublishSettings(write_jitter_s=0)),
    ]
    print(f"== {count} agents; NRT bodies {nrt_sizes(nodes)} (PUT: the whole object)")
    async with publishers(kubeconfig, nodes, configs[0][1]) as f:
        await start_phase(cluster, f)
        await steady_phase(cluster, f, args.steady, args.change_every, args.seed)
        for label, config in configs:
            for p in f.publishers:
                p.config = config
            # at rest: a job starts on nodes whose NRT has not changed for nrtMinInterval
            await asyncio.sleep(config.nrt_min_interval_s)
            await burst_phase(cluster, f, min(args.burst, count), label)


@contextlib.contextmanager
def cluster_for_agents(bin_dir: Path) -> Iterator[KubeCluster]:
    with control_plane(bin_dir) as cluster:
        with cluster.client() as client:
            for path in (NRT_CRD, AGENT_RBAC):
                for obj in codecs.load_all_yaml(path.read_text()):
                    client.apply(obj, force=True)
        yield cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--steady", type=float, default=120.0, help="seconds")
    parser.add_argument("--change-every", type=float, default=300.0, help="seconds, per node")
    parser.add_argument("--burst", type=int, default=1000, help="nodes")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    bin_dir = build_dir("--bin-dir")
    if not (bin_dir / "kube-apiserver").is_file():
        sys.exit("bench/apiserver_load.py: kube-apiserver missing: run `make k8s-bins` first")
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load} (1/5/15 min) at start")
    for count in args.nodes:
        with cluster_for_agents(bin_dir) as cluster:
            asyncio.run(at_scale(cluster, count, args))


if __name__ == "__main__":
    main()
