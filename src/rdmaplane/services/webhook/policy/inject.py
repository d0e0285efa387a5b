"""What the admission webhook adds to a GPU pod, as a JSONPatch built from the real object.

Pure: a pod (the dict the API server sent, read as `podview` reads it) and an `InjectPolicy`
in, a `Mutation` (RFC 6902 operations, built by `core.jsonpatch`, and admission warnings) out.
For every container (and init container) that asks for GPUs (any GPU resource of the policy's
vocabulary: `nvidia.com/gpu`, `amd.com/gpu`, ...; counted by the one Pod model's rule, its
limits) it adds, unless the user already did:

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
from typing import Final

from rdmaplane.core import names, nrt
from rdmaplane.core.decoding import DecodeError
from rdmaplane.core.errors import InputError
from rdmaplane.core.jsonpatch import Json, PatchBuilder, Path, copy_json
from rdmaplane.core.resources import Mode
from rdmaplane.core.settings.webhook import Doctor, InjectPolicy, NodeClass, NoticeVolume
from rdmaplane.services.webhook.policy import dra
from rdmaplane.services.webhook.policy.podview import (
    ContainerView,
    PodView,
    SecurityContext,
    SpecView,
    memory_limit,
    read_pod,
    read_spec,
)

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


class PodError(InputError):
    """A pod this webhook will not admit as it is (an unknown mode annotation); the message
    says what to change."""


@dataclass
class Mutation:
    patch: list[dict[str, Json]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    pod: dict[str, Json] = field(default_factory=dict)  # the pod with the patch applied


def _now(build: PatchBuilder) -> SpecView:
    """The working copy's spec as the patch so far leaves it."""
    return read_spec(build.obj.get("spec"))


def mode_of(pod: PodView, policy: InjectPolicy) -> Mode | None:
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


def node_class(pod: PodView, policy: InjectPolicy) -> NodeClass:
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
class GpuContainer:
    """A container that asks for GPUs (in limits: the count the API server keeps)."""

    field: str  # "containers" or "initContainers"
    index: int
    body: ContainerView
    gpus: Mapping[str, int]  # by GPU resource

    @property
    def gpu_count(self) -> int:
        return sum(self.gpus.values())


def _gpu_containers(
    spec: SpecView, gpus: Sequence[str], claim_users: frozenset[tuple[str, int]] = frozenset()
) -> Iterator[GpuContainer]:
    """Containers asking GPUs, and those using a DRA claim (`claim_users`, by field and index)."""
    for kind, index, container in spec.every():
        counts = {name: k for name in gpus if (k := container.requirements.count(name))}
        if (counts or (kind, index) in claim_users) and container.name != DOCTOR_CONTAINER:
            yield GpuContainer(kind, index, container, counts)


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
        read = read_pod(pod)
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
    resources = [c.requirements for _, _, c in (read.spec or SpecView()).every()]
    gpus = policy.resources.gpus
    if any(set(gpus) & set(r.devices) for r in resources):
        return None
    if dra.claims(pod):  # the match condition sends DRA pods too
        return None
    if any(set(gpus) & set(r.unlimited) for r in resources):
        return (
            f"its {' or '.join(gpus)} is in requests only: the webhook is called for GPUs in "
            "limits (and the API server refuses an extended resource without a limit)"
        )
    return f"no container asks for {' or '.join(gpus)} (limits) and the pod has no resourceClaims"


# ------------------------------------------------------------------------------ the mutation


def mutate(pod: Mapping[str, Json], policy: InjectPolicy, namespace: str | None = None) -> Mutation:
    """The patch that makes `pod` RDMA-ready, and warnings for what it will not fix.
    `namespace`: the request's (default: the pod's own), for DRA pools named by namespace.
    Raises `PodError` for a mode annotation it does not know; a pod it cannot read (no Pod the
    API server would take) gets no patch and a warning naming the field."""
    try:
        read = read_pod(pod)
    except DecodeError as e:
        return Mutation(warnings=[f"not patched, the pod cannot be read: {e}"], pod=copy_json(pod))
    mode = mode_of(read, policy)
    spec = read.spec or SpecView()
    build = PatchBuilder(pod)
    result = Mutation(warnings=list(_warnings(spec, policy.hca)), pod=build.obj)
    claimed = bool(dra.claims(pod))  # a DRA pod: never given device-plugin resources
    users = frozenset(dra.claim_users(pod))
    containers = list(_gpu_containers(spec, policy.resources.gpus, users))
    if mode is None or not containers or read.spec is None:
        return result
    cls = node_class(read, policy)
    pool = None if claimed else dra.headed_to(pod, namespace, policy.dra)
    shm_size = _shm_size(containers, policy)
    rdma: dict[str, str] = {}  # the largest RDMA request among the containers, for the doctor
    for c in containers:
        at = ("spec", c.field, c.index)
        if claimed or (
            pool is not None
            and mode == "exclusive"
            and dra.give_claim(build, at, c.gpus, pool, policy.dra)
        ):
            granted: dict[str, str] = {}
        else:
            if pool is not None:
                result.warnings.append(
                    f"container {c.body.name[:63]}: "
                    + dra.not_served(
                        c.gpu_count,
                        pool,
                        policy.dra,
                        mode,
                        policy.hca if mode == "exclusive" else policy.hca_shared,
                    )
                )
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
        claims = dra.doctor_claims(build, ("spec", largest.field, largest.index))
        gpus = {n: k for n, k in largest.gpus.items() if not claims or n != policy.dra.gpu}
        _add_doctor(build, policy.doctor, gpus, rdma, claims)
    result.patch = build.ops
    return result


