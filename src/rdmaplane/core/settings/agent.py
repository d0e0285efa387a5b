"""What the node agent runs on (`AgentConfig`, `rdmaplane agent --config`, docs/agent.md),
defined once: these frozen dataclasses are the file's schema too (see `rdmaplane.core.settings`)."""

from __future__ import annotations

import difflib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rdmaplane.core import names, paths
from rdmaplane.core.counters import (
    DEFAULT_FATAL_THRESHOLDS,
    DEFAULT_HOURLY_FATAL_THRESHOLDS,
    DEFAULT_HOURLY_THRESHOLDS,
    DEFAULT_THRESHOLDS,
    KNOWN_COUNTERS,
)
from rdmaplane.core.fabric import DEFAULT_TIER_LABELS
from rdmaplane.core.nrt import TopologyPolicy, TopologyScope
from rdmaplane.core.resources import GPU
from rdmaplane.core.settings import Seconds, setting
from rdmaplane.core.settings.dra import DraSettings
from rdmaplane.core.untrusted import FieldError


def check_counter_limits(field: str, limits: Mapping[str, int]) -> None:
    """Counter limits name counters the kernel exposes and are >= 0."""
    for name in sorted(limits):
        if name not in KNOWN_COUNTERS:
            near = difflib.get_close_matches(name, sorted(KNOWN_COUNTERS), n=1)
            hint = f" (did you mean {near[0]}?)" if near else " (see docs/agent.md)"
            raise FieldError(field, f"{name!r} is not a port counter the kernel exposes{hint}")
    bad = [k for k, n in limits.items() if n < 0]
    if bad:
        raise FieldError(field, f"thresholds must be >= 0: {', '.join(sorted(bad))}")


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """Error-counter rules: more than `thresholds[counter]` increments within `window_s` seconds
    make the HCA unhealthy; it recovers once the increments in the window fall back under."""

    window_s: Seconds = setting(300.0, "sliding window for error counters", gt=0)
    thresholds: dict[str, int] = setting(
        factory=lambda: dict(DEFAULT_THRESHOLDS),
        doc="counter file → increments tolerated within the window (more: Unhealthy)",
    )
    hourly_thresholds: dict[str, int] = setting(
        factory=lambda: dict(DEFAULT_HOURLY_THRESHOLDS),
        doc="counter file → increments tolerated within an hour (more: Unhealthy)",
    )
    flaps_per_hour: int | None = setting(
        2, "more link falls within an hour: Unhealthy and fatal; null: not judged", ge=0
    )
    kernel_log: Path | None = setting(
        None, "mlx5 health events from /dev/kmsg or a syslog file; null: not read"
    )

    def __post_init__(self) -> None:
        check_counter_limits("thresholds", self.thresholds)
        check_counter_limits("hourly_thresholds", self.hourly_thresholds)


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    """The blast-radius breaker: one budget in the API server (a Lease) for every agent's
    evictions and NoExecute taints, closed while a fault looks wider than a node."""

    mode: Literal["enforce", "observe", "off"] = setting(
        "enforce", "observe: take tokens and judge, never hold; off: no budget"
    )
    max_nodes_per_minute: int = setting(
        10, "nodes acting on faults cluster-wide in any minute", ge=0
    )
    max_faulty_share: float = setting(
        0.1,
        "no action while more of a fabric domain's or the cluster's nodes are faulty",
        ge=0,
        le=1,
    )
    min_faulty_nodes: int = setting(3, "fewer faulty nodes never open the breaker", ge=1)
    window_s: Seconds = setting(
        600.0, "a node counts as faulty this long after its fault began (a storm's span)", gt=0
    )
    domain_tier: int = setting(0, "the fabric tier whose switches are the domains (0: leaf)", ge=0)
    lease: str = setting("rdmaplane-fault-budget", "the budget's Lease")
    namespace: str = setting("rdmaplane", "the Lease's namespace")


@dataclass(frozen=True, slots=True)
class RepeatSettings:
    """Repeat offenders: a port that faulted `count` times within `window_s` stays out of
    service until an operator clears it (the count lives on the Node, not in memory)."""

    count: int = setting(3, "fatal faults of one port within the window ...", ge=1)
    window_s: Seconds = setting(86400.0, "... this window", gt=0)
    taint_effect: Literal["NoSchedule", "PreferNoSchedule"] | None = setting(
        "NoSchedule", f"{names.QUARANTINE_TAINT} on the node meanwhile; null: the plugin only"
    )


