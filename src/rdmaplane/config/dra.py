"""The DRA driver's settings (`AgentConfig.dra`, read by `rdmaplane dra-driver`) and the opaque
configuration users put into ResourceClaims for it (`RdmaDeviceConfig`); docs/dra.md.

The driver is a mode of the node agent: the agent serves either the device plugin or the DRA
driver, never both, so one process owns each HCA's kubelet-facing side.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rdmaplane.config.base import Kind, Seconds, Section
from rdmaplane.config.deviceplugin import NcclConfig

DEFAULT_DRIVER = "rdma.rdmaplane.io"
# A DRA driver name is a DNS subdomain of at most 63 characters (ResourceSlice validation).
_DRIVER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

Effect = Literal["NoExecute", "NoSchedule", "None", "off"]


class DraTaintConfig(Section):
    """The taint a device gets in its ResourceSlice while its port has a fault (key
    `rdmaplane.io/rdma-unhealthy`, value the fault class). `off`: no taint for that class."""

    fatal: Effect = Field(
        default="NoExecute",
        description="port down, HCA gone, fatal counters: NoExecute evicts pods not tolerating it",
    )
    degraded: Effect = Field(default="off", description="error counters over the health thresholds")


class DraSharingConfig(Section):
    """How a port of a shared pool (`mode: shared`) is divided among claims: by its line rate,
    in Gb/s (the capacity `bandwidth`). A request that names no bandwidth takes `defaultGbps`;
    one that names some is rounded up to a multiple of `stepGbps`, at most the port's rate."""

    default_gbps: int = Field(
        default=100, ge=1, le=10_000, description="what a request naming no bandwidth takes"
    )
    step_gbps: int = Field(
        default=25, ge=1, le=10_000, description="shares are multiples of this (also the least)"
    )

    @model_validator(mode="after")
    def _default_on_a_step(self) -> DraSharingConfig:
        if self.default_gbps % self.step_gbps:
            raise ValueError(
                f"defaultGbps {self.default_gbps} is not a multiple of stepGbps {self.step_gbps}"
            )
        return self


class DraHealthConfig(Section):
    """The kubelet's device health stream (DRAResourceHealth.NodeWatchResources): what the
    pod's `containerStatuses[].allocatedResourcesStatus` shows."""

    timeout_s: Seconds = Field(
        default=30.0,
        ge=1,
        description="the kubelet shows Unknown when no report came for this long",
    )
    resend_s: Seconds = Field(
        default=10.0, gt=0, description="every device is reported again this often"
    )

    @model_validator(mode="after")
    def _resend_within_timeout(self) -> DraHealthConfig:
        if self.resend_s >= self.timeout_s:
            raise ValueError(
                f"resend ({self.resend_s:g}s) must be shorter than timeout "
                f"({self.timeout_s:g}s), or the kubelet shows Unknown between reports"
            )
        return self


class DraConfig(Section):
    """The DRA driver: ResourceSlices for this node, the kubelet plugin, CDI specs per claim."""

    enabled: bool = Field(
        default=False,
        description="serve DRA instead of the device plugin (needs devicePluginEnabled: false)",
    )
    driver_name: str = Field(
        default=DEFAULT_DRIVER, description="the DRA driver (DeviceClass selectors name it)"
    )
    plugin_dir: Path | None = Field(
        default=None,
        description="null: <kubeletDir>/plugins/<driverName> (socket, checkpoint)",
    )
    cdi_dir: Path = Field(
        default=Path("/var/run/cdi"), description="where per-claim CDI specs go (created)"
    )
    taints: DraTaintConfig = Field(
        default_factory=DraTaintConfig, description="device taints for faults"
    )
    binding_conditions: bool = Field(
        default=True,
        description="devices bind to the node and a pod binds once rdmaplane.io/rdma-ready "
        "is True on its claim (needs DRADeviceBindingConditions)",
    )
    health: DraHealthConfig = Field(
        default_factory=DraHealthConfig, description="the kubelet's device health stream"
    )
    sharing: DraSharingConfig = Field(
        default_factory=DraSharingConfig, description="shares of shared pools' ports"
    )

    @field_validator("driver_name")
    @classmethod
    def _dns_subdomain(cls, v: str) -> str:
        if len(v) > 63 or not _DRIVER_NAME.match(v):
            raise ValueError(
                f"{v!r} is not a DRA driver name (a DNS subdomain of at most 63 characters, "
                "e.g. rdma.rdmaplane.io)"
            )
        return v


class RdmaDeviceConfig(Kind):
    """Opaque configuration for the driver in a ResourceClaim or DeviceClass
    (`spec.devices.config[].opaque.parameters`, driver `rdma.rdmaplane.io`): overrides the
    pool's NCCL/UCX settings for the claim's RDMA devices."""

    docs = "docs/dra.md"
    read_by = "the DRA driver, from a ResourceClaim's opaque config"

    kind: Literal["RdmaDeviceConfig"] = "RdmaDeviceConfig"
    nccl: NcclConfig | None = Field(
        default=None, description="null: the settings of the pool each device belongs to"
    )
