"""`DevicePluginConfig`: the device plugin's pools (`rdmaplane device-plugin --config`, the
agent's `devicePluginConfig`; docs/device-plugin.md).

A file without apiVersion/kind but with a top-level `configList` is read as the shared RDMA
device plugin's config (k8s-rdma-shared-dev-plugin), unchanged: each entry becomes a shared pool
`<resourcePrefix>/<resourceName>` with `rdmaHcaMax` slots.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from rdmaplane.config.base import API_VERSION, ConfigError, Kind, Seconds, Section, describe
from rdmaplane.deviceplugin.settings import PluginSettings, Pool
from rdmaplane.gid import GidPolicy
from rdmaplane.nccl import NcclSettings
from rdmaplane.selectors import Selectors
from rdmaplane.untrusted import FieldError

RESOURCE_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
DEFAULT_RESOURCE = {"exclusive": "rdmaplane.io/hca", "shared": "rdmaplane.io/hca-shared"}


class SelectorConfig(Section):
    """Which HCA ports a pool takes; empty lists match everything, lists are OR, keys are AND."""

    vendors: list[str] = Field(default=[], description='PCI vendor IDs, e.g. ["15b3"]')
    device_ids: list[str] = Field(
        default=[],
        alias="deviceIDs",
        description='PCI device IDs, with or without 0x, e.g. ["1021"]',
    )
    drivers: list[str] = Field(default=[], description='kernel drivers, e.g. ["mlx5_core"]')
    if_names: list[str] = Field(
        default=[], description="the port's netdev, or a netdev of the HCA's PCI function"
    )
    link_types: list[str] = Field(default=[], description="ether, infiniband")
    hca_names: list[str] = Field(default=[], description='patterns like "mlx5_*"')

    @model_validator(mode="after")
    def _valid(self) -> SelectorConfig:
        self.selectors()  # the selector's own checks (link types) name the key
        return self

    def selectors(self) -> Selectors:
        return Selectors(
            vendors=tuple(self.vendors),
            device_ids=tuple(self.device_ids),
            drivers=tuple(self.drivers),
            if_names=tuple(self.if_names),
            link_types=tuple(self.link_types),
            hca_names=tuple(self.hca_names),
        )


class GidConfig(Section):
    """How NCCL should pick the GID (see docs/gid-and-nccl.md)."""

    addr_family: Literal[4, 6] = Field(default=4, description="NCCL_IB_ADDR_FAMILY: 4 or 6")
    roce_version: Literal[1, 2] = Field(default=2, description="NCCL_IB_ROCE_VERSION_NUM")
    addr_range: str | None = Field(
        default=None, description="NCCL_IB_ADDR_RANGE, a CIDR of the family; null: any"
    )


# The plan's field names (rdmaplane.nccl, rdmaplane.gid) as this section's keys.
_NCCL_KEYS = {
    "nccl_version": "ncclVersion",
    "socket_ifname": "socketIfname",
    "ib_tc": "trafficClass",
    "ib_sl": "serviceLevel",
    "family": "gid.addrFamily",
    "cidr": "gid.addrRange",
    "roce_version": "gid.roceVersion",
}


class NcclConfig(Section):
    """The NCCL/UCX environment Allocate returns for the pool's HCAs."""

    socket_ifname: str | None = Field(default=None, description="NCCL_SOCKET_IFNAME, verbatim")
    traffic_class: int | None = Field(default=None, ge=0, le=255, description="NCCL_IB_TC (0-255)")
    service_level: int | None = Field(default=None, ge=0, le=15, description="NCCL_IB_SL (0-15)")
    gid: GidConfig = Field(default_factory=GidConfig, description="GID selection")
    nccl_version: str | None = Field(
        default=None,
        description="the NCCL the pods run; before 2.21 the GID index must be one number",
    )

    @model_validator(mode="after")
    def _plannable(self) -> NcclConfig:
        """The plan's own checks (version syntax, CIDR family), naming this file's key."""
        try:
            self.settings()
        except FieldError as e:
            raise ValueError(f"{_NCCL_KEYS.get(e.field, e.field)}: {e.reason}") from None
        return self

    def settings(self) -> NcclSettings:
        return NcclSettings(
            gid_policy=GidPolicy(
                family=self.gid.addr_family,
                cidr=self.gid.addr_range,
                roce_version=self.gid.roce_version,
            ),
            nccl_version=self.nccl_version,
            socket_ifname=self.socket_ifname,
            ib_tc=self.traffic_class,
            ib_sl=self.service_level,
        )


