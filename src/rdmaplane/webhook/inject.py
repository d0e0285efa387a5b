"""What the admission webhook adds to a GPU pod, as a JSONPatch built from the real object.

Pure: a pod (the dict the API server sent) and an `InjectPolicy` in, a `Mutation` (RFC 6902
operations and admission warnings) out. For every container (and init container) that asks for
GPUs it adds, unless the user already did:

- the RDMA resource: `rdmaplane.io/hca` x N (exclusive) or one `rdmaplane.io/hca-shared` slot;
  a container that names either resource keeps exactly what the user wrote;
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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from rdmaplane import nrt
from rdmaplane.errors import InputError
from rdmaplane.webhook.settings import Doctor, FaultNotice, InjectPolicy, Mode, NodeClass

MODE_ANNOTATION: Final = "rdmaplane.io/rdma"
DOCTOR_ANNOTATION: Final = "rdmaplane.io/doctor"
MODES: Final = ("auto", "exclusive", "shared", "off")
IPC_LOCK: Final = "IPC_LOCK"
SHM_PATH: Final = "/dev/shm"
DOCTOR_CONTAINER: Final = "rdmaplane-doctor"
# deploy/webhook/webhook.yaml's namespaceSelector: namespaces opt in with this label, and these
# are never sent to the webhook (tests/e2e/test_webhook.py holds `not_sent` to the real API
# server with that file).
OPT_IN_LABEL: Final = "rdmaplane.io/inject"
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


# ------------------------------------------------------------------------------ reading the pod


def _map(value: Json) -> Mapping[str, Json]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Json) -> list[Json]:
    return value if isinstance(value, list) else []


def mode_of(pod: Mapping[str, Json], policy: InjectPolicy) -> Mode | None:
    """The pod's mode: its annotation, else `auto`; None for `off`."""
    annotations = _map(_map(pod.get("metadata")).get("annotations"))
    value = annotations.get(MODE_ANNOTATION, "auto")
    if value not in MODES:
        raise PodError(
            f"annotation {MODE_ANNOTATION}: {str(value)[:64]!r} is not one of {'|'.join(MODES)}"
        )
    if value == "off":
        return None
    if value == "auto":
        return policy.mode
    return "exclusive" if value == "exclusive" else "shared"


def _count(resources: Mapping[str, Json], name: str) -> int:
    """A whole device count from limits (else requests); 0 when absent or not whole."""
    for kind in ("limits", "requests"):
        quantity = nrt.parse_quantity(_map(resources.get(kind)).get(name))
        if quantity is not None and quantity > 0 and quantity == quantity.to_integral_value():
            return int(quantity)
    return 0


def _names(resources: Mapping[str, Json]) -> set[str]:
    return {*_map(resources.get("limits")), *_map(resources.get("requests"))}


def node_class(pod: Mapping[str, Json], policy: InjectPolicy) -> NodeClass:
    """The first class whose selector the pod's nodeSelector contains, else the default."""
    selector = _map(_map(pod.get("spec")).get("nodeSelector"))
    for cls in policy.node_classes:
        if all(selector.get(k) == v for k, v in cls.node_selector.items()):
            return cls
    return policy.default_class


def hcas_for(gpus: int, cls: NodeClass) -> int:
    """Exclusive HCAs for `gpus` GPUs: GPUs x HCAs-per-GPU rounded up, at least 1, at most the
    class's HCAs."""
    return max(1, min(cls.max_hcas, math.ceil(gpus * cls.hcas_per_gpu - 1e-9)))


@dataclass(frozen=True)
class _Container:
    field: str  # "containers" or "initContainers"
    index: int
    body: Mapping[str, Json]
    gpus: int


def _gpu_containers(spec: Mapping[str, Json], gpu: str) -> Iterator[_Container]:
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(_list(spec.get(kind))):
            body = _map(c)
            gpus = _count(_map(body.get("resources")), gpu)
            if gpus and body.get("name") != DOCTOR_CONTAINER:  # ours: complete as it is
                yield _Container(kind, i, body, gpus)


