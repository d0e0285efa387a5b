"""The DRA driver's settings (`AgentConfig.dra`, read by `rdmaplane dra-driver`) and the opaque
configuration users put into ResourceClaims for it (`RdmaDeviceConfig`); docs/dra.md. Defined
once, as the files' schema too (see `rdmaplane.setting`).

The driver is a mode of the node agent: the agent serves either the device plugin or the DRA
driver, never both, so one process owns each HCA's kubelet-facing side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rdmaplane.nccl import NcclSettings
from rdmaplane.setting import setting
from rdmaplane.untrusted import FieldError

DEFAULT_DRIVER = "rdma.rdmaplane.io"
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
class DraSettings:
    """The DRA driver: ResourceSlices for this node, the kubelet plugin, CDI specs per claim."""

    enabled: bool = setting(
        False, "serve DRA instead of the device plugin (needs devicePluginEnabled: false)"
    )
    driver_name: str = setting(DEFAULT_DRIVER, "the DRA driver (DeviceClass selectors name it)")
    plugin_dir: Path | None = setting(
        None, "null: <kubeletDir>/plugins/<driverName> (socket, checkpoint)"
    )
    cdi_dir: Path = setting(Path("/var/run/cdi"), "where per-claim CDI specs go (created)")
    taints: DraTaints = setting(factory=DraTaints, doc="device taints for faults")

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
