"""What the admission webhook adds to a GPU pod, as a JSONPatch built from the real object.

Pure: a pod (the dict the API server sent) and an `InjectPolicy` in, a `Mutation` (RFC 6902
operations and admission warnings) out. For every container (and init container) that asks for
GPUs (any GPU resource of the policy's vocabulary: `nvidia.com/gpu`, `amd.com/gpu`, ...) it
adds, unless the user already did:

- the RDMA resource: the vocabulary's first exclusive pool x N (`rdmaplane.io/hca`) or one slot
  of its first shared pool (`rdmaplane.io/hca-shared`); a container that names any of its HCA
  pools keeps exactly what the user wrote;
- `IPC_LOCK` (RDMA memory registration pins pages), never `privileged`;
- a memory-backed `/dev/shm` (a container's default 64 MiB makes NCCL die in `ncclShmOpen`);
- the pod's annotations as a downward-API file, where `rdmaplane.train`'s fault notice reads
  them, and the variable that tells it where;
- on request, a `rdmaplane doctor` init container that fails the pod early when RDMA is unusable.

Idempotent: each addition is keyed by what it provides (a mount at /dev/shm, an annotations
file, the capability), not by our own names, so a second admission of the result adds nothing.
Nothing the user set is ever replaced: every operation is an `add` of a key or list item that
was not there.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from rdmaplane.core import names, nrt
from rdmaplane.core.decoding import DecodeError, convert
from rdmaplane.core.errors import InputError
from rdmaplane.core.resources import Mode
from rdmaplane.core.settings.webhook import Doctor, InjectPolicy, NodeClass, NoticeVolume

MODE_ANNOTATION: Final = names.RDMA_MODE_ANNOTATION
DOCTOR_ANNOTATION: Final = names.DOCTOR_ANNOTATION
MODES: Final = ("auto", "exclusive", "shared", "off")
IPC_LOCK: Final = "IPC_LOCK"
SHM_PATH: Final = "/dev/shm"
DOCTOR_CONTAINER: Final = "rdmaplane-doctor"
# deploy/webhook/webhook.yaml's namespaceSelector: namespaces opt in with this label, and these
# are never sent to the webhook (tests/e2e/test_webhook.py holds `not_sent` to the real API
# server with that file).
OPT_IN_LABEL: Final = names.INJECT_LABEL
EXEMPT_NAMESPACES: Final = ("kube-system", "rdmaplane")
# hostPath mounts that hand a container every RDMA device past the device cgroup.
_DEVICE_DIRS: Final = ("/dev", "/dev/infiniband")

Json = Any  # a decoded JSON value


class PodError(InputError):
    """A pod this webhook will not admit as it is (an unknown mode annotation); the message
    says what to change."""


@dataclass
class Mutation:
    patch: list[dict[str, Json]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    pod: dict[str, Json] = field(default_factory=dict)  # the pod with the patch applied


# ------------------------------------------------------------------------------ JSON Pointer


def escape(token: str) -> str:
    """One RFC 6901 reference token: `~` → `~0`, `/` → `~1` (`rdmaplane.io/hca`)."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    return "".join("/" + escape(str(t)) for t in tokens)


