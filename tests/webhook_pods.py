"""Random valid pods for the webhook's property tests (unit and e2e), and the checks they share.

The pods are valid as the API server sees them: unique container, volume and mount names,
mounts that name a volume, extended-resource requests equal to their limits, canonical
quantities (so the API server's normalisation changes nothing). They lean towards what the
webhook must get right: GPUs or not, RDMA resources the user set, capabilities and privileged,
their own /dev/shm, annotation volumes, and names the webhook would like to use itself.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

GPU, HCA, SHARED = "nvidia.com/gpu", "rdmaplane.io/hca", "rdmaplane.io/hca-shared"
NAMES = st.sampled_from(["main", "worker", "trainer", "sidecar", "init", "warmup", "log"])
MEMORY = st.sampled_from(["512Mi", "16Gi", "64Gi", "1Ti"])
CAPS = st.lists(
    st.sampled_from(["NET_ADMIN", "IPC_LOCK", "SYS_PTRACE", "CAP_IPC_LOCK"]),
    min_size=1,  # an empty list comes back from the API server as no key at all
    max_size=2,
    unique=True,
)
VOLUMES: dict[str, dict[str, Any]] = {
    "data": {"emptyDir": {}},
    "dshm": {"emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
    "rdmaplane-shm": {"emptyDir": {}},  # the webhook's name, taken by the user for something else
    "podinfo": {
        "downwardAPI": {
            "items": [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
        }
    },
    "labels": {
        "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}
    },
    "ib": {"hostPath": {"path": "/dev/infiniband"}},
}
MOUNT_PATHS = ["/data", "/dev/shm", "/etc/podinfo", "/etc/labels", "/dev/infiniband", "/work/a~b"]


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.booleans()) and draw(st.booleans()):
        return None
    limits: dict[str, str] = {}
    gpus = draw(st.sampled_from([0, 0, 1, 2, 4, 8]))
    if gpus:
        limits[GPU] = str(gpus)
    user_rdma = draw(st.sampled_from([None, None, None, HCA, SHARED]))
    if user_rdma:
        limits[user_rdma] = str(draw(st.integers(1, 4)))
    if draw(st.booleans()):
        limits["memory"] = draw(MEMORY)
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if draw(st.booleans()):  # requests: the extended resources equal to limits, plus cpu
        requests = {k: v for k, v in limits.items() if k != "memory" and draw(st.booleans())}
        requests["cpu"] = draw(st.sampled_from(["100m", "2", "16"]))
        out["requests"] = requests
    return out


@st.composite
def container(draw: st.DrawFn, name: str, volumes: list[str]) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "registry.example/train:1"}
    res = draw(resources())
    if res is not None:
        c["resources"] = res
    if draw(st.booleans()):
        ctx: dict[str, Any] = {}
        if draw(st.booleans()):
            ctx["privileged"] = draw(st.booleans())
        if draw(st.booleans()):
            ctx["capabilities"] = {"add": draw(CAPS), "drop": ["ALL"]}
        c["securityContext"] = ctx
    mounts = []
    paths = draw(st.lists(st.sampled_from(MOUNT_PATHS), unique=True, max_size=3))
    for path in paths:
        if volumes:
            mounts.append({"name": draw(st.sampled_from(volumes)), "mountPath": path})
    if mounts:
        c["volumeMounts"] = mounts
    if draw(st.booleans()):
        c["env"] = [{"name": "NCCL_DEBUG", "value": "INFO"}]
    return c


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    volume_names = draw(st.lists(st.sampled_from(sorted(VOLUMES)), unique=True, max_size=4))
    names = draw(st.lists(NAMES, unique=True, min_size=1, max_size=4))
    n_init = draw(st.integers(0, len(names) - 1))
    spec: dict[str, Any] = {
        "containers": [draw(container(n, volume_names)) for n in names[n_init:]],
    }
    if n_init:
        spec["initContainers"] = [draw(container(n, volume_names)) for n in names[:n_init]]
    if volume_names:
        spec["volumes"] = [{"name": n, **VOLUMES[n]} for n in volume_names]
    if draw(st.booleans()):
        spec["nodeSelector"] = {"node.example/class": draw(st.sampled_from(["h100", "a100"]))}
    metadata: dict[str, Any] = {"name": "p"}
    annotations = {}
    mode = draw(st.sampled_from([None, "auto", "exclusive", "shared", "off"]))
    if mode:
        annotations["rdmaplane.io/rdma"] = mode
    if draw(st.booleans()):
        annotations["rdmaplane.io/doctor"] = "true"
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def contains(original: Any, result: Any, where: str = "") -> None:
    """Every value in `original` is in `result`, unchanged (lists: as a prefix; the doctor's
    init container, inserted first, is skipped)."""
    if isinstance(original, dict):
        assert isinstance(result, dict), where
        for key, value in original.items():
            assert key in result, f"{where}/{key} was removed"
            contains(value, result[key], f"{where}/{key}")
    elif isinstance(original, list):
        assert isinstance(result, list), where
        if (
            where.endswith("/initContainers")
            and result
            and result[0].get("name") == "rdmaplane-doctor"
        ):
            result = result[1:]
        assert len(result) >= len(original), f"{where} lost items"
        for i, item in enumerate(original):
            contains(item, result[i], f"{where}/{i}")
    else:
        assert original == result, f"{where}: {original!r} became {result!r}"


def assert_rdma_ready(pod: dict[str, Any], pool: str, count: str) -> None:
    """`pod` as the API server stored it after the webhook: its first container has `count`
    of `pool` (limits, and requests defaulted from them), IPC_LOCK, a memory /dev/shm sized to
    its memory limit (`gpu_pod`'s 64Gi) and the pod's annotations as the fault notice's file."""
    c = pod["spec"]["containers"][0]
    assert c["resources"]["limits"][pool] == count
    assert c["resources"]["requests"][pool] == count  # defaulted from the limit by the API server
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": "64Gi",
    }
    notice = volumes[mounts["/etc/podinfo"]["name"]]["downwardAPI"]["items"][0]
    assert notice["fieldRef"]["fieldPath"] == "metadata.annotations"
    assert {"name": "RDMAPLANE_ANNOTATIONS_FILE", "value": "/etc/podinfo/annotations"} in c["env"]


