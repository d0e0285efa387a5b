"""The agent's configuration: one pydantic model, loaded from YAML, overridable from the CLI.

Unknown keys are errors (a typo must not silently fall back to a default), and every error
names the key it is about.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rdmaplane.discovery.lldp import DEFAULT_COMMAND as DEFAULT_LLDP_COMMAND
from rdmaplane.documents import DocumentError, expect_mapping, read_document
from rdmaplane.fabric import DEFAULT_TIER_LABELS

Policy = Literal["none", "best-effort", "restricted", "single-numa-node"]
Scope = Literal["container", "pod"]
POLICIES: tuple[str, ...] = get_args(Policy)
SCOPES: tuple[str, ...] = get_args(Scope)

# The counters the health monitor watches by default, and how many increments within the window
# it tolerates before it calls the HCA unhealthy. `link_downed` counts every time the link fell
# from LinkUp: one is already a flap.
DEFAULT_THRESHOLDS = {
    "link_downed": 0,
    "symbol_error": 100,
    "port_rcv_errors": 100,
    "local_ack_timeout_err": 100,
}


class ConfigError(ValueError):
    """A configuration file or value that cannot be used; the message names the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HealthConfig(_Strict):
    """Error-counter rules: more than `thresholds[counter]` increments within `window_s` seconds
    make the HCA unhealthy; it recovers once the increments in the window fall back under."""

    window_s: float = Field(default=300.0, gt=0)
    thresholds: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))

    @field_validator("thresholds")
    @classmethod
    def _non_negative(cls, v: dict[str, int]) -> dict[str, int]:
        bad = [k for k, n in v.items() if n < 0]
        if bad:
            raise ValueError(f"thresholds must be >= 0: {', '.join(sorted(bad))}")
        return v


class PublishConfig(_Strict):
    """How the agent talks to the API server."""

    enabled: bool = True
    backoff_initial_s: float = Field(default=1.0, gt=0)
    backoff_max_s: float = Field(default=60.0, gt=0)
    resync_interval_s: float = Field(default=600.0, gt=0)  # rewrite everything even if unchanged
    event_namespace: str = "default"
    max_pending_events: int = Field(default=100, ge=0)
    # A repeat of the same Event within this window raises the first one's count.
    event_aggregate_s: float = Field(default=600.0, ge=0)


class FabricConfig(_Strict):
    """Where the node sits on the fabric, and the labels that say so (docs/fabric.md). Sources:
    the operator's fabric file, else LLDP (lldpd's `lldpcli`) when it is installed."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    tier_labels: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TIER_LABELS), alias="tierLabels", min_length=1
    )
    file: Path | None = None
    lldp: Literal["auto", "off"] = "auto"
    lldp_command: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LLDP_COMMAND), alias="lldpCommand", min_length=1
    )


class AgentConfig(_Strict):
    node_name: str = Field("", description="the Node object this agent speaks for")
    sysfs_root: Path = Path("/sys")
    kubelet_dir: Path = Path("/var/lib/kubelet")
    kubeconfig: Path | None = None
    # The device plugin's own config file (pools, selectors); None = its defaults.
    device_plugin_config: Path | None = None
    dev_root: Path = Path("/dev")
    device_plugin_enabled: bool = True

    poll_interval_s: float = Field(default=5.0, gt=0)
    rediscover_interval_s: float = Field(
        default=600.0, gt=0
    )  # a full read even when nothing changed
    allocation_interval_s: float = Field(default=30.0, gt=0)

    # None: read from the kubelet config file (`<kubelet_dir>/config.yaml` unless given).
    topology_manager_policy: Policy | None = None
    topology_manager_scope: Scope | None = None
    kubelet_config: Path | None = None

    gpu_resource: str = "nvidia.com/gpu"

    metrics_address: str = "0.0.0.0"
    metrics_port: int = Field(default=9478, ge=0, le=65535)

    log_format: Literal["text", "json"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    health: HealthConfig = HealthConfig()
    publish: PublishConfig = PublishConfig()
    fabric: FabricConfig = FabricConfig()

    @property
    def kubelet_config_path(self) -> Path:
        return self.kubelet_config or self.kubelet_dir / "config.yaml"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_dir / "pod-resources" / "kubelet.sock"


def load(path: Path | None, **overrides: object) -> AgentConfig:
    """The config in `path` (YAML; None = all defaults) with `overrides` (CLI flags that were
    given) on top. Raises ConfigError naming the file and the bad key."""
    data: dict[str, object] = {}
    where = "configuration"
    if path is not None:
        where = str(path)
        try:
            data = dict(expect_mapping(read_document(path), where))
        except DocumentError as e:
            raise ConfigError(str(e)) from None
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        config = AgentConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{where}: {_describe(e)}") from e
    if not config.node_name:
        raise ConfigError(f"{where}: node_name: required (--node-name or $NODE_NAME)")
    return config


def _describe(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in error.errors()
    )


def read_kubelet_topology_manager(path: Path) -> tuple[str, str, str | None]:
    """(policy, scope, problem) from the kubelet config file; the kubelet defaults (`none`,
    `container`) when the file or the keys are absent. `problem` says what went wrong, if
    anything, so the caller can log it once."""
    try:
        loaded = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        return "none", "container", f"{path} not found; assuming the kubelet defaults"
    except (OSError, yaml.YAMLError) as e:
        return "none", "container", f"{path}: cannot read ({e}); assuming the kubelet defaults"
    conf = loaded if isinstance(loaded, dict) else {}
    policy = conf.get("topologyManagerPolicy", "none")
    scope = conf.get("topologyManagerScope", "container")
    problem = None
    if policy not in POLICIES:
        problem = f"{path}: topologyManagerPolicy {policy!r} unknown; assuming none"
        policy = "none"
    if scope not in SCOPES:
        problem = f"{path}: topologyManagerScope {scope!r} unknown; assuming container"
        scope = "container"
    return str(policy), str(scope), problem