# ------------------------------------------------------------------------------ who is sent


def not_sent(
    pod: Mapping[str, Json], namespace: str, opted_in: bool, policy: InjectPolicy
) -> str | None:
    """Why the API server would not send `pod` to the webhook, by the deployed webhook
    configuration's namespaceSelector and matchConditions; None when it would. `opted_in`:
    the namespace carries `rdmaplane.io/inject=enabled`."""
    if namespace in EXEMPT_NAMESPACES:
        return f"namespace {namespace} is exempt (namespaceSelector)"
    annotation = _map(_map(pod.get("metadata")).get("annotations")).get(MODE_ANNOTATION)
    if annotation == "off":
        return f"it is annotated {MODE_ANNOTATION}: off"
    if not opted_in and annotation is None:
        return (
            f"namespace {namespace} has no {OPT_IN_LABEL}=enabled label and the pod no "
            f"{MODE_ANNOTATION} annotation"
        )
    spec = _map(pod.get("spec"))
    bodies = [_map(c) for kind in ("initContainers", "containers") for c in _list(spec.get(kind))]
    resources = [_map(b.get("resources")) for b in bodies]
    if any(policy.resources.gpu in _map(r.get("limits")) for r in resources):
        return None
    if any(policy.resources.gpu in _map(r.get("requests")) for r in resources):
        return (
            f"its {policy.resources.gpu} is in requests only: the webhook is called for GPUs in "
            "limits (and the API server refuses an extended resource without a limit)"
        )
    return f"no container asks for {policy.resources.gpu} (limits)"


# ------------------------------------------------------------------------------ the mutation


def mutate(pod: Mapping[str, Json], policy: InjectPolicy) -> Mutation:
    """The patch that makes `pod` RDMA-ready, and warnings for what it will not fix.
    Raises `PodError` for a mode annotation it does not know."""
    mode = mode_of(pod, policy)
    spec = _map(pod.get("spec"))
    build = _Builder(pod)
    result = Mutation(warnings=list(_warnings(spec)), pod=build.obj)
    containers = list(_gpu_containers(spec, policy.resources.gpu))
    if mode is None or not containers or not isinstance(pod.get("spec"), Mapping):
        return result
    cls = node_class(pod, policy)
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
    if policy.doctor.enabled and _wants_doctor(pod):
        _add_doctor(build, policy, policy.doctor, max(c.gpus for c in containers), rdma)
    result.patch = build.ops
    return result


def _add_rdma(
    build: _Builder,
    at: tuple[str | int, ...],
    c: _Container,
    mode: Mode,
    cls: NodeClass,
    policy: InjectPolicy,
) -> dict[str, str]:
    """Add the RDMA resource to limits (and to requests when the GPUs are there too);
    returns the container's RDMA resource as it ends up."""
    resources = _map(c.body.get("resources"))
    present = _names(resources) & {policy.resources.hca, policy.resources.hca_shared}
    if present:
        return {n: str(_count(resources, n)) for n in sorted(present)}
    name, amount = (
        (policy.resources.hca, str(hcas_for(c.gpus, cls)))
        if mode == "exclusive"
        else (policy.resources.hca_shared, "1")
    )
    build.ensure((*at, "resources", "limits", name), amount)
    if policy.resources.gpu in _map(resources.get("requests")):
        build.ensure((*at, "resources", "requests", name), amount)
    return {name: amount}


