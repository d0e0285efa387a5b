"""The webhook's patch builder: what it adds, what it never touches, and that a second pass
adds nothing. Patches are applied by an independent RFC 6902 implementation (jsonpatch)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane import IMAGE
from rdmaplane.adapters.config.base import validate
from rdmaplane.core import jsonpatch as jsonpatch_core
from rdmaplane.core.settings.webhook import InjectPolicy, WebhookSettings
from rdmaplane.services.webhook.policy import inject
from tests import resource_names as names
from tests.webhook_pods import GPU, HCA, SHARED, contains, gpu, pod, pods

CLASSES = {
    "nodeClasses": [
        {
            "name": "a100",
            "nodeSelector": {"node.example/class": "a100"},
            "hcasPerGpu": 0.5,
            "maxHcas": 4,
        }
    ]
}
POLICY = validate(WebhookSettings, CLASSES)
POLICY_DOCTOR = POLICY


def applied(obj: dict[str, Any], policy: InjectPolicy = POLICY) -> dict[str, Any]:
    result = inject.mutate(obj, policy)
    out: dict[str, Any] = jsonpatch.apply_patch(obj, result.patch)
    return out


def test_exclusive_gpu_pod_gets_everything() -> None:
    out = applied(pod(gpu(resources={"limits": {GPU: "8", "memory": "64Gi"}})))
    c = out["spec"]["containers"][0]
    assert c["resources"]["limits"][HCA] == "8"
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in out["spec"]["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    notice = volumes[mounts["/etc/podinfo"]]["downwardAPI"]["items"]
    assert notice == [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
    assert {"name": "RDMAPLANE_ANNOTATIONS_FILE", "value": "/etc/podinfo/annotations"} in c["env"]


def test_shared_mode_asks_one_slot_and_requests_follow_the_gpus() -> None:
    c = gpu(resources={"limits": {GPU: "2"}, "requests": {GPU: "2"}})
    out = applied(pod(c, annotations={"rdmaplane.io/rdma": "shared"}))
    res = out["spec"]["containers"][0]["resources"]
    assert res["limits"][SHARED] == "1" and res["requests"][SHARED] == "1"
    assert HCA not in res["limits"]


@pytest.mark.parametrize(
    ("gpus", "selector", "hcas"),
    [
        ("1", None, "1"),
        ("8", None, "8"),
        ("16", None, "8"),
        ("8", "a100", "4"),
        ("1", "a100", "1"),
        ("3", "a100", "2"),
    ],
)
def test_hcas_follow_the_node_class(gpus: str, selector: str | None, hcas: str) -> None:
    spec = {"nodeSelector": {"node.example/class": selector}} if selector else {}
    out = applied(pod(gpu(n=gpus), **spec))
    assert out["spec"]["containers"][0]["resources"]["limits"][HCA] == hcas


def test_a_request_the_user_set_is_never_changed() -> None:
    c = gpu(resources={"limits": {GPU: "8", SHARED: "1"}})
    out = applied(pod(c))
    assert out["spec"]["containers"][0]["resources"]["limits"] == {GPU: "8", SHARED: "1"}


def test_non_gpu_pods_and_opted_out_pods_are_untouched() -> None:
    plain = pod({"name": "web", "image": "nginx"})
    assert inject.mutate(plain, POLICY).patch == []
    off = pod(gpu(), annotations={"rdmaplane.io/rdma": "off"})
    assert inject.mutate(off, POLICY).patch == []


def test_unknown_mode_is_refused_with_the_choices() -> None:
    with pytest.raises(
        inject.PodError, match=r"rdmaplane.io/rdma: 'exclussive' is not one of auto"
    ):
        inject.mutate(pod(gpu(), annotations={"rdmaplane.io/rdma": "exclussive"}), POLICY)


def test_privileged_and_host_devices_are_warned_about_not_fixed() -> None:
    c = gpu(
        securityContext={"privileged": True},
        volumeMounts=[{"name": "ib", "mountPath": "/dev/infiniband"}],
    )
    obj = pod(c, volumes=[{"name": "ib", "hostPath": {"path": "/dev/infiniband/"}}])
    result = inject.mutate(obj, POLICY)
    assert any("privileged" in w for w in result.warnings)
    assert any("bypasses the device cgroup" in w for w in result.warnings)
    out = jsonpatch.apply_patch(obj, result.patch)
    assert out["spec"]["containers"][0]["securityContext"] == {"privileged": True}
    assert all(len(w) <= 256 for w in result.warnings)  # the API server truncates past 256


def test_capability_already_there_in_any_spelling() -> None:
    for caps in (["IPC_LOCK"], ["CAP_IPC_LOCK"], ["ALL"], ["ipc_lock"]):
        c = gpu(securityContext={"capabilities": {"add": caps}})
        out = applied(pod(c))
        assert out["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] == caps


def test_user_shm_and_user_annotation_volume_are_kept() -> None:
    c = gpu(
        volumeMounts=[
            {"name": "dshm", "mountPath": "/dev/shm/"},
            {"name": "meta", "mountPath": "/meta"},
        ]
    )
    meta = {
        "name": "meta",
        "projected": {
            "sources": [
                {
                    "downwardAPI": {
                        "items": [{"path": "a", "fieldRef": {"fieldPath": "metadata.annotations"}}]
                    }
                }
            ]
        },
    }
    obj = pod(c, volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory"}}, meta])
    out = applied(obj)
    assert out["spec"]["volumes"] == obj["spec"]["volumes"]
    assert out["spec"]["containers"][0]["volumeMounts"] == c["volumeMounts"]


def test_taken_volume_names_get_a_suffix() -> None:
    obj = pod(
        gpu(),
        volumes=[
            {"name": "rdmaplane-shm", "secret": {"secretName": "s"}},
            {"name": "podinfo", "configMap": {"name": "c"}},
        ],
    )
    out = applied(obj)
    names = [v["name"] for v in out["spec"]["volumes"]]
    assert names == ["rdmaplane-shm", "podinfo", "rdmaplane-shm-2", "podinfo-2"]


def test_notice_directory_taken_is_a_warning() -> None:
    c = gpu(volumeMounts=[{"name": "cfg", "mountPath": "/etc/podinfo"}])
    result = inject.mutate(pod(c, volumes=[{"name": "cfg", "emptyDir": {}}]), POLICY)
    assert any("/etc/podinfo is taken" in w for w in result.warnings)


def test_doctor_goes_first_with_the_largest_rdma_request() -> None:
    obj = pod(
        gpu("a", "2"),
        gpu("b", "4"),
        annotations={"rdmaplane.io/doctor": "true"},
        initContainers=[{"name": "setup", "image": "busybox"}],
    )
    out = applied(obj)
    doctor = out["spec"]["initContainers"][0]
    assert doctor["name"] == "rdmaplane-doctor"
    assert doctor["resources"]["limits"] == {GPU: "4", HCA: "4"}
    assert doctor["volumeMounts"][0]["mountPath"] == "/dev/shm"
    assert doctor["image"] == IMAGE  # rdmaplane's own, whose default user is not root:
    assert doctor["securityContext"]["runAsUser"] == 0  # IPC_LOCK is effective for root alone
    assert doctor["securityContext"]["capabilities"] == {"add": ["IPC_LOCK"]}
    assert out["spec"]["initContainers"][1]["name"] == "setup"


def test_pointer_escapes_rfc6901() -> None:
    assert jsonpatch_core.pointer("a/b", "m~n", 0) == "/a~1b/m~0n/0"


def test_strange_shapes_are_not_a_crash() -> None:
    for spec in ({"containers": None}, {"containers": [None, 3, {"resources": []}]}, []):
        assert inject.mutate({"metadata": None, "spec": spec}, POLICY).patch == []


@settings(max_examples=400, deadline=None)
@given(pods())
def test_patch_applies_keeps_user_fields_and_is_idempotent(obj: dict[str, Any]) -> None:
    before = copy.deepcopy(obj)
    mode = obj["metadata"].get("annotations", {}).get("rdmaplane.io/rdma")
    result = inject.mutate(obj, POLICY)
    assert obj == before, "the input was modified"
    assert all(op["op"] == "add" for op in result.patch)
    out = jsonpatch.apply_patch(obj, result.patch)
    assert out == result.pod
    contains(before, out)
    assert inject.mutate(out, POLICY).patch == []
    if mode == "off":
        assert result.patch == []
        return
    spec = out["spec"]
    for c in spec.get("initContainers", []) + spec["containers"]:
        limits = c.get("resources", {}).get("limits", {})
        if GPU not in limits:
            continue
        assert HCA in limits or SHARED in limits
        paths = [m["mountPath"].rstrip("/") for m in c.get("volumeMounts", [])]
        assert "/dev/shm" in paths
        assert len(paths) == len(set(paths))
        privileged = c.get("securityContext", {}).get("privileged") is True
        caps = c.get("securityContext", {}).get("capabilities", {}).get("add", [])
        assert privileged or {"IPC_LOCK", "CAP_IPC_LOCK"} & set(caps)
    volumes = [v["name"] for v in spec.get("volumes", [])]
    assert len(volumes) == len(set(volumes))
    for c in spec.get("initContainers", []) + spec["containers"]:
        assert {m["name"] for m in c.get("volumeMounts", [])} <= set(volumes)


def _policy(resources: dict[str, Any], **more: Any) -> InjectPolicy:
    return validate(WebhookSettings, {"resources": resources, **more})


RENAMED = _policy({"gpu": names.GPU, "hca": names.HCA, "hcaShared": names.SHARED}, **CLASSES)


@settings(max_examples=300, deadline=None)
@given(pods(), st.sampled_from(["exclusive", "shared"]))
def test_renamed_resources_get_the_same_patch_renamed(obj: dict[str, Any], mode: str) -> None:
    """Another GPU vendor and renamed pools: the patch and warnings the default names get,
    with the names swapped (the pod's `rdmaplane.io/rdma` annotation is no resource name)."""
    default = inject.mutate(obj, replace(POLICY, mode=mode))
    renamed = inject.mutate(names.renamed(obj), replace(RENAMED, mode=mode))
    assert renamed.patch == names.renamed(default.patch)
    assert renamed.warnings == names.renamed(default.warnings)


def test_two_gpu_vendors_on_one_cluster_both_get_rdma() -> None:
    """A webhook configured with both vendors' GPUs marks either kind of container, adds the
    first exclusive pool, and keeps a pool the user named among the configured ones."""
    both = _policy(
        {"gpu": [GPU, names.GPU], "hca": [HCA, names.HCA], "hcaShared": [SHARED, names.SHARED]},
        doctor={"enabled": True},
    )
    nvidia = gpu("a", "4")
    amd = {"name": "b", "image": "x", "resources": {"limits": {names.GPU: "2"}}}
    own = {"name": "c", "image": "x", "resources": {"limits": {names.GPU: "1", names.HCA: "3"}}}
    out = applied(pod(nvidia, amd, own, annotations={"rdmaplane.io/doctor": "true"}), both)
    limits = [c["resources"]["limits"] for c in out["spec"]["containers"]]
    assert limits == [{GPU: "4", HCA: "4"}, {names.GPU: "2", HCA: "2"}, own["resources"]["limits"]]
    doctor = out["spec"]["initContainers"][0]
    assert doctor["resources"]["limits"] == {GPU: "4", HCA: "4"}  # the largest RDMA request
    assert inject.not_sent(pod(amd), "team", True, both) is None
    assert "amd.com/gpu" not in str(inject.not_sent(pod(amd), "team", True, POLICY))


def test_a_request_the_api_server_refuses_is_warned_about_and_not_counted() -> None:
    """The one Pod model's rule: a container's GPUs are its limits. GPUs in requests alone (the
    API server refuses the pod after admission) get no RDMA resource and a warning naming the
    field; the other containers are patched as usual."""
    alone = {"name": "r", "image": "x", "resources": {"requests": {GPU: "8"}}}
    result = inject.mutate(pod(gpu("a", "2"), alone), POLICY)
    out = jsonpatch.apply_patch(pod(gpu("a", "2"), alone), result.patch)
    assert out["spec"]["containers"][0]["resources"]["limits"][HCA] == "2"
    assert out["spec"]["containers"][1]["resources"] == alone["resources"]
    assert any(
        w.startswith(f"spec.containers[1].resources.requests[{GPU}]: a request without a limit")
        for w in result.warnings
    )
    assert inject.not_sent(pod(alone), "team", True, POLICY) is not None
