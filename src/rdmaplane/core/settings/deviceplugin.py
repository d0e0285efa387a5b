"""What the device plugin runs on: its pools and how it serves them, defined once.

These frozen dataclasses are the `DevicePluginConfig` file's schema too: `rdmaplane.adapters.config`
reads the file straight into them (keys, defaults, limits and descriptions come from the
fields, see `rdmaplane.core.settings`). The plugin never sees the validator: the standalone plugin's
serving process does not load pydantic at all (see `rdmaplane.services.deviceplugin.root`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from rdmaplane.core import paths
from rdmaplane.core.nccl import NcclSettings
from rdmaplane.core.resources import DEFAULT_POOL, Mode
from rdmaplane.core.selectors import Selectors
from rdmaplane.core.settings import Seconds, setting
from rdmaplane.core.untrusted import FieldError

Registration = Literal["kubelet", "plugins-registry"]

RESOURCE_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


@dataclass(frozen=True, slots=True)
class Pool:
    """One extended resource and the HCAs behind it: `selectors` choose them, `mode` says
    whether a device is one HCA (exclusive) or one of `slots` slots granting them all
    (shared), `nccl` is what the environment handed to pods is planned for."""

    resource_name: str = setting(
        "", "domain/name, unique; empty: rdmaplane.io/hca or rdmaplane.io/hca-shared"
    )
    mode: Mode = setting(
        "exclusive", "exclusive: one device per HCA; shared: slots granting them all"
    )
    slots: int = setting(100, "shared: pods that may share the pool", ge=1, le=100_000)
    selectors: Selectors = setting(factory=Selectors, doc="default: all")
    nccl: NcclSettings = setting(factory=NcclSettings, doc="environment for pods")

    def __post_init__(self) -> None:
        if not self.resource_name:
            object.__setattr__(self, "resource_name", DEFAULT_POOL[self.mode])
        if not RESOURCE_NAME.match(self.resource_name):
            raise FieldError(
                "resource_name",
                f"{self.resource_name!r} is not an extended resource name like "
                "'rdmaplane.io/hca' (domain/name)",
            )

    @property
    def shared(self) -> bool:
        return self.mode == "shared"


@dataclass(frozen=True, slots=True)
class CdiSettings:
    """Container Device Interface: answer Allocate with CDI names and write the spec."""

    enabled: bool = setting(False, "answer with CDI device names, write a CDI spec")
    spec_dir: str = setting(paths.CDI_DIR, "where the spec goes (created if missing)")


@dataclass(frozen=True, slots=True)
class PluginSettings:
    """The kubelet device plugin's pools and how it serves them (`DevicePluginConfig`)."""

    health_poll_interval: Seconds = setting(
        5.0, "between sysfs probes (health, hot-plug); standalone only", gt=0
    )
    resend_interval: Seconds = setting(60.0, "between unconditional ListAndWatch re-sends", gt=0)
    registration: Registration = setting(
        "kubelet", "kubelet (device-plugins/kubelet.sock) or plugins-registry"
    )
    cdi: CdiSettings = setting(factory=CdiSettings, doc="CDI")
    pools: tuple[Pool, ...] = setting((Pool(),), "one extended resource each", min_length=1)

    def __post_init__(self) -> None:
        names = [p.resource_name for p in self.pools]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise FieldError("pools", f"resourceName {dup!r} is used by more than one pool")

    @property
    def cdi_spec_dir(self) -> str | None:
        """Where the CDI spec goes; None when CDI is off."""
        return self.cdi.spec_dir if self.cdi.enabled else None


@dataclass(frozen=True, slots=True)
class Standalone:
    """What `rdmaplane device-plugin` hands its serving process: the settings, the checked
    paths and how to log."""

    settings: PluginSettings
    sysfs_root: str = paths.SYSFS
    kubelet_dir: str = paths.KUBELET_DIR
    dev_root: str = paths.DEV
    log_format: str = "text"
    log_level: str = "INFO"