def _own_hca_list(
    body: Mapping[str, Json], granted: Mapping[str, str], policy: InjectPolicy
) -> Iterator[str]:
    """A container that sets NCCL_IB_HCA itself keeps it (the kubelet puts the container's
    own variables after the device plugin's), so NCCL uses what it names, not the HCAs the
    device plugin grants: right when meant, worth saying when it names fewer than granted."""
    own = next(
        (_map(e) for e in _list(body.get("env")) if _map(e).get("name") == "NCCL_IB_HCA"), None
    )
    if own is None:
        return
    name = str(body.get("name", ""))[:63]
    value = own.get("value")
    if not isinstance(value, str):
        yield (
            f"container {name} sets NCCL_IB_HCA itself (from a reference): it replaces the "
            "device plugin's list of the HCAs granted"
        )
        return
    entries = [e for e in value.lstrip("^=").split(",") if e.strip()]
    hcas = int(granted.get(policy.resources.hca, 0) or 0)
    if not value.startswith("^") and hcas > len(entries):
        yield (
            f"container {name} sets NCCL_IB_HCA={value[:80]} ({len(entries)} HCA(s)) and is "
            f"given {hcas} {policy.resources.hca}: NCCL uses only those it names, and only if "
            "they are among the granted ones; leave NCCL_IB_HCA to the device plugin, which sets "
            "it to the HCAs granted"
        )


def _size(rdma: Mapping[str, str], policy: InjectPolicy) -> int:
    return int(rdma.get(policy.resources.hca, 0)) * 1000 + int(
        rdma.get(policy.resources.hca_shared, 0)
    )


def _add_ipc_lock(build: _Builder, at: tuple[str | int, ...], body: Mapping[str, Json]) -> None:
    context = _map(body.get("securityContext"))
    if context.get("privileged") is True:
        return  # warned about; privileged has every capability already
    added = {
        str(x).upper().removeprefix("CAP_")
        for x in _list(_map(context.get("capabilities")).get("add"))
    }
    if not added & {IPC_LOCK, "ALL"}:
        build.insert((*at, "securityContext", "capabilities", "add"), IPC_LOCK)


def _mounts_at(body: Mapping[str, Json], path: str) -> bool:
    want = path.rstrip("/")
    return any(
        str(_map(m).get("mountPath", "")).rstrip("/") == want
        for m in _list(body.get("volumeMounts"))
    )


def _shm_size(containers: list[_Container], policy: InjectPolicy) -> str | None:
    """The configured size, else the largest memory limit among the GPU containers (a memory
    emptyDir counts against it anyway), else none (the kubelet then sizes it to the pod)."""
    if policy.shm.size_limit is not None:
        return policy.shm.size_limit
    limits = [
        (q, str(raw))
        for c in containers
        if (raw := _map(_map(c.body.get("resources")).get("limits")).get("memory")) is not None
        and (q := nrt.parse_quantity(raw)) is not None
        and q > 0
    ]
    return max(limits, key=lambda x: x[0])[1] if limits else None


def _add_shm(
    build: _Builder,
    at: tuple[str | int, ...],
    body: Mapping[str, Json],
    policy: InjectPolicy,
    size: str | None,
) -> None:
    if _mounts_at(body, SHM_PATH):
        return
    empty_dir: dict[str, Json] = {"medium": "Memory"}
    if size is not None:
        empty_dir["sizeLimit"] = size
    name = _volume(build, policy.shm.volume_name, {"emptyDir": empty_dir})
    build.insert((*at, "volumeMounts"), {"name": name, "mountPath": SHM_PATH})


def _volume(build: _Builder, base: str, source: Mapping[str, Json]) -> str:
    """The pod volume named `base` with `source`, added once; `base-2`, `base-3`, ... when the
    user took the name for something else."""
    volumes = {
        str(_map(v).get("name")): _map(v) for v in _list(_map(build.obj["spec"]).get("volumes"))
    }
    name, n = base, 1
    while name in volumes:
        if {k: v for k, v in volumes[name].items() if k != "name"} == dict(source):
            return name
        n += 1
        name = f"{base}-{n}"
    build.insert(("spec", "volumes"), {"name": name, **_copy(dict(source))})
    return name


