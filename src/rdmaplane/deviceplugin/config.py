"""The device plugin's one config file, and the shared RDMA device plugin's shape it also reads.

Native shape (YAML or JSON)::

    healthPollInterval: 5          # seconds between sysfs reads (health, hot-plug)
    resendInterval: 60             # seconds between unconditional ListAndWatch re-sends
    registration: kubelet          # or plugins-registry
    cdi: {enabled: false, specDir: /var/run/cdi}
    pools:
    - resourceName: rdmaplane.io/hca
      mode: exclusive              # or shared (default name rdmaplane.io/hca-shared)
      selectors: {vendors: ["15b3"], linkTypes: [ether]}
      nccl: {socketIfname: eth0, trafficClass: 106, serviceLevel: 3, ncclVersion: "2.21"}

A file with a top-level `configList` is read as the shared RDMA device plugin's config: each
entry becomes a shared pool `<resourcePrefix>/<resourceName>` with `rdmaHcaMax` slots.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from rdmaplane.documents import DocumentError, read_document
from rdmaplane.gid import GidPolicy
from rdmaplane.nccl import NcclSettings
from rdmaplane.selectors import Selectors

RESOURCE_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
DEFAULT_RESOURCE = {"exclusive": "rdmaplane.io/hca", "shared": "rdmaplane.io/hca-shared"}


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the bad key."""


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class SelectorConfig(_Model):
    """Which HCA ports a pool takes; empty lists match everything, lists are OR, keys are AND."""

    vendors: list[str] = []
    device_ids: list[str] = Field(default=[], alias="deviceIDs")
    drivers: list[str] = []
    if_names: list[str] = []
    link_types: list[str] = []
    hca_names: list[str] = []

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


class GidConfig(_Model):
    """How NCCL should pick the GID (see docs/gid.md)."""

    addr_family: Literal[4, 6] = 4
    roce_version: Literal[1, 2] = 2
    addr_range: str | None = None


class NcclConfig(_Model):
    socket_ifname: str | None = None
    traffic_class: int | None = Field(default=None, ge=0, le=255)
    service_level: int | None = Field(default=None, ge=0, le=15)
    gid: GidConfig = GidConfig()
    nccl_version: str | None = None

    @model_validator(mode="after")
    def _plannable(self) -> NcclConfig:
        self.settings()  # the plan's own checks (version syntax, CIDR family) name the key
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


class PoolConfig(_Model):
    resource_name: str = ""
    mode: Literal["exclusive", "shared"] = "exclusive"
    slots: int = Field(default=100, ge=1, le=100_000)
    selectors: SelectorConfig = SelectorConfig()
    nccl: NcclConfig = NcclConfig()

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


class CdiConfig(_Model):
    enabled: bool = False
    spec_dir: str = "/var/run/cdi"


class PluginConfig(_Model):
    health_poll_interval: float = Field(default=5.0, gt=0)
    resend_interval: float = Field(default=60.0, gt=0)
    registration: Literal["kubelet", "plugins-registry"] = "kubelet"
    cdi: CdiConfig = CdiConfig()
    pools: list[PoolConfig] = Field(default_factory=lambda: [PoolConfig()], min_length=1)

    @field_validator("pools")
    @classmethod
    def _unique_names(cls, pools: list[PoolConfig]) -> list[PoolConfig]:
        names = [p.resource_name for p in pools]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ValueError(f"resourceName {dup!r} is used by more than one pool")
        return pools


class _LegacySelectors(_Model):
    vendors: list[str] = []
    device_ids: list[str] = Field(default=[], alias="deviceIDs")
    drivers: list[str] = []
    if_names: list[str] = []
    link_types: list[str] = []


class _LegacyEntry(_Model):
    resource_name: str
    resource_prefix: str = "rdma"
    rdma_hca_max: int = Field(ge=1)
    selectors: _LegacySelectors = _LegacySelectors()
    devices: list[str] = []  # the old plugin's shorthand for selectors.ifNames


class _LegacyConfig(_Model):
    periodic_update_interval: float = 60.0
    config_list: list[_LegacyEntry] = Field(min_length=1)

    def native(self) -> dict[str, Any]:
        """The same pools in the native shape (so they pass the native validation too)."""
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
        doc: dict[str, Any] = {"pools": pools}
        if self.periodic_update_interval > 0:  # 0 turned periodic updates off there
            doc["healthPollInterval"] = self.periodic_update_interval
        return doc


def parse_config(doc: object, source: str = "config") -> PluginConfig:
    """Validate a parsed document; `ConfigError` names `source` and every bad key."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping at the top, got {type(doc).__name__}")
    try:
        if "configList" in doc:
            doc = _LegacyConfig.model_validate(doc).native()
        return PluginConfig.model_validate(doc)
    except ValidationError as e:
        raise ConfigError(f"{source}: " + "; ".join(_describe(err) for err in e.errors())) from e


def load_config(path: str | Path) -> PluginConfig:
    """Read a YAML or JSON config file."""
    try:
        doc = read_document(path)
    except DocumentError as e:
        raise ConfigError(str(e)) from None
    return parse_config(doc, str(path))


def _describe(err: Any) -> str:
    where = ""
    for part in err["loc"]:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