class PoolConfig(Section):
    """One extended resource and the HCAs behind it."""

    resource_name: str = Field(
        default="",
        description="domain/name, unique; empty: rdmaplane.io/hca or rdmaplane.io/hca-shared",
    )
    mode: Literal["exclusive", "shared"] = Field(
        default="exclusive",
        description="exclusive: one device per HCA; shared: slots granting them all",
    )
    slots: int = Field(
        default=100, ge=1, le=100_000, description="shared: pods that may share the pool"
    )
    selectors: SelectorConfig = Field(default_factory=SelectorConfig, description="default: all")
    nccl: NcclConfig = Field(default_factory=NcclConfig, description="environment for pods")

    @model_validator(mode="after")
    def _default_name(self) -> PoolConfig:
        if not self.resource_name:
            object.__setattr__(self, "resource_name", DEFAULT_RESOURCE[self.mode])
        if not RESOURCE_NAME.match(self.resource_name):
            raise ValueError(
                f"resourceName {self.resource_name!r} is not an extended resource name "
                "like 'rdmaplane.io/hca' (domain/name)"
            )
        return self

    def pool(self) -> Pool:
        return Pool(
            self.resource_name,
            self.mode,
            self.slots,
            self.selectors.selectors(),
            self.nccl.settings(),
        )


class CdiConfig(Section):
    """Container Device Interface: answer Allocate with CDI names and write the spec."""

    enabled: bool = Field(
        default=False, description="answer with CDI device names, write a CDI spec"
    )
    spec_dir: str = Field(
        default="/var/run/cdi", description="where the spec goes (created if missing)"
    )


class DevicePluginConfig(Kind):
    """The kubelet device plugin's pools and how it serves them."""

    docs = "docs/device-plugin.md"
    read_by = "rdmaplane device-plugin --config, or the agent's devicePluginConfig"

    kind: Literal["DevicePluginConfig"] = "DevicePluginConfig"
    health_poll_interval: Seconds = Field(
        default=5.0, gt=0, description="between sysfs probes (health, hot-plug); standalone only"
    )
    resend_interval: Seconds = Field(
        default=60.0, gt=0, description="between unconditional ListAndWatch re-sends"
    )
    registration: Literal["kubelet", "plugins-registry"] = Field(
        default="kubelet", description="kubelet (device-plugins/kubelet.sock) or plugins-registry"
    )
    cdi: CdiConfig = Field(default_factory=CdiConfig, description="CDI")
    pools: list[PoolConfig] = Field(
        default_factory=lambda: [PoolConfig()],
        min_length=1,
        description="one extended resource each",
    )

    @field_validator("pools")
    @classmethod
    def _unique_names(cls, pools: list[PoolConfig]) -> list[PoolConfig]:
        names = [p.resource_name for p in pools]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ValueError(f"resourceName {dup!r} is used by more than one pool")
        return pools

    def settings(self) -> PluginSettings:
        """What the plugin runs on: the same, as plain checked data."""
        return PluginSettings(
            pools=tuple(p.pool() for p in self.pools),
            registration=self.registration,
            resend_interval=self.resend_interval,
            health_poll_interval=self.health_poll_interval,
            cdi_spec_dir=self.cdi.spec_dir if self.cdi.enabled else None,
        )

    @classmethod
    def unversioned(cls, doc: Mapping[str, object], source: str) -> dict[str, object]:
        """The shared RDMA device plugin's `configList` file, in the versioned shape."""
        if "configList" not in doc:
            try:
                super().unversioned(doc, source)
            except ConfigError as e:
                raise ConfigError(f"{e}, or give the shared RDMA plugin's configList") from None
        try:
            legacy = _LegacyConfig.model_validate(doc, by_alias=True, by_name=False)
        except ValidationError as e:
            raise ConfigError(f"{source}: {describe(e, _LegacyConfig)}") from None
        return legacy.versioned()


class _LegacySelectors(Section):
    vendors: list[str] = []
    device_ids: list[str] = Field(default=[], alias="deviceIDs")
    drivers: list[str] = []
    if_names: list[str] = []
    link_types: list[str] = []


class _LegacyEntry(Section):
    resource_name: str
    resource_prefix: str = "rdma"
    rdma_hca_max: int = Field(ge=1)
    selectors: _LegacySelectors = Field(default_factory=_LegacySelectors)
    devices: list[str] = []  # the old plugin's shorthand for selectors.ifNames


class _LegacyConfig(Section):
    periodic_update_interval: float = 60.0
    config_list: list[_LegacyEntry] = Field(min_length=1)

    def versioned(self) -> dict[str, Any]:
        """The same pools as a DevicePluginConfig document (validated as one next)."""
        pools = []
        for e in self.config_list:
            selectors = e.selectors.model_dump(by_alias=True)
            selectors["ifNames"] = selectors["ifNames"] + e.devices
            pools.append(
                {
                    "resourceName": f"{e.resource_prefix}/{e.resource_name}",
                    "mode": "shared",
                    "slots": e.rdma_hca_max,
                    "selectors": selectors,
                }
            )
        doc: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "DevicePluginConfig"}
        doc["pools"] = pools
        if self.periodic_update_interval > 0:  # 0 turned periodic updates off there
            doc["healthPollInterval"] = self.periodic_update_interval
        return doc
