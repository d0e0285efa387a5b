"""The DRA driver's settings (`AgentConfig.dra`, read by `rdmaplane dra-driver`) and the opaque
configuration users put into ResourceClaims for it (`RdmaDeviceConfig`); docs/dra.md. Defined
once, as the files' schema too (see `rdmaplane.core.settings`).

The driver is a mode of the node agent: the agent serves either the device plugin or the DRA
driver, never both, so one process owns each HCA's kubelet-facing side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rdmaplane.core import names, paths
from rdmaplane.core.nccl import NcclSettings
from rdmaplane.core.settings import Seconds, setting
from rdmaplane.core.untrusted import FieldError

DEFAULT_DRIVER = names.DRA_DRIVER
# A DRA driver name is a DNS subdomain of at most 63 characters (ResourceSlice validation).
_DRIVER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

Effect = Literal["NoExecute", "NoSchedule", "None", "off"]


@dataclass(frozen=True, slots=True)
class DraTaints:
    """The taint a device gets in its ResourceSlice while its port has a fault (key
    `rdmaplane.io/rdma-unhealthy`, value the fault class). `off`: no taint for that class."""

    fatal: Effect = setting(
        "NoExecute",
        "port down, HCA gone, fatal counters: NoExecute evicts pods not tolerating it",
    )
    degraded: Effect = setting("off", "error counters over the health thresholds")


@dataclass(frozen=True, slots=True)
class DraSharing:
    """How a port of a shared pool (`mode: shared`) is divided among claims: by its line rate,
    in Gb/s (the capacity `bandwidth`). A request that names no bandwidth takes `default_gbps`;
    one that names some is rounded up to a multiple of `step_gbps`, at most the port's rate."""

    default_gbps: int = setting(100, "what a request naming no bandwidth takes", ge=1, le=10_000)
    step_gbps: int = setting(25, "shares are multiples of this (also the least)", ge=1, le=10_000)

    def __post_init__(self) -> None:
        if self.step_gbps < 1 or self.default_gbps % self.step_gbps:
            raise FieldError(
                "default_gbps",
                f"{self.default_gbps} is not a multiple of stepGbps {self.step_gbps}",
            )


@dataclass(frozen=True, slots=True)
class DraHealth:
    """The kubelet's device health stream (DRAResourceHealth.NodeWatchResources): what the
    pod's `containerStatuses[].allocatedResourcesStatus` shows."""

    timeout_s: Seconds = setting(
        30.0, "the kubelet shows Unknown when no report came for this long", ge=1
    )
    resend_s: Seconds = setting(10.0, "every device is reported again this often", gt=0)

    def __post_init__(self) -> None:
        if self.resend_s >= self.timeout_s:
            raise FieldError(
                "resend_s",
                f"{self.resend_s:g}s must be shorter than timeout ({self.timeout_s:g}s), or "
                "the kubelet shows Unknown between reports",
            )


@dataclass(frozen=True, slots=True)
class DraSettings:
    """The DRA driver: ResourceSlices for this node, the kubelet plugin, CDI specs per claim."""

    enabled: bool = setting(
        False, "serve DRA instead of the device plugin (needs devicePluginEnabled: false)"
    )
    driver_name: str = setting(DEFAULT_DRIVER, "the DRA driver (DeviceClass selectors name it)")
    plugin_dir: Path | None = setting(
        None, "null: <kubeletDir>/plugins/<driverName> (socket, checkpoint)"
    )
    cdi_dir: Path = setting(Path(paths.CDI_DIR), "where per-claim CDI specs go (created)")
    taints: DraTaints = setting(factory=DraTaints, doc="device taints for faults")
    binding_conditions: bool = setting(
        True,
        "devices bind to the node and a pod binds once rdmaplane.io/rdma-ready is True on its "
        "claim (needs DRADeviceBindingConditions)",
    )
    health: DraHealth = setting(factory=DraHealth, doc="the kubelet's device health stream")
    sharing: DraSharing = setting(factory=DraSharing, doc="shares of shared pools' ports")

    def __post_init__(self) -> None:
        if len(self.driver_name) > 63 or not _DRIVER_NAME.match(self.driver_name):
            raise FieldError(
                "driver_name",
                f"{self.driver_name!r} is not a DRA driver name (a DNS subdomain of at most 63 "
                "characters, e.g. rdma.rdmaplane.io)",
            )


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    """Opaque configuration for the driver in a ResourceClaim or DeviceClass
    (`spec.devices.config[].opaque.parameters`, driver `rdma.rdmaplane.io`; `RdmaDeviceConfig`):
    overrides the pool's NCCL/UCX settings for the claim's RDMA devices."""

    nccl: NcclSettings | None = setting(
        None, "null: the settings of the pool each device belongs to"
    )