@dataclass(frozen=True, slots=True)
class FaultSettings:
    """What the agent does when an RDMA port fails under a pod (docs/faults.md): the fault
    notice, then (after `graceSeconds`) the RDMAFault condition and the eviction."""

    action: Literal["observe", "notify", "evict"] = setting(
        "evict", "observe: log and count; notify: notice + RDMAFault; evict: and evict"
    )
    fatal_after_s: Seconds = setting(
        5.0, "fatal symptoms must persist this long to be a fault", ge=0
    )
    clear_after_s: Seconds = setting(
        60.0, "a fault clears after this long without its symptoms", ge=0
    )
    grace_s: Seconds = setting(
        30.0,
        "notice → condition + eviction: time for an emergency checkpoint",
        key="graceSeconds",
        ge=0,
    )
    max_evictions_per_minute: int = setting(4, "the rest wait", ge=0)
    fatal_thresholds: dict[str, int] = setting(
        factory=lambda: dict(DEFAULT_FATAL_THRESHOLDS),
        doc="counter → increments within health.window that are fatal (others: degraded)",
    )
    hourly_fatal_thresholds: dict[str, int] = setting(
        factory=lambda: dict(DEFAULT_HOURLY_FATAL_THRESHOLDS),
        doc="counter → increments within an hour that are fatal",
    )
    taint_effect: Literal["NoExecute", "NoSchedule", "PreferNoSchedule"] | None = setting(
        "NoExecute",
        f"{names.UNHEALTHY_TAINT} when every compute HCA is fatal; null: never",
    )
    degraded_taint_effect: Literal["NoSchedule", "PreferNoSchedule"] | None = setting(
        None, "the same taint when every compute HCA is at least degraded"
    )
    breaker: BreakerSettings = setting(
        factory=BreakerSettings, doc="the fleet's budget for acting on faults (docs/faults.md)"
    )
    repeat: RepeatSettings = setting(
        factory=RepeatSettings, doc="ports that keep failing stay out of service (docs/faults.md)"
    )

    def __post_init__(self) -> None:
        check_counter_limits("fatal_thresholds", self.fatal_thresholds)
        check_counter_limits("hourly_fatal_thresholds", self.hourly_fatal_thresholds)


@dataclass(frozen=True, slots=True)
class PublishSettings:
    """How the agent talks to the API server."""

    enabled: bool = setting(True, "false: no API server (device plugin, metrics only)")
    backoff_initial_s: Seconds = setting(
        1.0, "retry delay after a failed write, doubling ...", gt=0
    )
    backoff_max_s: Seconds = setting(60.0, "... up to this", gt=0)
    resync_interval_s: Seconds = setting(
        600.0, "read back what the server holds and fix drift (±10 %)", gt=0
    )
    write_jitter_s: Seconds = setting(
        2.0, "a change to the NRT alone waits a random delay up to this ...", ge=0
    )
    nrt_min_interval_s: Seconds = setting(15.0, "... and such updates go at most this often", ge=0)
    event_namespace: str = setting(
        "default", "where Node events go (kubectl describe node shows them)"
    )
    max_pending_events: int = setting(
        100, "Events kept while the API server is away (oldest dropped)", ge=0
    )
    event_aggregate_s: Seconds = setting(
        600.0, "the same Event again within this window: count goes up", ge=0
    )


