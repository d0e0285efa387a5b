"""`AgentConfig`: the node agent's configuration (`rdmaplane agent --config`, docs/agent.md)."""

from __future__ import annotations

import difflib
import ipaddress
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, Field, field_validator, model_validator

from rdmaplane.config.base import Kind, Seconds, Section
from rdmaplane.config.dra import DraConfig
from rdmaplane.counters import DEFAULT_FATAL_THRESHOLDS, DEFAULT_THRESHOLDS, KNOWN_COUNTERS
from rdmaplane.discovery.lldp import DEFAULT_COMMAND as DEFAULT_LLDP_COMMAND
from rdmaplane.fabric import DEFAULT_TIER_LABELS

Policy = Literal["none", "best-effort", "restricted", "single-numa-node"]
Scope = Literal["container", "pod"]
POLICIES: tuple[str, ...] = get_args(Policy)
SCOPES: tuple[str, ...] = get_args(Scope)


def known_counter_limits(v: dict[str, int]) -> dict[str, int]:
    """Counter limits name counters the kernel exposes and are >= 0."""
    for name in sorted(v):
        if name not in KNOWN_COUNTERS:
            near = difflib.get_close_matches(name, sorted(KNOWN_COUNTERS), n=1)
            hint = f" (did you mean {near[0]}?)" if near else " (see docs/agent.md)"
            raise ValueError(f"{name!r} is not a port counter the kernel exposes{hint}")
    bad = [k for k, n in v.items() if n < 0]
    if bad:
        raise ValueError(f"thresholds must be >= 0: {', '.join(sorted(bad))}")
    return v


# Counter file → how many increments within the health window are tolerated.
CounterLimits = Annotated[dict[str, int], AfterValidator(known_counter_limits)]


class HealthConfig(Section):
    """Error-counter rules: more than `thresholds[counter]` increments within `window_s` seconds
    make the HCA unhealthy; it recovers once the increments in the window fall back under."""

    window_s: Seconds = Field(default=300.0, gt=0, description="sliding window for error counters")
    thresholds: CounterLimits = Field(
        default_factory=lambda: dict(DEFAULT_THRESHOLDS),
        description="counter file → increments tolerated within the window (more: Unhealthy)",
    )


class FaultConfig(Section):
    """What the agent does when an RDMA port fails under a pod (docs/faults.md): the fault
    notice, then (after `graceSeconds`) the RDMAFault condition and the eviction."""

    action: Literal["observe", "notify", "evict"] = Field(
        default="evict",
        description="observe: log and count; notify: notice + RDMAFault; evict: and evict",
    )
    fatal_after_s: Seconds = Field(
        default=5.0, ge=0, description="fatal symptoms must persist this long to be a fault"
    )
    clear_after_s: Seconds = Field(
        default=60.0, ge=0, description="a fault clears after this long without its symptoms"
    )
    grace_s: Seconds = Field(
        default=30.0,
        ge=0,
        alias="graceSeconds",
        description="notice → condition + eviction: time for an emergency checkpoint",
    )
    max_evictions_per_minute: int = Field(default=4, ge=0, description="the rest wait")
    fatal_thresholds: CounterLimits = Field(
        default_factory=lambda: dict(DEFAULT_FATAL_THRESHOLDS),
        description="counter → increments within health.window that are fatal (others: degraded)",
    )
    taint_effect: Literal["NoExecute", "NoSchedule", "PreferNoSchedule"] | None = Field(
        default="NoExecute",
        description="rdmaplane.io/rdma-unhealthy when every compute HCA is fatal; null: never",
    )
    degraded_taint_effect: Literal["NoSchedule", "PreferNoSchedule"] | None = Field(
        default=None, description="the same taint when every compute HCA is at least degraded"
    )


class PublishConfig(Section):
    """How the agent talks to the API server."""

    enabled: bool = Field(
        default=True, description="false: no API server (device plugin, metrics only)"
    )
    backoff_initial_s: Seconds = Field(
        default=1.0, gt=0, description="retry delay after a failed write, doubling ..."
    )
    backoff_max_s: Seconds = Field(default=60.0, gt=0, description="... up to this")
    resync_interval_s: Seconds = Field(
        default=600.0, gt=0, description="read back what the server holds and fix drift (±10 %)"
    )
    write_jitter_s: Seconds = Field(
        default=2.0,
        ge=0,
        description="a change to the NRT alone waits a random delay up to this ...",
    )
    nrt_min_interval_s: Seconds = Field(
        default=15.0, ge=0, description="... and such updates go at most this often"
    )
    event_namespace: str = Field(
        default="default", description="where Node events go (kubectl describe node shows them)"
    )
    max_pending_events: int = Field(
        default=100, ge=0, description="Events kept while the API server is away (oldest dropped)"
    )
    event_aggregate_s: Seconds = Field(
        default=600.0, ge=0, description="the same Event again within this window: count goes up"
    )