def _annotation_volumes(spec: Mapping[str, Json]) -> set[str]:
    """Pod volumes that show `metadata.annotations` as a file (downwardAPI or projected)."""
    found = set()
    for v in _list(spec.get("volumes")):
        vol = _map(v)
        sources = [_map(vol.get("downwardAPI"))]
        sources += [
            _map(_map(s).get("downwardAPI"))
            for s in _list(_map(vol.get("projected")).get("sources"))
        ]
        for source in sources:
            if any(
                _map(_map(item).get("fieldRef")).get("fieldPath") == "metadata.annotations"
                for item in _list(source.get("items"))
            ):
                found.add(str(vol.get("name")))
    return found


def _add_notice(
    build: _Builder,
    at: tuple[str | int, ...],
    body: Mapping[str, Json],
    notice: FaultNotice,
    result: Mutation,
) -> None:
    """Mount the annotations file where the fault notice reads it, unless the container already
    sees its annotations somewhere (then it knows where) or uses the directory otherwise."""
    mounted = {str(_map(m).get("name")) for m in _list(body.get("volumeMounts"))}
    if mounted & _annotation_volumes(_map(build.obj["spec"])):
        return
    name = str(body.get("name", ""))
    if _mounts_at(body, notice.mount_path):
        result.warnings.append(
            f"container {name[:63]}: {notice.mount_path} is taken; the fault notice "
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
    if not any(_map(e).get("name") == notice.env for e in _list(body.get("env"))):
        build.insert((*at, "env"), {"name": notice.env, "value": notice.path})


def _wants_doctor(pod: Mapping[str, Json]) -> bool:
    annotations = _map(_map(pod.get("metadata")).get("annotations"))
    return str(annotations.get(DOCTOR_ANNOTATION, "")).lower() in ("true", "enabled")


def _add_doctor(
    build: _Builder, policy: InjectPolicy, doctor: Doctor, gpus: int, rdma: Mapping[str, str]
) -> None:
    """`rdmaplane doctor` as the first init container, with the largest container's GPUs and
    RDMA devices (the kubelet hands them on to the app containers), IPC_LOCK and /dev/shm."""
    spec = _map(build.obj["spec"])
    inits = _list(spec.get("initContainers"))
    if any(_map(c).get("name") == DOCTOR_CONTAINER for c in inits):
        return
    limits = {policy.resources.gpu: str(gpus), **rdma}
    container: dict[str, Json] = {
        "name": DOCTOR_CONTAINER,
        "image": doctor.image,
        "command": ["rdmaplane"],
        "args": list(doctor.args),
        "resources": {"limits": limits},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"add": [IPC_LOCK]},
        },
    }
    shm = next(
        (
            _map(m)
            for kind in ("containers", "initContainers")
            for c in _list(spec.get(kind))
            for m in _list(_map(c).get("volumeMounts"))
            if str(_map(m).get("mountPath", "")).rstrip("/") == SHM_PATH
        ),
        None,
    )
    if shm is not None:
        container["volumeMounts"] = [{"name": shm.get("name"), "mountPath": SHM_PATH}]
    build.insert(("spec", "initContainers"), container, 0)


def _warnings(spec: Mapping[str, Json]) -> Iterator[str]:
    """What the webhook will not fix: device directories mounted from the host (they bypass
    the device cgroup, so NCCL/UCX see HCAs the pod was not given) and privileged containers."""
    host_dev = {
        str(_map(v).get("name"))
        for v in _list(spec.get("volumes"))
        if str(_map(_map(v).get("hostPath")).get("path", "")).rstrip("/") in _DEVICE_DIRS
    }
    for kind in ("initContainers", "containers"):
        for c in _list(spec.get(kind)):
            body = _map(c)
            name = str(body.get("name", ""))[:63]
            if _map(body.get("securityContext")).get("privileged") is True:
                yield (
                    f"container {name} is privileged: RDMA needs only IPC_LOCK and the "
                    "rdmaplane.io/hca devices; drop privileged"
                )
            for m in _list(body.get("volumeMounts")):
                if _map(m).get("name") in host_dev:
                    yield (
                        f"container {name} mounts hostPath /dev or /dev/infiniband: it bypasses "
                        "the device cgroup; remove it and request rdmaplane.io/hca"
                    )