@dataclass(frozen=True, slots=True)
class FabricSettings:
    """Where the node sits on the fabric, and the labels that say so (docs/fabric.md). Sources:
    the operator's fabric file, else LLDP (lldpd's `lldpcli`) when it is installed."""

    tier_labels: tuple[str, ...] = setting(
        DEFAULT_TIER_LABELS, "node label keys of the tiers, closest first", min_length=1
    )
    file: Path | None = setting(None, "the operator's Fabric file")
    lldp: Literal["auto", "off"] = setting(
        "auto", "auto: read lldpcli's JSON when lldpcli is installed"
    )
    lldp_command: tuple[str, ...] = setting(
        ("lldpcli", "-f", "json", "show", "neighbors"),
        "how to ask lldpd for the neighbours",
        min_length=1,
    )


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Everything `rdmaplane agent` reads from its config file; flags override it."""

    node_name: str = setting("", "required (--node-name or $NODE_NAME)")
    sysfs_root: Path = setting(Path(paths.SYSFS), "/host/sys in the DaemonSet")
    kubelet_dir: Path = setting(
        Path(paths.KUBELET_DIR),
        "must exist; device-plugins/, pod-resources/kubelet.sock, config.yaml",
    )
    kubeconfig: Path | None = setting(None, "null: the pod's service account")
    device_plugin_enabled: bool = setting(
        True, "false when the standalone rdmaplane device-plugin serves the kubelet"
    )
    device_plugin_config: Path | None = setting(
        None, "a DevicePluginConfig file; null: one exclusive pool of every HCA"
    )
    dev_root: Path = setting(
        Path(paths.DEV), "where to look for /dev/infiniband/* (/host/dev in a pod)"
    )
    poll_interval_s: Seconds = setting(5.0, "cheap change detection + health counters", gt=0)
    state_poll_interval_s: Seconds | None = setting(
        1.0, "port states alone, between polls; null: off", gt=0
    )
    rediscover_interval_s: Seconds = setting(
        600.0, "full discovery even when nothing seemed to change", gt=0
    )
    allocation_interval_s: Seconds = setting(
        30.0, "PodResources List + GetAllocatableResources", gt=0
    )
    topology_manager_policy: TopologyPolicy | None = setting(
        None, "null: topologyManagerPolicy of the kubelet config file"
    )
    topology_manager_scope: TopologyScope | None = setting(
        None, "null: topologyManagerScope of the kubelet config file"
    )
    kubelet_config: Path | None = setting(None, "null: <kubeletDir>/config.yaml")
    fix_netns_mode: bool = setting(
        False,
        "at start, switch exclusive RDMA netns mode to shared if no HCA is in another network "
        "namespace (RDMA netlink; needs NET_ADMIN)",
    )
    gpu_resource: str = setting(GPU, "the GPU plugin's resource name")
    metrics_address: str = setting(
        "0.0.0.0", "IP address of /metrics, /healthz, /readyz (:: for IPv6)"
    )
    metrics_port: int = setting(9478, "0: any free port", ge=0, le=65535)
    log_format: Literal["text", "json"] = setting(
        "text", "json: one object per line (ts, level, logger, msg, extra fields)"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = setting(
        "INFO", "of rdmaplane's own loggers (-v: DEBUG)"
    )
    health: HealthSettings = setting(factory=HealthSettings, doc="health monitor")
    publish: PublishSettings = setting(factory=PublishSettings, doc="API server")
    fabric: FabricSettings = setting(factory=FabricSettings, doc="the node's place on the fabric")
    fault: FaultSettings = setting(
        factory=FaultSettings, doc="RDMA faults under pods (docs/faults.md)"
    )
    dra: DraSettings = setting(factory=DraSettings, doc="the DRA driver (docs/dra.md)")

    def __post_init__(self) -> None:
        try:
            ipaddress.ip_address(self.metrics_address)
        except ValueError:
            raise FieldError(
                "metrics_address",
                f"{self.metrics_address!r} is not an IP address (0.0.0.0 for every IPv4 "
                "address, :: for IPv6)",
            ) from None
        if self.dra.enabled and self.device_plugin_enabled:
            raise FieldError(
                "dra.enabled",
                "the device plugin is on too; one process must not offer the same HCAs "
                "through both: set devicePluginEnabled: false (rdmaplane dra-driver does)",
            )
        if self.dra.enabled and not self.publish.enabled:
            raise FieldError(
                "dra.enabled",
                "the DRA driver reads claims from and publishes ResourceSlices to the API "
                "server; publish.enabled must be true",
            )

    @property
    def kubelet_config_path(self) -> Path:
        return self.kubelet_config or self.kubelet_dir / paths.KUBELET_CONFIG

    @property
    def dra_plugin_dir(self) -> Path:
        return self.dra.plugin_dir or self.kubelet_dir / paths.PLUGINS / self.dra.driver_name

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_dir / paths.POD_RESOURCES / paths.KUBELET_SOCKET