def _add_rdma(
    build: PatchBuilder,
    at: Path,
    c: GpuContainer,
    mode: Mode,
    cls: NodeClass,
    policy: InjectPolicy,
) -> dict[str, str]:
    """Add the RDMA resource to limits (and to requests when the GPUs are there too);
    returns the container's RDMA resource as it ends up."""
    vocabulary = policy.resources
    resources = c.body.requirements
    present = resources.names & {*vocabulary.exclusive, *vocabulary.shared}
    if present:
        return {n: str(resources.count(n)) for n in sorted(present)}
    name, amount = (
        (policy.hca, str(hcas_for(c.gpu_count, cls)))
        if mode == "exclusive"
        else (policy.hca_shared, "1")
    )
    build.ensure((*at, "resources", "limits", name), amount)
    if set(c.gpus) & set(resources.requests or ()):
        build.ensure((*at, "resources", "requests", name), amount)
    return {name: amount}


def _own_hca_list(
    body: ContainerView, granted: Mapping[str, str], policy: InjectPolicy
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


def _add_ipc_lock(build: PatchBuilder, at: Path, body: ContainerView) -> None:
    if body.privileged:
        return  # warned about; privileged has every capability already
    context = body.security_context or SecurityContext()
    caps = context.capabilities.add if context.capabilities else None
    added = {x.upper().removeprefix("CAP_") for x in caps or ()}
    if not added & {IPC_LOCK, "ALL"}:
        build.insert((*at, "securityContext", "capabilities", "add"), IPC_LOCK)


def _shm_size(containers: list[GpuContainer], policy: InjectPolicy) -> str | None:
    """The configured size, else the largest memory limit among the GPU containers (a memory
    emptyDir counts against it anyway), else none (the kubelet then sizes it to the pod)."""
    if policy.shm.size_limit is not None:
        return policy.shm.size_limit
    limits = [
        (q, str(raw))
        for c in containers
        if (raw := memory_limit(c.body)) is not None
        and (q := nrt.parse_quantity(raw)) is not None
        and q > 0
    ]
    return max(limits, key=lambda x: x[0])[1] if limits else None


def _add_shm(
    build: PatchBuilder,
    at: Path,
    body: ContainerView,
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


def _volume(build: PatchBuilder, base: str, source: Mapping[str, Json]) -> str:
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
    build.insert(("spec", "volumes"), {"name": name, **copy_json(dict(source))})
    return name


def _add_notice(
    build: PatchBuilder,
    at: Path,
    body: ContainerView,
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


def _wants_doctor(pod: PodView) -> bool:
    return pod.annotations.get(DOCTOR_ANNOTATION, "").lower() in ("true", "enabled")


def _add_doctor(
    build: PatchBuilder,
    doctor: Doctor,
    gpus: Mapping[str, int],
    rdma: Mapping[str, str],
    claims: Sequence[str] = (),
) -> None:
    """`rdmaplane doctor` as the first init container, with the largest container's GPUs and
    RDMA devices (the kubelet hands them on to the app containers) or DRA claims (shared with
    it), IPC_LOCK and /dev/shm."""
    spec = _now(build)
    if any(c.name == DOCTOR_CONTAINER for c in spec.init_containers or ()):
        return
    limits = {**{n: str(k) for n, k in gpus.items()}, **rdma}
    container: dict[str, Json] = {
        "name": DOCTOR_CONTAINER,
        "image": doctor.image,
        "command": ["rdmaplane"],
        "args": list(doctor.args),
        "resources": {"limits": limits} if limits or not claims else {},
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
    if claims:
        container["resources"]["claims"] = [{"name": n} for n in claims]
    if shm is not None:
        container["volumeMounts"] = [{"name": shm.name, "mountPath": SHM_PATH}]
    build.insert(("spec", "initContainers"), container, 0)


def _warnings(spec: SpecView, hca: str) -> Iterator[str]:
    """What the webhook will not fix: device directories mounted from the host (they bypass
    the device cgroup, so NCCL/UCX see HCAs the pod was not given), privileged containers, and
    extended-resource requests the API server refuses after admission (`core.pod`: a request
    without a limit, or other than it; such a container's devices are counted by its limits)."""
    for where, why in spec.faults():
        yield f"{where}: {why}"
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
