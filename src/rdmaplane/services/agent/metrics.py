"""Prometheus metrics: per-port link and traffic figures read at scrape time, agent self-metrics
and the fault actor's.

Port counters are read from sysfs when Prometheus scrapes (only the counter files, a few hundred
small reads on an 8-NIC node), so an agent that nobody scrapes spends nothing on them. Which
counters are exported, under what name and scale, is `rdmaplane.core.counters`' table (the PMA data
counters count 4-octet words: they are multiplied by 4). Counters the kernel does not expose on
a port (`hw_counters` on InfiniBand, say) are left out rather than reported as 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from rdmaplane import __version__
from rdmaplane.adapters.discovery.probe import counter_files, leading_number, read_small
from rdmaplane.core.counters import PORT_COUNTERS
from rdmaplane.core.model import NodeTopology, link_up, parse_rate_gbps
from rdmaplane.services.agent.policy.health import HcaHealth

PORT_LABELS = ("hca", "port", "netdev", "numa")

EXPORTED = {c.name: c for c in PORT_COUNTERS if c.metric is not None}


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the collector needs from the agent at scrape time."""

    root: str
    topo: NodeTopology | None
    health: Mapping[str, HcaHealth]
    ready: bool | None  # RDMAReady as last computed; None before the first discovery


class NodeCollector(Collector):
    """Per-port metrics and per-HCA health, read fresh on every scrape."""

    def __init__(self, view: Callable[[], NodeView]) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        state = GaugeMetricFamily(
            "rdmaplane_port_state",
            "Logical port state (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE)",
            labels=PORT_LABELS,
        )
        phys = GaugeMetricFamily(
            "rdmaplane_port_physical_state",
            "Physical port state (2 Polling, 3 Disabled, 5 LinkUp)",
            labels=PORT_LABELS,
        )
        up = GaugeMetricFamily(
            "rdmaplane_port_up", "1 when the port is ACTIVE and LinkUp", labels=PORT_LABELS
        )
        rate = GaugeMetricFamily(
            "rdmaplane_port_rate_bytes_per_second",
            "Link rate the port negotiated",
            labels=PORT_LABELS,
        )
        counters: dict[str, CounterMetricFamily] = {}
        healthy = GaugeMetricFamily(
            "rdmaplane_hca_healthy",
            "1 when the health monitor calls the HCA healthy",
            labels=["hca"],
        )
        topo = view.topo
        for hca in topo.hcas if topo else ():
            for port in hca.ports:
                labels = [
                    hca.name,
                    str(port.number),
                    port.netdev or "",
                    str(hca.numa if hca.numa is not None else -1),
                ]
                base = f"{view.root}/class/infiniband/{hca.name}/ports/{port.number}"
                s = leading_number(read_small(f"{base}/state"))
                p = leading_number(read_small(f"{base}/phys_state"))
                if s is not None:
                    state.add_metric(labels, s)
                if p is not None:
                    phys.add_metric(labels, p)
                if s is not None and p is not None:
                    up.add_metric(labels, 1.0 if link_up(s, p) else 0.0)
                gbps = _rate_gbps(read_small(f"{base}/rate"))
                if gbps is not None:
                    rate.add_metric(labels, gbps * 1e9 / 8)
                files = counter_files(view.root, hca.name, port.number, len(hca.ports) == 1)
                for name, path in sorted(files.items()):
                    known = EXPORTED.get(name)
                    value = leading_number(read_small(path)) if known else None
                    if known is None or known.metric is None or value is None:
                        continue
                    family = counters.get(known.metric)
                    if family is None:
                        family = CounterMetricFamily(
                            f"rdmaplane_port_{known.metric}", known.help, labels=PORT_LABELS
                        )
                        counters[known.metric] = family
                    family.add_metric(labels, value * known.scale)
            if hca.name in view.health:
                healthy.add_metric([hca.name], 1.0 if view.health[hca.name].healthy else 0.0)
        yield from (state, phys, up, rate, *counters.values(), healthy)
        if view.ready is not None:
            yield GaugeMetricFamily(
                "rdmaplane_node_rdma_ready",
                "1 when the RDMAReady condition is True",
                value=1.0 if view.ready else 0.0,
            )