class _Builder:
    """Emits `add` operations against a working copy that follows them, so each operation is
    built from the object as it stands at that point (as the API server applies them)."""

    def __init__(self, obj: Mapping[str, Json]) -> None:
        self.obj: dict[str, Json] = _copy(obj)
        self.ops: list[dict[str, Json]] = []

    def ensure(self, path: tuple[str | int, ...], value: Json) -> None:
        """Set the key at `path` to `value` unless it exists; missing parents are added whole
        (one operation), existing ones are never replaced."""
        node: Json = self.obj
        for i, token in enumerate(path[:-1]):
            child = _child(node, token)
            if child is None:  # absent, or JSON null: an add replaces a null member
                return self._add(path[: i + 1], node, token, _nest(path[i + 1 :], value))
            node = child
        if _child(node, path[-1]) is None:
            self._add(path, node, path[-1], value)

    def insert(self, path: tuple[str | int, ...], item: Json, index: int | None = None) -> None:
        """Insert `item` at `index` (None: the end) of the list at `path`, made when missing."""
        node: Json = self.obj
        for token in path:
            node = _child(node, token)
        if not isinstance(node, list):
            return self.ensure(path, [item])
        self.ops.append(
            {
                "op": "add",
                "path": pointer(*path, "-" if index is None else index),
                "value": _copy(item),
            }
        )
        node.insert(len(node) if index is None else index, _copy(item))

    def _add(self, path: tuple[str | int, ...], parent: Json, key: str | int, value: Json) -> None:
        self.ops.append({"op": "add", "path": pointer(*path), "value": _copy(value)})
        parent[key] = _copy(value)


def _child(node: Json, token: str | int) -> Json:
    if isinstance(node, list) and isinstance(token, int):
        return node[token] if token < len(node) else None
    return node.get(token) if isinstance(node, dict) else None


def _nest(path: tuple[str | int, ...], value: Json) -> Json:
    for token in reversed(path):
        value = {token: value}
    return value


def _copy(value: Json) -> Json:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


# ------------------------------------------------------------------------------ the pod, as read
# What the webhook reads of a Pod, through the model layer (`rdmaplane.core.decoding`): the pod as
# it
# arrived, and the builder's working copy where the patch so far matters (volumes, the doctor).


class _FieldRef(msgspec.Struct, frozen=True, rename="camel"):
    field_path: str | None = None


class _Item(msgspec.Struct, frozen=True, rename="camel"):
    field_ref: _FieldRef | None = None


class _DownwardAPI(msgspec.Struct, frozen=True):
    items: tuple[_Item, ...] | None = None


class _Projection(msgspec.Struct, frozen=True, rename={"downward_api": "downwardAPI"}):
    downward_api: _DownwardAPI | None = None


class _Projected(msgspec.Struct, frozen=True):
    sources: tuple[_Projection, ...] | None = None


class _HostPath(msgspec.Struct, frozen=True):
    path: str = ""


class _Volume(
    msgspec.Struct, frozen=True, rename={"downward_api": "downwardAPI", "host_path": "hostPath"}
):
    name: str = ""
    downward_api: _DownwardAPI | None = None
    projected: _Projected | None = None
    host_path: _HostPath | None = None

    @property
    def shows_annotations(self) -> bool:
        """It shows `metadata.annotations` as a file (downwardAPI, or projected)."""
        sources = [self.downward_api]
        if self.projected is not None:
            sources += [s.downward_api for s in self.projected.sources or ()]
        return any(
            i.field_ref is not None and i.field_ref.field_path == "metadata.annotations"
            for source in sources
            if source is not None
            for i in source.items or ()
        )


class _Mount(msgspec.Struct, frozen=True, rename="camel"):
    name: str = ""
    mount_path: str = ""


class _Env(msgspec.Struct, frozen=True):
    name: str = ""
    value: str | None = None  # None: set from a reference (valueFrom)


class _Capabilities(msgspec.Struct, frozen=True):
    add: tuple[str, ...] | None = None


class _SecurityContext(msgspec.Struct, frozen=True):
    privileged: bool | None = None
    capabilities: _Capabilities | None = None


class _Resources(msgspec.Struct, frozen=True):
    limits: dict[str, int | str] | None = None
    requests: dict[str, int | str] | None = None


