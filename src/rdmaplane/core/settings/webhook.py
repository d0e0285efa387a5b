"""What the admission webhook adds to GPU pods and where its serving certificate comes from
(`WebhookConfig`, `rdmaplane webhook --config`, `rdmaplane inject --config`; docs/webhook.md),
defined once: these frozen dataclasses are the file's schema too (see `rdmaplane.core.settings`).
`InjectPolicy` is what the pure mutation (`webhook.inject`) reads; `WebhookSettings` adds how
the webhook serves."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdmaplane import IMAGE
from rdmaplane.core import names, notice, nrt
from rdmaplane.core.resources import Mode, Vocabulary
from rdmaplane.core.settings import Seconds, setting
from rdmaplane.core.untrusted import FieldError, SettingsError


@dataclass(frozen=True, slots=True)
class NodeClass:
    """HCAs per GPU on one kind of node, for pods whose nodeSelector holds `node_selector`."""

    name: str = setting(doc="a name for people")
    node_selector: dict[str, str] = setting(
        factory=dict, doc="labels the pod's nodeSelector must hold"
    )
    hcas_per_gpu: float = setting(1.0, "HCAs per GPU", gt=0, le=64)
    max_hcas: int = setting(8, "at most this many HCAs", ge=1, le=1024)


@dataclass(frozen=True, slots=True)
class Shm:
    """The memory-backed /dev/shm NCCL needs."""

    enabled: bool = setting(True, "mount one where none is")
    size_limit: str | None = setting(
        None, "a quantity; null: the GPU containers' largest memory limit"
    )
    volume_name: str = setting("rdmaplane-shm", "the volume's name")

    def __post_init__(self) -> None:
        if self.size_limit is not None and nrt.parse_quantity(self.size_limit) is None:
            raise FieldError("size_limit", f"{self.size_limit!r} is not a Kubernetes quantity")


@dataclass(frozen=True, slots=True)
class NoticeVolume:
    """The pod's annotations as a file, where rdmaplane.train's FaultNotice reads them."""

    enabled: bool = setting(True, "mount it where none is")
    volume_name: str = setting("podinfo", "the downward-API volume")
    mount_path: str = setting(notice.ANNOTATIONS_DIR, "the folder it is mounted at", pattern=r"^/")
    file_name: str = setting(
        notice.ANNOTATIONS_FILE_NAME, "the file in that folder", pattern=r"^[^/]+$"
    )
    env: str = setting(notice.ANNOTATIONS_FILE_ENV, "the variable naming the file")

    @property
    def path(self) -> str:
        return f"{self.mount_path.rstrip('/')}/{self.file_name}"


@dataclass(frozen=True, slots=True)
class Doctor:
    """The init container for pods annotated rdmaplane.io/doctor: "true": its image and
    `rdmaplane` arguments (its command is `rdmaplane`, whatever entry point the image has)."""

    enabled: bool = setting(True, "honour the annotation")
    image: str = setting(IMAGE, "an image with rdmaplane (rdmaplane's own)")
    args: tuple[str, ...] = setting(("doctor",), "rdmaplane's arguments")


@dataclass(frozen=True, slots=True)
class Tls:
    """The serving certificate: `certFile` + `keyFile` (cert-manager, or your own), else a
    Secret the webhook fills with its own CA and serving certificate."""

    cert_file: Path | None = setting(None, "serve this certificate ...")
    key_file: Path | None = setting(None, "... with this key")
    secret_name: str = setting("rdmaplane-webhook-tls", "else this Secret")
    secret_namespace: str = setting("rdmaplane", "in this namespace")
    webhook_configuration: str = setting("rdmaplane-webhook", "whose caBundle it writes")
    hosts: tuple[str, ...] = setting(
        ("rdmaplane-webhook.rdmaplane.svc", "rdmaplane-webhook.rdmaplane.svc.cluster.local"),
        "DNS names or IPs the certificate is for",
        min_length=1,
    )
    cert_dir: Path = setting(Path("/tmp/rdmaplane-webhook"), "where the served files go")
    check_interval_s: Seconds = setting(
        300.0, "how often the certificate is checked and reloaded", gt=0
    )

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise SettingsError("certFile and keyFile go together")

    @property
    def from_files(self) -> bool:
        return self.cert_file is not None


@dataclass(frozen=True, slots=True)
class ClaimTemplate:
    """The ResourceClaimTemplate a pod of this many GPUs is given on a DRA node pool."""

    gpus: int = setting(1, "for a container of this many GPUs", ge=1, le=1024)
    name: str = setting(
        "gpu-nic-pcie-x1",
        "a ResourceClaimTemplate in the pod's namespace",
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
    )


# deploy/dra/claim-templates.yaml's names by size (tests/unit/test_webhook_dra.py holds them to
# that file), the allocator's cheap shape for each size (docs/dra.md, "Claims by size"): 1 and
# 2 GPUs each with a NIC port on its PCIe root (a pcieRoot constraint per pair); 4 GPUs and 4
# compute NIC ports on one NUMA node (exact by root on HGX, where each socket's NICs sit beside
# its GPUs); 8 GPUs with every compute NIC of the node (paired by taking the whole node).
# bench/cluster.py's DRA round and tests/e2e/test_scale_dra.py ask by this table too.
CLAIM_TEMPLATES = (
    ClaimTemplate(1, "gpu-nic-pcie-x1"),
    ClaimTemplate(2, "gpu-nic-pcie-x2"),
    ClaimTemplate(4, "gpu-nic-numa-x4"),
    ClaimTemplate(8, "gpu-nic-node-x8"),
)
DRA_NODE_LABEL = names.KUBELET_PLUGIN_LABEL  # deploy/dra/: the nodes the DRA driver serves


@dataclass(frozen=True, slots=True)
class DraNodePool:
    """Nodes whose GPUs and NICs are DRA devices. A pod is headed there when its nodeSelector
    holds `node_selector`, or each of its required node-affinity terms asks `In` those values
    only, or it is in one of `namespaces`: said by the pod or the cluster's admin, never
    guessed."""

    name: str = setting("dra", "a name for people")
    node_selector: dict[str, str] = setting(
        factory=lambda: {DRA_NODE_LABEL: "dra"}, doc="labels every node of the pool has"
    )
    namespaces: tuple[str, ...] = setting((), "namespaces whose every pod runs on the pool")
    claim_templates: tuple[ClaimTemplate, ...] = setting(
        CLAIM_TEMPLATES, "by GPUs per container: the template its claim is made from"
    )

    def __post_init__(self) -> None:
        if not (self.node_selector or self.namespaces):
            raise FieldError("node_selector", "name the pool's labels or its namespaces")
        sizes = [t.gpus for t in self.claim_templates]
        if len(sizes) != len(set(sizes)):
            raise FieldError("claim_templates", "one template per GPU count")

    def template(self, gpus: int) -> str | None:
        return next((t.name for t in self.claim_templates if t.gpus == gpus), None)


@dataclass(frozen=True, slots=True)
class Dra:
    """GPU pods headed to DRA node pools: a claim pairing each GPU with a NIC in place of the
    device-plugin resources (docs/webhook.md, "DRA")."""

    enabled: bool = setting(True, "give pods headed to a pool its claim")
    pools: tuple[DraNodePool, ...] = setting((DraNodePool(),), "the DRA node pools")
    gpu: str = setting("nvidia.com/gpu", "the GPU resource the templates' GPUs replace")
    claim_name: str = setting(
        "rdmaplane-gpus-nics",
        "the pod's name for its claim (-2, -3, ... for more GPU containers)",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    )


@dataclass(frozen=True, slots=True)
class InjectPolicy:
    """What the webhook adds to GPU pods. `resources` names at least one GPU resource and one
    pool of each mode: the first pool of a mode is what it adds."""

    mode: Mode = setting("exclusive", "what `auto` and a namespace opt-in mean")
    resources: Vocabulary = setting(factory=Vocabulary, doc="names")
    hcas_per_gpu: float = setting(
        1.0, "exclusive HCAs per GPU (rounded up, at least 1)", gt=0, le=64
    )
    max_hcas: int = setting(8, "at most this many HCAs", ge=1, le=1024)
    node_classes: tuple[NodeClass, ...] = setting((), "other ratios for pods selecting other nodes")
    ipc_lock: bool = setting(True, "add IPC_LOCK to GPU containers")
    shm: Shm = setting(factory=Shm, doc="/dev/shm")
    fault_notice: NoticeVolume = setting(
        factory=NoticeVolume, doc="the fault notice's annotations file"
    )
    doctor: Doctor = setting(factory=Doctor, doc=names.DOCTOR_ANNOTATION)
    dra: Dra = setting(factory=Dra, doc="pods headed to DRA node pools")

    def __post_init__(self) -> None:
        v = self.resources
        if not (v.gpus and v.exclusive and v.shared):
            raise FieldError("resources", "name a GPU resource and a pool of each mode")

    @property
    def hca(self) -> str:
        """The exclusive pool it adds."""
        return self.resources.exclusive[0]

    @property
    def hca_shared(self) -> str:
        """The shared pool it adds."""
        return self.resources.shared[0]

    @property
    def default_class(self) -> NodeClass:
        """The ratio for pods that no node class matches."""
        return NodeClass("default", {}, self.hcas_per_gpu, self.max_hcas)


@dataclass(frozen=True, slots=True)
class WebhookSettings(InjectPolicy):
    """What the admission webhook adds to GPU pods, and its certificate."""

    tls: Tls = setting(factory=Tls, doc="the serving certificate")
    max_request_bytes: int = setting(
        4 * 1024 * 1024, "larger bodies get 413", gt=0, le=64 * 1024 * 1024
    )
