"""The webhook on the DRA path (`services/webhook/policy/dra.py` through `inject.mutate`): a pod
with claims is never given device-plugin resources and, opted in, gets IPC_LOCK and /dev/shm;
a GPU pod headed to a DRA pool (by its nodeSelector, its required node affinity or its
namespace, as the settings say) gets the claim its GPU count needs, its GPU count moved into
it; a count no template serves keeps the device-plugin path, with a warning. Patches are
applied by an independent RFC 6902 implementation (jsonpatch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from rdmaplane.adapters.config.base import validate
from rdmaplane.core.settings.webhook import CLAIM_TEMPLATES, InjectPolicy, WebhookSettings
from rdmaplane.services.webhook.policy import inject
from tests import webhook_pods
from tests.webhook_pods import GPU, HCA, gpu

REPO = Path(__file__).resolve().parents[2]
POLICY = InjectPolicy()
DRA_NODES = {"rdmaplane.io/kubelet-plugin": "dra"}
CLAIM = "rdmaplane-gpus-nics"


def pod(*containers: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return webhook_pods.pod(*containers, namespace="team", **kwargs)


def claimed(
    name: str = "main", claims: tuple[str, ...] = ("gpus-nics",), **extra: Any
) -> dict[str, Any]:
    resources = extra.pop("resources", {})
    return {
        "name": name,
        "image": "x",
        "resources": {**resources, "claims": [{"name": c} for c in claims]},
        **extra,
    }


def applied(
    obj: dict[str, Any], policy: InjectPolicy = POLICY, namespace: str | None = None
) -> dict[str, Any]:
    result = inject.mutate(obj, policy, namespace)
    out: dict[str, Any] = jsonpatch.apply_patch(obj, result.patch)
    assert out == result.pod
    return out


def caps(c: dict[str, Any]) -> list[str]:
    return list(c.get("securityContext", {}).get("capabilities", {}).get("add", []))


def mounts(c: dict[str, Any]) -> list[str]:
    return [m["mountPath"] for m in c.get("volumeMounts", [])]


TEMPLATE_CLAIMS = [{"name": "gpus-nics", "resourceClaimTemplateName": "gpu-nic-node-x8"}]


def test_a_pod_with_claims_and_gpus_is_never_given_device_plugin_resources() -> None:
    """Issue 40's case: claims for GPUs and NICs, and `nvidia.com/gpu: 8` (served by DRA
    through the DeviceClass): no `rdmaplane.io/hca` beside them, but IPC_LOCK and /dev/shm."""
    c = claimed(resources={"limits": {GPU: "8", "memory": "64Gi"}})
    out = applied(pod(c, resourceClaims=TEMPLATE_CLAIMS))
    got = out["spec"]["containers"][0]
    assert set(got["resources"]["limits"]) == {GPU, "memory"}
    assert got["resources"]["claims"] == [{"name": "gpus-nics"}]
    assert caps(got) == ["IPC_LOCK"]
    assert "/dev/shm" in mounts(got) and "/etc/podinfo" in mounts(got)
    assert out["spec"]["resourceClaims"] == TEMPLATE_CLAIMS


def test_a_claims_only_pod_that_opted_in_gets_ipc_lock_and_shm_in_the_containers_using_them() -> (
    None
):
    sidecar = {"name": "log", "image": "x"}
    obj = pod(
        claimed(),
        sidecar,
        resourceClaims=TEMPLATE_CLAIMS,
        annotations={"rdmaplane.io/rdma": "auto"},
    )
    out = applied(obj)
    main, log = out["spec"]["containers"]
    assert caps(main) == ["IPC_LOCK"] and "/dev/shm" in mounts(main)
    assert log == sidecar
    assert "resources" not in out["spec"]["containers"][0] or HCA not in str(main["resources"])
    # a second pass adds nothing
    assert inject.mutate(out, POLICY).patch == []


def test_opted_out_or_claims_nobody_uses_change_nothing() -> None:
    off = pod(claimed(), resourceClaims=TEMPLATE_CLAIMS, annotations={"rdmaplane.io/rdma": "off"})
    assert inject.mutate(off, POLICY).patch == []
    unused = pod({"name": "main", "image": "x"}, resourceClaims=TEMPLATE_CLAIMS)
    assert inject.mutate(unused, POLICY).patch == []


def test_the_api_server_sends_dra_pods_and_the_preview_agrees() -> None:
    obj = pod(claimed(), resourceClaims=TEMPLATE_CLAIMS)
    assert inject.not_sent(obj, "team", True, POLICY) is None
    assert inject.not_sent(obj, "team", False, POLICY) is not None  # not annotated
    assert "resourceClaims" in str(
        inject.not_sent(pod({"name": "a", "image": "x"}), "team", True, POLICY)
    )
    conditions = yaml.safe_load((REPO / "deploy/webhook/webhook.yaml").read_text())["webhooks"]
    for hook in conditions:
        (asks,) = [c for c in hook["matchConditions"] if c["name"] == "asks-for-gpus"]
        assert "size(object.spec.resourceClaims) > 0" in asks["expression"]


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_a_gpu_pod_selecting_dra_nodes_gets_the_claim_of_its_size(gpus: int) -> None:
    c = gpu(
        n=str(gpus),
        resources={"limits": {GPU: str(gpus), "memory": "16Gi"}, "requests": {GPU: str(gpus)}},
    )
    out = applied(pod(c, nodeSelector=DRA_NODES))
    want = next(t.name for t in CLAIM_TEMPLATES if t.gpus == gpus)
    assert out["spec"]["resourceClaims"] == [{"name": CLAIM, "resourceClaimTemplateName": want}]
    got = out["spec"]["containers"][0]
    assert got["resources"] == {
        "limits": {"memory": "16Gi"},
        "requests": {},
        "claims": [{"name": CLAIM}],
    }
    assert caps(got) == ["IPC_LOCK"] and "/dev/shm" in mounts(got)
    again = inject.mutate(out, POLICY)
    assert again.patch == [] and again.warnings == []


def test_the_pool_by_required_node_affinity_or_namespace() -> None:
    term = {
        "matchExpressions": [
            {"key": "rdmaplane.io/kubelet-plugin", "operator": "In", "values": ["dra"]}
        ]
    }
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    assert "resourceClaims" in applied(pod(gpu(), affinity=affinity))["spec"]
    loose = {
        **term,
        "matchExpressions": [{**term["matchExpressions"][0], "values": ["dra", "deviceplugin"]}],
    }
    affinity_loose = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [loose]}
        }
    }
    assert "resourceClaims" not in applied(pod(gpu(), affinity=affinity_loose))["spec"]
    policy = validate(
        WebhookSettings,
        {"dra": {"pools": [{"name": "h100", "nodeSelector": {}, "namespaces": ["team-dra"]}]}},
    )
    assert "resourceClaims" in applied(pod(gpu()), policy, "team-dra")["spec"]
    out = applied(pod(gpu()), policy, "team")
    assert (
        "resourceClaims" not in out["spec"]
        and out["spec"]["containers"][0]["resources"]["limits"][HCA] == "8"
    )


def test_a_count_no_template_serves_keeps_the_device_plugin_path_and_says_so() -> None:
    result = inject.mutate(pod(gpu(n="3"), nodeSelector=DRA_NODES), POLICY)
    out = jsonpatch.apply_patch(pod(gpu(n="3"), nodeSelector=DRA_NODES), result.patch)
    assert out["spec"]["containers"][0]["resources"]["limits"] == {GPU: "3", HCA: "3"}
    assert any("no claim template" in w and "extendedResourceName" in w for w in result.warnings)


def test_shared_mode_and_other_pods_are_not_converted() -> None:
    shared = applied(
        pod(gpu(), nodeSelector=DRA_NODES, annotations={"rdmaplane.io/rdma": "shared"})
    )
    assert "resourceClaims" not in shared["spec"]
    warned = inject.mutate(
        pod(gpu(), nodeSelector=DRA_NODES, annotations={"rdmaplane.io/rdma": "shared"}), POLICY
    ).warnings
    assert any("shared mode" in w and "share-templates.yaml" in w for w in warned), warned
    elsewhere = applied(pod(gpu(), nodeSelector={"node.example/pool": "a"}))
    assert "resourceClaims" not in elsewhere["spec"]
    off = validate(WebhookSettings, {"dra": {"enabled": False}})
    assert "resourceClaims" not in applied(pod(gpu(), nodeSelector=DRA_NODES), off)["spec"]


def test_two_gpu_containers_get_a_claim_each_and_the_doctor_shares_the_largest() -> None:
    obj = pod(
        gpu("a", "8"),
        gpu("b", "1"),
        nodeSelector=DRA_NODES,
        annotations={"rdmaplane.io/doctor": "true"},
    )
    out = applied(obj)
    assert [c["resourceClaimTemplateName"] for c in out["spec"]["resourceClaims"]] == [
        "gpu-nic-node-x8",
        "gpu-nic-pcie-x1",
    ]
    a, b = out["spec"]["containers"]
    assert a["resources"]["claims"] == [{"name": CLAIM}]
    assert b["resources"]["claims"] == [{"name": f"{CLAIM}-2"}]
    doctor = out["spec"]["initContainers"][0]
    assert doctor["name"] == "rdmaplane-doctor"
    assert doctor["resources"] == {"claims": [{"name": CLAIM}]}
    assert caps(doctor) == ["IPC_LOCK"]


def test_settings_refuse_a_pool_with_no_way_to_know_it_and_two_templates_of_one_size() -> None:
    with pytest.raises(Exception, match="labels or its namespaces"):
        validate(WebhookSettings, {"dra": {"pools": [{"name": "x", "nodeSelector": {}}]}})
    twice = [{"gpus": 1, "name": "a"}, {"gpus": 1, "name": "b"}]
    with pytest.raises(Exception, match="one template per GPU count"):
        validate(WebhookSettings, {"dra": {"pools": [{"claimTemplates": twice}]}})


def template_gpus(template: dict[str, Any]) -> int | None:
    """The GPUs a ResourceClaimTemplate asks of NVIDIA's class: the sum of its GPU requests'
    counts (`ExactCount`, 1 when unsaid; a `firstAvailable` request by its first alternative,
    the one it prefers). None when a GPU request is `allocationMode: All`: every GPU of the node
    it lands on, so no fixed count: such a template (`gpu-nic-node`) serves a GPU count only in
    a pool whose every node has that many GPUs, which a pool's own table can say and the
    default table, for any DRA node, cannot. `gpu-nic-node-x8` (every compute NIC, `count: 8`
    GPUs) is the whole node the default table names for 8."""
    total = 0
    for r in template["spec"]["spec"]["devices"]["requests"]:
        asked = r.get("exactly") or (r.get("firstAvailable") or [{}])[0]
        if asked.get("deviceClassName") != "gpu.nvidia.com":
            continue
        if asked.get("allocationMode") == "All":
            return None
        total += int(asked.get("count", 1))
    return total


def test_the_default_table_names_shipped_templates() -> None:
    """The webhook refers to deploy/dra/claim-templates.yaml by name: every default names one
    of its templates whose GPU count (`template_gpus`: fixed, not `All`) is the entry's, and
    the table serves every GPU count the shipped templates have a fixed size for."""
    shipped = {
        d["metadata"]["name"]: d
        for d in yaml.safe_load_all((REPO / "deploy/dra/claim-templates.yaml").read_text())
        if d and d.get("kind") == "ResourceClaimTemplate"
    }
    for t in CLAIM_TEMPLATES:
        assert t.name in shipped, f"{t.name} is not in deploy/dra/claim-templates.yaml"
        assert template_gpus(shipped[t.name]) == t.gpus, t.name
    sizes = {template_gpus(d) for d in shipped.values()} - {None}
    assert {t.gpus for t in CLAIM_TEMPLATES} == sizes
    assert template_gpus(shipped["gpu-nic-node"]) is None  # the whole node, any size
    assert [t.name for t in CLAIM_TEMPLATES] == [
        "gpu-nic-pcie-x1",
        "gpu-nic-pcie-x2",
        "gpu-nic-numa-x4",
        "gpu-nic-node-x8",
    ]