def _rate_gbps(raw: bytes | None) -> float | None:
    try:
        return None if raw is None else parse_rate_gbps(raw.decode("ascii", "replace"))
    except ValueError:
        return None


class AgentMetrics:
    """The agent's own figures, registered beside the node collector in one registry."""

    def __init__(self, view: Callable[[], NodeView]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.discovery_seconds = Histogram(
            "rdmaplane_agent_discovery_duration_seconds",
            "Time of one full discovery (settled: two agreeing read_node calls and a probe)",
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.discoveries = Counter(
            "rdmaplane_agent_discoveries",
            "Full discoveries, by what triggered them",
            ["trigger"],
            registry=r,
        )
        self.poll_seconds = Histogram(
            "rdmaplane_agent_poll_duration_seconds",
            "Time of one cheap poll (change detection and health counters)",
            registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
        )
        self.publish_seconds = Histogram(
            "rdmaplane_agent_publish_duration_seconds",
            "Time of one publish cycle that wrote something",
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )
        self.writes = Counter(
            "rdmaplane_agent_api_writes",
            "Writes to the API server, by object",
            ["object"],
            registry=r,
        )
        self.publish_errors = Counter(
            "rdmaplane_agent_publish_errors", "Publish cycles that failed", registry=r
        )
        self.api_reachable = Gauge(
            "rdmaplane_agent_api_reachable",
            "1 when the last publish attempt reached the API server",
            registry=r,
        )
        self.nrt_written_by_others = Gauge(
            "rdmaplane_agent_nrt_written_by_others",
            "1 while another program writes this node's NodeResourceTopology (left alone)",
            registry=r,
        )
        self.podresources_errors = Counter(
            "rdmaplane_agent_podresources_errors",
            "Failed PodResources queries to the kubelet",
            registry=r,
        )
        self.health_transitions = Counter(
            "rdmaplane_agent_health_transitions",
            "HCA health flips, by direction",
            ["to"],
            registry=r,
        )
        self.task_restarts = Counter(
            "rdmaplane_agent_task_restarts",
            "Long-running tasks restarted after an unexpected fault, by task",
            ["task"],
            registry=r,
        )
        info = Gauge("rdmaplane_agent_info", "Agent version", ["version"], registry=r)
        info.labels(__version__).set(1)
        r.register(NodeCollector(view))


class FaultMetrics:
    """The fault actor's figures (docs/faults.md), in the agent's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.decisions = Counter(
            "rdmaplane_agent_fault_decisions",
            "Fault decisions per verb (notify, act, clear, observe, hold) and outcome",
            ["verb", "outcome"],
            registry=r,
        )
        self.changes = Counter(
            "rdmaplane_agent_fault_changes",
            "Faults raised, changed or cleared, by the class they changed to (none = cleared)",
            ["to"],
            registry=r,
        )
        self.active = Gauge(
            "rdmaplane_agent_faults", "Ports with an active fault, per class", ["class"], registry=r
        )
        self.tainted = Gauge(
            "rdmaplane_agent_node_tainted", "1 while the rdma-unhealthy taint is wanted", registry=r
        )
        self.breaker_answers = Counter(
            "rdmaplane_agent_fault_breaker_answers",
            "The fault budget's answers to this agent (granted, refused, unknown)",
            ["verdict"],
            registry=r,
        )
        self.breaker_open = Gauge(
            "rdmaplane_agent_fault_breaker_open",
            "1 while the blast-radius breaker holds this node's fault actions (a storm)",
            registry=r,
        )
        self.quarantined_ports = Gauge(
            "rdmaplane_agent_quarantined_ports",
            "Ports out of service for failing again and again, until an operator clears them",
            registry=r,
        )
