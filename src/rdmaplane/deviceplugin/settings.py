"""What the device plugin runs on: its pools and how it serves them, as plain checked data.

The config file is read and validated by `rdmaplane.config.DevicePluginConfig` (pydantic, with
errors naming the key); `DevicePluginConfig.settings()` turns it into these. The plugin itself
never sees the pydantic models: the standalone plugin's serving process does not load pydantic
at all (see `rdmaplane.deviceplugin.serve`), and everything here is already checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rdmaplane.nccl import NcclSettings
from rdmaplane.selectors import Selectors

Mode = Literal["exclusive", "shared"]
Registration = Literal["kubelet", "plugins-registry"]


@dataclass(frozen=True, slots=True)
class Pool:
    """One extended resource and the HCAs behind it: `selectors` choose them, `mode` says
    whether a device is one HCA (exclusive) or one of `slots` slots granting them all
    (shared), `nccl` is what the environment handed to pods is planned for."""

    resource_name: str
    mode: Mode = "exclusive"
    slots: int = 100
    selectors: Selectors = field(default_factory=Selectors)
    nccl: NcclSettings = field(default_factory=NcclSettings)

    @property
    def shared(self) -> bool:
        return self.mode == "shared"


@dataclass(frozen=True, slots=True)
class PluginSettings:
    """Every pool of one plugin; `cdi_spec_dir` None when CDI is off."""

    pools: tuple[Pool, ...]
    registration: Registration = "kubelet"
    resend_interval: float = 60.0
    health_poll_interval: float = 5.0
    cdi_spec_dir: str | None = None


@dataclass(frozen=True, slots=True)
class Standalone:
    """What `rdmaplane device-plugin` hands its serving process: the settings, the checked
    paths and how to log."""

    settings: PluginSettings
    sysfs_root: str = "/sys"
    kubelet_dir: str = "/var/lib/kubelet"
    dev_root: str = "/dev"
    log_format: str = "text"
    log_level: str = "INFO"
