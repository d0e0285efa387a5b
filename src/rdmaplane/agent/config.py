"""The agent's configuration: one pydantic model, loaded from YAML, overridable from the CLI.

Unknown keys are errors (a typo must not silently fall back to a default), and every error
names the key it is about.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, get_args

import yaml
from pydantic import (
    AfterValidator,
    AliasGenerator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)
from pydantic.alias_generators import to_camel

from rdmaplane.documents import DocumentError, expect_mapping, read_document

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


def _non_negative(v: dict[str, int]) -> dict[str, int]:
    bad = [k for k, n in v.items() if n < 0]
    if bad:
        raise ValueError(f"thresholds must be >= 0: {', '.join(sorted(bad))}")
    return v


# Counter name → how many increments within the window are tolerated.
Thresholds = Annotated[dict[str, int], AfterValidator(_non_negative)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HealthConfig(_Strict):
    """Error-counter rules: more than `thresholds[counter]` increments within `window_s` seconds
    make the HCA unhealthy; it recovers once the increments in the window fall back under."""

    window_s: float = Field(default=300.0, gt=0)
    thresholds: Thresholds = Field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))


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


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(value: object) -> object:
    """A duration as Kubernetes writes it (`30s`, `1m30s`, `500ms`) or a number of seconds."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{value!r} is not a duration (e.g. 5s, 1m30s, 500ms, or seconds)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


Seconds = Annotated[float, BeforeValidator(_seconds), Field(ge=0)]


class FaultConfig(BaseModel):
    """`fault:` what the agent does when an RDMA port fails under a pod (docs/faults.md).

    camelCase keys, as every versioned rdmaplane config; durations as `5s`/`1m` or seconds."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=AliasGenerator(validation_alias=to_camel, serialization_alias=to_camel),
    )

    # Fatal symptoms must persist this long before they are a fault (one blip is not).
    fatal_after: Seconds = 5.0
    # A fault clears only after this long without its symptoms (a flapping port stays one fault).
    clear_after: Seconds = 60.0
    # observe: log and count; notify: notice + RDMAFault condition; evict: and the Eviction API.
    action: Literal["observe", "notify", "evict"] = "evict"
    # Between the notice (annotation + Event) and the action: time for an emergency checkpoint.
    grace_seconds: Seconds = 30.0
    max_evictions_per_minute: int = Field(default=4, ge=0)
    # Counters whose increments within health.window_s are fatal above this many (else degraded).
    fatal_thresholds: Thresholds = Field(default_factory=lambda: {"link_downed": 0})
    # The node taint when every compute HCA is fatal; null: never taint.
    taint_effect: Literal["NoExecute", "NoSchedule", "PreferNoSchedule"] | None = "NoExecute"
    # The same taint when every compute HCA is at least degraded; null (default): not then.
    degraded_taint_effect: Literal["NoSchedule", "PreferNoSchedule"] | None = None


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
    fault: FaultConfig = FaultConfig()

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
