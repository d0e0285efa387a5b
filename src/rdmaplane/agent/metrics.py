"""Prometheus metrics: per-port link and traffic figures read at scrape time, agent self-metrics.

Port counters are read from sysfs when Prometheus scrapes (only the counter files, a few hundred
small reads on an 8-NIC node), so an agent that nobody scrapes spends nothing on them. The PMA
data counters `port_xmit_data`/`port_rcv_data` count 4-octet words: they are multiplied by 4.
Counters the kernel does not expose on a port (`hw_counters` on InfiniBand, say) are left out
rather than reported as 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from rdmaplane import __version__
from rdmaplane.agent.health import HcaHealth
from rdmaplane.discovery.probe import counter_files, leading_number, read_small
from rdmaplane.model import NodeTopology, parse_rate_gbps

PORT_LABELS = ("hca", "port", "netdev", "numa")

# sysfs counter → (metric name without `_total`, help, multiplier)
COUNTERS: dict[str, tuple[str, str, int]] = {
    "port_xmit_data": ("transmit_bytes", "Bytes transmitted (PMA port_xmit_data x 4)", 4),
    "port_rcv_data": ("receive_bytes", "Bytes received (PMA port_rcv_data x 4)", 4),
    "port_xmit_packets": ("transmit_packets", "Packets transmitted", 1),
    "port_rcv_packets": ("receive_packets", "Packets received", 1),
    "symbol_error": ("symbol_errors", "Minor link errors detected on a physical lane", 1),
    "link_downed": ("link_downed", "Times the link training failed or the link went down", 1),
    "link_error_recovery": ("link_error_recoveries", "Successful link error recoveries", 1),
    "port_rcv_errors": ("receive_errors", "Received packets with errors", 1),
    "port_xmit_discards": ("transmit_discards", "Outbound packets discarded", 1),
    "port_xmit_wait": ("transmit_wait_ticks", "Ticks with data to send but no credits", 1),
    "port_rcv_remote_physical_errors": (
        "receive_remote_physical_errors",
        "Received packets marked with EBP",
        1,
    ),
    "local_link_integrity_errors": (
        "local_link_integrity_errors",
        "Times the local physical error threshold was exceeded",
        1,
    ),
    "excessive_buffer_overrun_errors": (
        "excessive_buffer_overrun_errors",
        "Times consecutive flow-control overruns exceeded the threshold",
        1,
    ),
    # mlx5 hw_counters (RoCE congestion control and transport)
    "np_cnp_sent": ("cnp_sent", "Congestion notification packets sent (notification point)", 1),
    "rp_cnp_handled": ("cnp_handled", "CNPs handled by the reaction point", 1),
    "rp_cnp_ignored": ("cnp_ignored", "CNPs ignored by the reaction point", 1),
    "np_ecn_marked_roce_packets": (
        "ecn_marked_roce_packets",
        "RoCE packets received with ECN marking",
        1,
    ),
    "out_of_sequence": ("out_of_sequence_packets", "Out-of-sequence packets received", 1),
    "packet_seq_err": ("packet_sequence_errors", "NAKs for packet sequence errors received", 1),
    "local_ack_timeout_err": ("local_ack_timeout_errors", "Local ACK timeouts (QP retries)", 1),
    "rnr_nak_retry_err": ("rnr_nak_retry_errors", "RNR NAK retries exhausted", 1),
    "out_of_buffer": ("out_of_buffer_drops", "Drops for lack of receive WQEs", 1),
    "rx_write_requests": ("receive_write_requests", "RDMA write requests received", 1),
    "rx_read_requests": ("receive_read_requests", "RDMA read requests received", 1),
    "rx_atomic_requests": ("receive_atomic_requests", "RDMA atomic requests received", 1),
    "duplicate_request": ("duplicate_requests", "Duplicate requests received", 1),
    "implied_nak_seq_err": ("implied_nak_sequence_errors", "Implied NAK sequence errors", 1),
}


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
                    up.add_metric(labels, 1.0 if (s, p) == (4, 5) else 0.0)
                gbps = _rate_gbps(read_small(f"{base}/rate"))
                if gbps is not None:
                    rate.add_metric(labels, gbps * 1e9 / 8)
                files = counter_files(view.root, hca.name, port.number, len(hca.ports) == 1)
                for name, path in sorted(files.items()):
                    known = COUNTERS.get(name)
                    value = leading_number(read_small(path)) if known else None
                    if known is None or value is None:
                        continue
                    metric, help_text, factor = known
                    family = counters.get(metric)
                    if family is None:
                        family = CounterMetricFamily(
                            f"rdmaplane_port_{metric}", help_text, labels=PORT_LABELS
                        )
                        counters[metric] = family
                    family.add_metric(labels, value * factor)
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