def assert_left_alone(pod: dict[str, Any]) -> None:
    """`pod` as stored has nothing of the webhook's: no volume but the API token's, no
    securityContext (the pods here set none)."""
    assert all(v["name"].startswith("kube-api-access") for v in pod["spec"].get("volumes", []))
    assert all("securityContext" not in c for c in pod["spec"]["containers"])


def gpu_pod(
    name: str, gpus: str = "8", annotations: dict[str, str] | None = None, **container: Any
) -> dict[str, Any]:
    """A pod with one container asking for `gpus` GPUs and 64 GiB (extra container keys as
    keyword arguments)."""
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    c = {
        "name": "train",
        "image": "registry.example/train:1",
        "resources": {"limits": {GPU: gpus, "memory": "64Gi"}},
        **container,
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [c]}}


def cpu_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]},
    }


def admission_review(obj: Any, operation: str = "CREATE", kind: str = "Pod") -> dict[str, Any]:
    """An AdmissionReview as the API server sends it for `obj`."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0f7c1d6e",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": operation,
            "namespace": "team-a",
            "object": obj,
        },
    }


def pod(
    *containers: dict[str, Any],
    annotations: dict[str, str] | None = None,
    namespace: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A Pod named p with `containers`, as the unit tests build one."""
    meta: dict[str, Any] = {"name": "p"}
    if namespace is not None:
        meta["namespace"] = namespace
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": list(containers), **spec},
    }


def gpu(name: str = "main", n: str = "8", **extra: Any) -> dict[str, Any]:
    """A container asking `n` GPUs in limits."""
    return {"name": name, "image": "x", "resources": {"limits": {GPU: n}}, **extra}
