"""`WebhookConfig`: what `rdmaplane webhook` adds to GPU pods and where its serving certificate
comes from (`rdmaplane webhook --config`, `rdmaplane inject --config`; docs/webhook.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from rdmaplane import nrt
from rdmaplane.config.base import Kind, Seconds, Section
from rdmaplane.webhook import inject

_NOTICE = inject.Notice()
_DOCTOR = inject.Doctor()


class WebhookResourcesConfig(Section):
    """The extended resource names."""

    gpu: str = Field(default=nrt.GPU, description="marks a GPU container (in its limits)")
    hca: str = Field(default=nrt.HCA, description="exclusive HCAs, added in exclusive mode")
    hca_shared: str = Field(default=nrt.HCA_SHARED, description="a shared slot, in shared mode")


class NodeClassConfig(Section):
    """HCAs per GPU on one kind of node, for pods whose nodeSelector holds `nodeSelector`."""

    name: str = Field(description="a name for people")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="labels the pod's nodeSelector must hold"
    )
    hcas_per_gpu: float = Field(default=1.0, gt=0, le=64, description="HCAs per GPU")
    max_hcas: int = Field(default=8, ge=1, le=1024, description="at most this many HCAs")

    def to_core(self) -> inject.NodeClass:
        return inject.NodeClass(self.name, self.node_selector, self.hcas_per_gpu, self.max_hcas)


class ShmConfig(Section):
    """The memory-backed /dev/shm NCCL needs."""

    enabled: bool = Field(default=True, description="mount one where none is")
    size_limit: str | None = Field(
        default=None, description="a quantity; null: the GPU containers' largest memory limit"
    )
    volume_name: str = Field(default="rdmaplane-shm", description="the volume's name")

    @model_validator(mode="after")
    def _quantity(self) -> ShmConfig:
        if self.size_limit is not None and nrt.parse_quantity(self.size_limit) is None:
            raise ValueError(f"sizeLimit: {self.size_limit!r} is not a Kubernetes quantity")
        return self


class FaultNoticeConfig(Section):
    """The pod's annotations as a file, where rdmaplane.train's FaultNotice reads them."""

    enabled: bool = Field(default=True, description="mount it where none is")
    volume_name: str = Field(default=_NOTICE.volume, description="the downward-API volume")
    mount_path: str = Field(
        default=_NOTICE.mount_dir, pattern=r"^/", description="the folder it is mounted at"
    )
    file_name: str = Field(
        default=_NOTICE.file, pattern=r"^[^/]+$", description="the file in that folder"
    )
    env: str = Field(default=_NOTICE.env, description="the variable naming the file")


class DoctorConfig(Section):
    """The init container for pods annotated rdmaplane.io/doctor: "true"."""

    enabled: bool = Field(default=True, description="honour the annotation")
    image: str = Field(
        default=_DOCTOR.image, description="an image with rdmaplane (rdmaplane's own)"
    )
    args: list[str] = Field(
        default_factory=lambda: list(_DOCTOR.args), description="rdmaplane's arguments"
    )


class TlsConfig(Section):
    """The serving certificate: `certFile` + `keyFile` (cert-manager, or your own), else a
    Secret the webhook fills with its own CA and serving certificate."""

    cert_file: Path | None = Field(default=None, description="serve this certificate ...")
    key_file: Path | None = Field(default=None, description="... with this key")
    secret_name: str = Field(default="rdmaplane-webhook-tls", description="else this Secret")
    secret_namespace: str = Field(default="rdmaplane", description="in this namespace")
    webhook_configuration: str = Field(
        default="rdmaplane-webhook", description="whose caBundle it writes"
    )
    hosts: list[str] = Field(
        default_factory=lambda: [
            "rdmaplane-webhook.rdmaplane.svc",
            "rdmaplane-webhook.rdmaplane.svc.cluster.local",
        ],
        min_length=1,
        description="DNS names or IPs the certificate is for",
    )
    cert_dir: Path = Field(
        default=Path("/tmp/rdmaplane-webhook"), description="where the served files go"
    )
    check_interval_s: Seconds = Field(
        default=300.0, gt=0, description="how often the certificate is checked and reloaded"
    )

    @model_validator(mode="after")
    def _both_files(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("certFile and keyFile go together")
        return self

    @property
    def from_files(self) -> bool:
        return self.cert_file is not None


class WebhookConfig(Kind):
    """What the admission webhook adds to GPU pods, and its certificate."""

    docs = "docs/webhook.md"
    read_by = "rdmaplane webhook --config and rdmaplane inject --config"

    kind: Literal["WebhookConfig"] = "WebhookConfig"
    mode: Literal["exclusive", "shared"] = Field(
        default="exclusive", description="what `auto` and a namespace opt-in mean"
    )
    resources: WebhookResourcesConfig = Field(
        default_factory=WebhookResourcesConfig, description="names"
    )
    hcas_per_gpu: float = Field(
        default=1.0, gt=0, le=64, description="exclusive HCAs per GPU (rounded up, at least 1)"
    )
    max_hcas: int = Field(default=8, ge=1, le=1024, description="at most this many HCAs")
    node_classes: list[NodeClassConfig] = Field(
        default_factory=list, description="other ratios for pods selecting other nodes"
    )
    ipc_lock: bool = Field(default=True, description="add IPC_LOCK to GPU containers")
    shm: ShmConfig = Field(default_factory=ShmConfig, description="/dev/shm")
    fault_notice: FaultNoticeConfig = Field(
        default_factory=FaultNoticeConfig, description="the fault notice's annotations file"
    )
    doctor: DoctorConfig = Field(default_factory=DoctorConfig, description="rdmaplane.io/doctor")
    tls: TlsConfig = Field(default_factory=TlsConfig, description="the serving certificate")
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
