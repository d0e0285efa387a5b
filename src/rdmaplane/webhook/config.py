"""`WebhookConfig`: what `rdmaplane webhook` adds to GPU pods, and where its certificate comes
from (docs/webhook.md). A versioned kind: camelCase keys, unknown keys are errors."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from rdmaplane import nrt
from rdmaplane.documents import DocumentError, expect_mapping, read_document
from rdmaplane.webhook import inject


class _Section(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class ResourcesConfig(_Section):
    gpu: str = Field(default=nrt.GPU, description="the GPU resource that marks a GPU container")
    hca: str = Field(default=nrt.HCA, description="exclusive HCAs")
    hca_shared: str = Field(default=nrt.HCA_SHARED, description="shared-pool slots")


class NodeClassConfig(_Section):
    """HCAs per GPU on one kind of node; chosen when the pod's nodeSelector holds `nodeSelector`."""

    name: str
    node_selector: dict[str, str] = Field(default_factory=dict)
    hcas_per_gpu: float = Field(default=1.0, gt=0, le=64)
    max_hcas: int = Field(default=8, ge=1, le=1024)

    def to_core(self) -> inject.NodeClass:
        return inject.NodeClass(self.name, self.node_selector, self.hcas_per_gpu, self.max_hcas)


class ShmConfig(_Section):
    enabled: bool = True
    size_limit: str | None = Field(
        default=None, description="null: the GPU containers' largest memory limit"
    )
    volume_name: str = "rdmaplane-shm"

    @model_validator(mode="after")
    def _quantity(self) -> ShmConfig:
        if self.size_limit is not None and nrt.parse_quantity(self.size_limit) is None:
            raise ValueError(f"sizeLimit: {self.size_limit!r} is not a Kubernetes quantity")
        return self


class FaultNoticeConfig(_Section):
    """The downward-API annotations file rdmaplane.train's FaultNotice reads."""

    enabled: bool = True
    volume_name: str = inject.Notice.volume
    mount_path: str = Field(default=inject.Notice.mount_dir, pattern=r"^/")
    file_name: str = Field(default=inject.Notice.file, pattern=r"^[^/]+$")
    env: str = inject.Notice.env


class DoctorConfig(_Section):
    """The init container added to pods annotated `rdmaplane.io/doctor: "true"`."""

    enabled: bool = True
    image: str = "ghcr.io/rdmaplane/rdmaplane:0.1.0"
    args: list[str] = Field(default_factory=lambda: ["doctor"])


class TlsConfig(_Section):
    """Either `certFile` + `keyFile` (cert-manager, or your own), or a Secret the webhook fills
    with its own CA and serving certificate, then writes the CA into `webhookConfiguration`."""

    cert_file: Path | None = None
    key_file: Path | None = None
    secret_name: str = "rdmaplane-webhook-tls"
    secret_namespace: str = "rdmaplane"
    webhook_configuration: str = "rdmaplane-webhook"
    hosts: list[str] = Field(
        default_factory=lambda: [
            "rdmaplane-webhook.rdmaplane.svc",
            "rdmaplane-webhook.rdmaplane.svc.cluster.local",
        ],
        min_length=1,
        description="DNS names or IPs the serving certificate is valid for",
    )
    cert_dir: Path = Field(
        default=Path("/tmp/rdmaplane-webhook"), description="where the served files are written"
    )
    check_interval_seconds: float = Field(default=300.0, gt=0)

    @model_validator(mode="after")
    def _both_files(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("certFile and keyFile go together")
        return self

    @property
    def from_files(self) -> bool:
        return self.cert_file is not None


class WebhookConfig(_Section):
    api_version: Literal["rdmaplane.io/v1alpha1"] = Field(
        default="rdmaplane.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["WebhookConfig"] = "WebhookConfig"
    mode: Literal["exclusive", "shared"] = Field(
        default="exclusive", description="what `auto` and a namespace opt-in mean"
    )
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    hcas_per_gpu: float = Field(default=1.0, gt=0, le=64)
    max_hcas: int = Field(default=8, ge=1, le=1024)
    node_classes: list[NodeClassConfig] = Field(default_factory=list)
    ipc_lock: bool = True
    shm: ShmConfig = Field(default_factory=ShmConfig)
    fault_notice: FaultNoticeConfig = Field(default_factory=FaultNoticeConfig)
    doctor: DoctorConfig = Field(default_factory=DoctorConfig)
    tls: TlsConfig = Field(default_factory=TlsConfig)
    max_request_bytes: int = Field(
        default=4 * 1024 * 1024, gt=0, le=64 * 1024 * 1024, description="larger bodies get 413"
    )

    def policy(self) -> inject.Policy:
        notice = self.fault_notice
        return inject.Policy(
            gpu=self.resources.gpu,
            hca=self.resources.hca,
            hca_shared=self.resources.hca_shared,
            mode=self.mode,
            default_class=inject.NodeClass("default", {}, self.hcas_per_gpu, self.max_hcas),
            classes=tuple(c.to_core() for c in self.node_classes),
            ipc_lock=self.ipc_lock,
            shm=self.shm.enabled,
            shm_volume=self.shm.volume_name,
            shm_size_limit=self.shm.size_limit,
            notice=inject.Notice(
                notice.volume_name, notice.mount_path, notice.file_name, notice.env
            )
            if notice.enabled
            else None,
            doctor=inject.Doctor(self.doctor.image, tuple(self.doctor.args))
            if self.doctor.enabled
            else None,
        )


class ConfigError(ValueError):
    """A config that cannot be used; the one-line message names the file and the key."""


def load_config(path: Path | None) -> WebhookConfig:
    """The file at `path` (None: the defaults); `ConfigError` names the file and the key."""
    if path is None:
        return WebhookConfig()
    try:
        data = expect_mapping(read_document(path), str(path))
    except DocumentError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return WebhookConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise ConfigError(f"{path}: {problems}") from None