class _Container(msgspec.Struct, frozen=True, rename="camel"):
    name: str = ""
    resources: _Resources | None = None
    env: tuple[_Env, ...] | None = None
    security_context: _SecurityContext | None = None
    volume_mounts: tuple[_Mount, ...] | None = None

    def count(self, name: str) -> int:
        """A whole device count from limits (else requests); 0 when absent or not whole."""
        res = self.resources or _Resources()
        for table in (res.limits, res.requests):
            quantity = nrt.parse_quantity((table or {}).get(name))
            if quantity is not None and quantity > 0 and quantity == quantity.to_integral_value():
                return int(quantity)
        return 0

    @property
    def resource_names(self) -> set[str]:
        res = self.resources or _Resources()
        return {*(res.limits or {}), *(res.requests or {})}

    def mounts_at(self, path: str) -> bool:
        want = path.rstrip("/")
        return any(m.mount_path.rstrip("/") == want for m in self.volume_mounts or ())

    @property
    def privileged(self) -> bool:
        return self.security_context is not None and self.security_context.privileged is True


class _Spec(msgspec.Struct, frozen=True, rename="camel"):
    containers: tuple[_Container, ...] | None = None
    init_containers: tuple[_Container, ...] | None = None
    volumes: tuple[_Volume, ...] | None = None
    node_selector: dict[str, str] | None = None

    def every(self) -> Iterator[tuple[str, int, _Container]]:
        """(field, index, container): init containers first, as the kubelet starts them."""
        for i, c in enumerate(self.init_containers or ()):
            yield "initContainers", i, c
        for i, c in enumerate(self.containers or ()):
            yield "containers", i, c


class _Meta(msgspec.Struct, frozen=True):
    annotations: dict[str, str] | None = None


class _Pod(msgspec.Struct, frozen=True):
    metadata: _Meta | None = None
    spec: _Spec | None = None

    @property
    def annotations(self) -> Mapping[str, str]:
        return (self.metadata.annotations if self.metadata else None) or {}


def _read(pod: Json) -> _Pod:
    return convert(pod, _Pod)


def _now(build: _Builder) -> _Spec:
    """The working copy's spec as the patch so far leaves it."""
    return convert(build.obj.get("spec"), _Spec)


def mode_of(pod: _Pod, policy: InjectPolicy) -> Mode | None:
    """The pod's mode: its annotation, else `auto`; None for `off`."""
    value = pod.annotations.get(MODE_ANNOTATION, "auto")
    if value not in MODES:
        raise PodError(
            f"annotation {MODE_ANNOTATION}: {value[:64]!r} is not one of {'|'.join(MODES)}"
        )
    if value == "off":
        return None
    if value == "auto":
        return policy.mode
    return "exclusive" if value == "exclusive" else "shared"


def node_class(pod: _Pod, policy: InjectPolicy) -> NodeClass:
    """The first class whose selector the pod's nodeSelector contains, else the default."""
    selector = (pod.spec.node_selector if pod.spec else None) or {}
    for cls in policy.node_classes:
        if all(selector.get(k) == v for k, v in cls.node_selector.items()):
            return cls
    return policy.default_class


def hcas_for(gpus: int, cls: NodeClass) -> int:
    """Exclusive HCAs for `gpus` GPUs: GPUs x HCAs-per-GPU rounded up, at least 1, at most the
    class's HCAs."""
    return max(1, min(cls.max_hcas, math.ceil(gpus * cls.hcas_per_gpu - 1e-9)))


@dataclass(frozen=True)
class _GpuContainer:
    field: str  # "containers" or "initContainers"
    index: int
    body: _Container
    gpus: Mapping[str, int]  # by GPU resource

    @property
    def gpu_count(self) -> int:
        return sum(self.gpus.values())


def _gpu_containers(spec: _Spec, gpus: Sequence[str]) -> Iterator[_GpuContainer]:
    for kind, i, c in spec.every():
        counts = {n: k for n in gpus if (k := c.count(n))}
        if counts and c.name != DOCTOR_CONTAINER:  # ours: complete as it is
            yield _GpuContainer(kind, i, c, counts)


# ------------------------------------------------------------------------------ who is sent