class FabricConfig(Section):
    """Where the node sits on the fabric, and the labels that say so (docs/fabric.md). Sources:
    the operator's fabric file, else LLDP (lldpd's `lldpcli`) when it is installed."""

    tier_labels: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TIER_LABELS),
        min_length=1,
        description="node label keys of the tiers, closest first",
    )
    file: Path | None = Field(default=None, description="the operator's Fabric file")
    lldp: Literal["auto", "off"] = Field(
        default="auto", description="auto: read lldpcli's JSON when lldpcli is installed"
    )
    lldp_command: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LLDP_COMMAND),
        min_length=1,
        description="how to ask lldpd for the neighbours",
    )


class AgentConfig(Kind):
    """Everything `rdmaplane agent` reads from its config file; flags override it."""

    docs = "docs/agent.md"
    read_by = "rdmaplane agent --config"

    kind: Literal["AgentConfig"] = "AgentConfig"
    node_name: str = Field(default="", description="required (--node-name or $NODE_NAME)")
    sysfs_root: Path = Field(default=Path("/sys"), description="/host/sys in the DaemonSet")
    kubelet_dir: Path = Field(
        default=Path("/var/lib/kubelet"),
        description="must exist; device-plugins/, pod-resources/kubelet.sock, config.yaml",
    )
    kubeconfig: Path | None = Field(default=None, description="null: the pod's service account")
    device_plugin_enabled: bool = Field(
        default=True,
        description="false when the standalone rdmaplane device-plugin serves the kubelet",
    )
    device_plugin_config: Path | None = Field(
        default=None, description="a DevicePluginConfig file; null: one exclusive pool of every HCA"
    )
    dev_root: Path = Field(
        default=Path("/dev"), description="where to look for /dev/infiniband/* (/host/dev in a pod)"
    )
    poll_interval_s: Seconds = Field(
        default=5.0, gt=0, description="cheap change detection + health counters"
    )
    rediscover_interval_s: Seconds = Field(
        default=600.0, gt=0, description="full discovery even when nothing seemed to change"
    )
    allocation_interval_s: Seconds = Field(
        default=30.0, gt=0, description="PodResources List + GetAllocatableResources"
    )
    topology_manager_policy: Policy | None = Field(
        default=None, description="null: topologyManagerPolicy of the kubelet config file"
    )
    topology_manager_scope: Scope | None = Field(
        default=None, description="null: topologyManagerScope of the kubelet config file"
    )
    kubelet_config: Path | None = Field(default=None, description="null: <kubeletDir>/config.yaml")
    fix_netns_mode: bool = Field(
        default=False,
        description="at start, switch exclusive RDMA netns mode to shared if no HCA is in "
        "another network namespace (RDMA netlink; needs NET_ADMIN)",
    )
    gpu_resource: str = Field(
        default="nvidia.com/gpu", description="the GPU plugin's resource name"
    )
    metrics_address: str = Field(
        default="0.0.0.0", description="IP address of /metrics, /healthz, /readyz (:: for IPv6)"
    )
    metrics_port: int = Field(default=9478, ge=0, le=65535, description="0: any free port")
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="json: one object per line (ts, level, logger, msg, extra fields)",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="of rdmaplane's own loggers (-v: DEBUG)"
    )
    health: HealthConfig = Field(default_factory=HealthConfig, description="health monitor")
    publish: PublishConfig = Field(default_factory=PublishConfig, description="API server")
    fabric: FabricConfig = Field(
        default_factory=FabricConfig, description="the node's place on the fabric"
    )
    fault: FaultConfig = Field(
        default_factory=FaultConfig, description="RDMA faults under pods (docs/faults.md)"
    )
    dra: DraConfig = Field(default_factory=DraConfig, description="the DRA driver (docs/dra.md)")

    @model_validator(mode="after")
    def _one_kubelet_plugin(self) -> AgentConfig:
        if self.dra.enabled and self.device_plugin_enabled:
            raise ValueError(
                "dra.enabled: the device plugin is on too; one process must not offer the same "
                "HCAs through both: set devicePluginEnabled: false (rdmaplane dra-driver does)"
            )
        if self.dra.enabled and not self.publish.enabled:
            raise ValueError(
                "dra.enabled: the DRA driver reads claims from and publishes ResourceSlices to "
                "the API server; publish.enabled must be true"
            )
        return self

    @field_validator("metrics_address")
    @classmethod
    def _ip_address(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise ValueError(
                f"{v!r} is not an IP address (0.0.0.0 for every IPv4 address, :: for IPv6)"
            ) from None
        return v

    @property
    def kubelet_config_path(self) -> Path:
        return self.kubelet_config or self.kubelet_dir / "config.yaml"

    @property
    def dra_plugin_dir(self) -> Path:
        return self.dra.plugin_dir or self.kubelet_dir / "plugins" / self.dra.driver_name

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_dir / "pod-resources" / "kubelet.sock"