def not_sent(
    pod: Mapping[str, Json], namespace: str, opted_in: bool, policy: InjectPolicy
) -> str | None:
    """Why the API server would not send `pod` to the webhook, by the deployed webhook
    configuration's namespaceSelector and matchConditions; None when it would. `opted_in`:
    the namespace carries `rdmaplane.io/inject=enabled`."""
    if namespace in EXEMPT_NAMESPACES:
        return f"namespace {namespace} is exempt (namespaceSelector)"
    try:
        read = _read(pod)
    except DecodeError as e:
        return f"it is no Pod the API server would take: {e}"
    annotation = read.annotations.get(MODE_ANNOTATION)
    if annotation == "off":
        return f"it is annotated {MODE_ANNOTATION}: off"
    if not opted_in and annotation is None:
        return (
            f"namespace {namespace} has no {OPT_IN_LABEL}=enabled label and the pod no "
            f"{MODE_ANNOTATION} annotation"
        )
    resources = [c.resources or _Resources() for _, _, c in (read.spec or _Spec()).every()]
    gpus = policy.resources.gpus
    if any(set(gpus) & set(r.limits or {}) for r in resources):
        return None
    if any(set(gpus) & set(r.requests or {}) for r in resources):
        return (
            f"its {' or '.join(gpus)} is in requests only: the webhook is called for GPUs in "
            "limits (and the API server refuses an extended resource without a limit)"
        )
    return f"no container asks for {' or '.join(gpus)} (limits)"


# ------------------------------------------------------------------------------ the mutation


def mutate(pod: Mapping[str, Json], policy: InjectPolicy) -> Mutation:
    """The patch that makes `pod` RDMA-ready, and warnings for what it will not fix.
    Raises `PodError` for a mode annotation it does not know; a pod it cannot read (no Pod the
    API server would take) gets no patch and a warning naming the field."""
    try:
        read = _read(pod)
    except DecodeError as e:
        return Mutation(warnings=[f"not patched, the pod cannot be read: {e}"], pod=_copy(pod))
    mode = mode_of(read, policy)
    spec = read.spec or _Spec()
    build = _Builder(pod)
    result = Mutation(warnings=list(_warnings(spec, policy.hca)), pod=build.obj)
    containers = list(_gpu_containers(spec, policy.resources.gpus))
    if mode is None or not containers or read.spec is None:
        return result
    cls = node_class(read, policy)
    shm_size = _shm_size(containers, policy)
    rdma: dict[str, str] = {}  # the largest RDMA request among the containers, for the doctor
    for c in containers:
        at = ("spec", c.field, c.index)
        granted = _add_rdma(build, at, c, mode, cls, policy)
        if _size(granted, policy) > _size(rdma, policy):
            rdma = granted
        result.warnings += _own_hca_list(c.body, granted, policy)
        if policy.ipc_lock:
            _add_ipc_lock(build, at, c.body)
        if policy.shm.enabled:
            _add_shm(build, at, c.body, policy, shm_size)
        if policy.fault_notice.enabled:
            _add_notice(build, at, c.body, policy.fault_notice, result)
    if policy.doctor.enabled and _wants_doctor(read):
        largest = max(containers, key=lambda c: c.gpu_count)
        _add_doctor(build, policy.doctor, largest.gpus, rdma)
    result.patch = build.ops
    return result


def _add_rdma(
    build: _Builder,
    at: tuple[str | int, ...],
    c: _GpuContainer,
    mode: Mode,
    cls: NodeClass,
    policy: InjectPolicy,
) -> dict[str, str]:
    """Add the RDMA resource to limits (and to requests when the GPUs are there too);
    returns the container's RDMA resource as it ends up."""
    vocabulary = policy.resources
    present = c.body.resource_names & {*vocabulary.exclusive, *vocabulary.shared}
    if present:
        return {n: str(c.body.count(n)) for n in sorted(present)}
    name, amount = (
        (policy.hca, str(hcas_for(c.gpu_count, cls)))
        if mode == "exclusive"
        else (policy.hca_shared, "1")
    )
    build.ensure((*at, "resources", "limits", name), amount)
    requests = (c.body.resources or _Resources()).requests or {}
    if set(c.gpus) & set(requests):
        build.ensure((*at, "resources", "requests", name), amount)
    return {name: amount}


def _own_hca_list(
    body: _Container, granted: Mapping[str, str], policy: InjectPolicy
) -> Iterator[str]:
    """A container that sets NCCL_IB_HCA itself keeps it (the kubelet puts the container's
    own variables after the device plugin's), so NCCL uses what it names, not the HCAs the
    device plugin grants: right when meant, worth saying when it names fewer than granted."""
    own = next((e for e in body.env or () if e.name == "NCCL_IB_HCA"), None)
    if own is None:
        return
    name = body.name[:63]
    value = own.value
    if value is None:
        yield (
            f"container {name} sets NCCL_IB_HCA itself (from a reference): it replaces the "
            "device plugin's list of the HCAs granted"
        )
        return
    entries = [e for e in value.lstrip("^=").split(",") if e.strip()]
    pools = [n for n in policy.resources.exclusive if int(granted.get(n, 0) or 0)]
    hcas = sum(int(granted[n]) for n in pools)
    if not value.startswith("^") and hcas > len(entries):
        yield (
            f"container {name} sets NCCL_IB_HCA={value[:80]} ({len(entries)} HCA(s)) and is "
            f"given {hcas} {'+'.join(pools)}: NCCL uses only those it names, and only if they are "
            "among the granted ones; leave NCCL_IB_HCA to the device plugin, which sets it to "
            "the HCAs granted"
        )


def _size(rdma: Mapping[str, str], policy: InjectPolicy) -> int:
    """Exclusive HCAs before shared slots: which container's RDMA devices the doctor takes."""
    v = policy.resources
    exclusive = sum(int(rdma.get(n, 0)) for n in v.exclusive)
    return exclusive * 1000 + sum(int(rdma.get(n, 0)) for n in v.shared)


def _add_ipc_lock(build: _Builder, at: tuple[str | int, ...], body: _Container) -> None:
    if body.privileged:
        return  # warned about; privileged has every capability already
    context = body.security_context or _SecurityContext()
    caps = context.capabilities.add if context.capabilities else None
    added = {x.upper().removeprefix("CAP_") for x in caps or ()}
    if not added & {IPC_LOCK, "ALL"}:
        build.insert((*at, "securityContext", "capabilities", "add"), IPC_LOCK)


def _shm_size(containers: list[_GpuContainer], policy: InjectPolicy) -> str | None:
    """The configured size, else the largest memory limit among the GPU containers (a memory
    emptyDir counts against it anyway), else none (the kubelet then sizes it to the pod)."""
    if policy.shm.size_limit is not None:
        return policy.shm.size_limit
    limits = [
        (q, str(raw))
        for c in containers
        if (raw := ((c.body.resources or _Resources()).limits or {}).get("memory")) is not None
        and (q := nrt.parse_quantity(raw)) is not None
        and q > 0
    ]
    return max(limits, key=lambda x: x[0])[1] if limits else None


def _add_shm(
    build: _Builder,
    at: tuple[str | int, ...],
    body: _Container,
    policy: InjectPolicy,
    size: str | None,
) -> None:
    if body.mounts_at(SHM_PATH):
        return
    empty_dir: dict[str, Json] = {"medium": "Memory"}
    if size is not None:
        empty_dir["sizeLimit"] = size
    name = _volume(build, policy.shm.volume_name, {"emptyDir": empty_dir})
    build.insert((*at, "volumeMounts"), {"name": name, "mountPath": SHM_PATH})


def _volume(build: _Builder, base: str, source: Mapping[str, Json]) -> str:
    """The pod volume named `base` with `source`, added once; `base-2`, `base-3`, ... when the
    user took the name for something else (the working copy's volumes compared as JSON: any
    source, not only those read here)."""
    volumes = {v.get("name"): v for v in build.obj["spec"].get("volumes") or ()}
    name, n = base, 1
    while name in volumes:
        if {k: v for k, v in volumes[name].items() if k != "name"} == dict(source):
            return name
        n += 1
        name = f"{base}-{n}"
    build.insert(("spec", "volumes"), {"name": name, **_copy(dict(source))})
    return name


def _add_notice(
    build: _Builder,
    at: tuple[str | int, ...],
    body: _Container,
    notice: NoticeVolume,
    result: Mutation,
) -> None:
    """Mount the annotations file where the fault notice reads it, unless the container already
    sees its annotations somewhere (then it knows where) or uses the directory otherwise."""
    mounted = {m.name for m in body.volume_mounts or ()}
    if any(v.name in mounted and v.shows_annotations for v in _now(build).volumes or ()):
        return
    if body.mounts_at(notice.mount_path):
        result.warnings.append(
            f"container {body.name[:63]}: {notice.mount_path} is taken; the fault notice "
            "(rdmaplane.io/fault) reaches it by SIGTERM only"
        )
        return
    source = {
        "downwardAPI": {
            "items": [{"path": notice.file_name, "fieldRef": {"fieldPath": "metadata.annotations"}}]
        }
    }
    volume = _volume(build, notice.volume_name, source)
    build.insert(
        (*at, "volumeMounts"), {"name": volume, "mountPath": notice.mount_path, "readOnly": True}
    )
    if not any(e.name == notice.env for e in body.env or ()):
        build.insert((*at, "env"), {"name": notice.env, "value": notice.path})


def _wants_doctor(pod: _Pod) -> bool:
    return pod.annotations.get(DOCTOR_ANNOTATION, "").lower() in ("true", "enabled")


def _add_doctor(
    build: _Builder, doctor: Doctor, gpus: Mapping[str, int], rdma: Mapping[str, str]
) -> None:
    """`rdmaplane doctor` as the first init container, with the largest container's GPUs and
    RDMA devices (the kubelet hands them on to the app containers), IPC_LOCK and /dev/shm."""
    spec = _now(build)
    if any(c.name == DOCTOR_CONTAINER for c in spec.init_containers or ()):
        return
    limits = {**{n: str(k) for n, k in gpus.items()}, **rdma}
    container: dict[str, Json] = {
        "name": DOCTOR_CONTAINER,
        "image": doctor.image,
        "command": ["rdmaplane"],
        "args": list(doctor.args),
        "resources": {"limits": limits},
        "securityContext": {  # root: a non-root process gets no effective IPC_LOCK
            "runAsUser": 0,
            "allowPrivilegeEscalation": False,
            "capabilities": {"add": [IPC_LOCK]},
        },
    }
    shm = next(
        (
            m
            for listed in (spec.containers, spec.init_containers)
            for c in listed or ()
            for m in c.volume_mounts or ()
            if m.mount_path.rstrip("/") == SHM_PATH
        ),
        None,
    )
    if shm is not None:
        container["volumeMounts"] = [{"name": shm.name, "mountPath": SHM_PATH}]
    build.insert(("spec", "initContainers"), container, 0)


def _warnings(spec: _Spec, hca: str) -> Iterator[str]:
    """What the webhook will not fix: device directories mounted from the host (they bypass
    the device cgroup, so NCCL/UCX see HCAs the pod was not given) and privileged containers."""
    host_dev = {
        v.name
        for v in spec.volumes or ()
        if v.host_path is not None and v.host_path.path.rstrip("/") in _DEVICE_DIRS
    }
    for _, _, body in spec.every():
        name = body.name[:63]
        if body.privileged:
            yield (
                f"container {name} is privileged: RDMA needs only IPC_LOCK and the "
                f"{hca} devices; drop privileged"
            )
        for m in body.volume_mounts or ():
            if m.name in host_dev:
                yield (
                    f"container {name} mounts hostPath /dev or /dev/infiniband: it bypasses "
                    f"the device cgroup; remove it and request {hca}"
                )
