"""The admission webhook called by the real kube-apiserver over TLS.

The MutatingWebhookConfiguration is deploy/webhook/webhook.yaml as shipped, its clientConfig
pointed at a `rdmaplane webhook` process on loopback (`url`). The process runs as the
webhook's ServiceAccount under deploy/webhook/rbac.yaml (its Role, the Secret made empty for
it, the policy that leaves it only the caBundle), makes its own CA and serving certificate in
that Secret and writes the caBundle itself. Tests run in file order: the last one stops the
webhook.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import ssl
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from lightkube import ApiError, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration
from lightkube.resources.core_v1 import Secret

from rdmaplane.adapters.kube import sync_client
from rdmaplane.core.settings.webhook import InjectPolicy
from rdmaplane.services.webhook.policy import inject
from tests.e2e.controlplane import KubeCluster, poll_until
from tests.webhook_pods import (
    GPU,
    HCA,
    SHARED,
    admission_review,
    assert_left_alone,
    assert_rdma_ready,
    contains,
    cpu_pod,
    gpu_pod,
    pods,
)
from tests.webhook_server import (
    MWC,
    NAMESPACE,
    SECRET,
    WebhookProcess,
    ca_bundle,
    ca_from_secret,
    create,
    deployed_webhook,
    empty_secret,
    webhook_namespaces,
)


@dataclass
class Env:
    process: WebhookProcess
    opted_in: str
    plain: str
    ca_file: Path


@pytest.fixture(scope="module")
def env(kube_cluster: KubeCluster) -> Iterator[Env]:
    config = {"doctor": {"image": "registry.example/rdmaplane:test"}}
    with (
        deployed_webhook(kube_cluster, config) as (process, ca_file),
        webhook_namespaces(kube_cluster) as (opted_in, plain),
    ):
        yield Env(process, opted_in, plain, ca_file)


def test_opted_in_namespace_gpu_pod_is_made_rdma_ready(kube_cluster: KubeCluster, env: Env) -> None:
    with kube_cluster.client() as client:
        pod = create(client, env.opted_in, gpu_pod("trainer"))
        plain = create(
            client,
            env.opted_in,
            cpu_pod("web"),
        )
    assert_rdma_ready(pod, HCA, "8")
    assert_left_alone(plain)


def test_other_namespaces_only_when_the_pod_asks(kube_cluster: KubeCluster, env: Env) -> None:
    with kube_cluster.client() as client:
        untouched = create(client, env.plain, gpu_pod("a"))
        shared = create(client, env.plain, gpu_pod("b", "2", {"rdmaplane.io/rdma": "shared"}))
        off = create(client, env.opted_in, gpu_pod("c", annotations={"rdmaplane.io/rdma": "off"}))
    assert HCA not in untouched["spec"]["containers"][0]["resources"]["limits"]
    assert "securityContext" not in untouched["spec"]["containers"][0]
    assert shared["spec"]["containers"][0]["resources"]["limits"][SHARED] == "1"
    assert set(off["spec"]["containers"][0]["resources"]["limits"]) == {GPU, "memory"}


def _calls(env: Env) -> float:
    """How many admission requests the webhook has answered (its own counter)."""
    context = ssl.create_default_context(cafile=str(env.ca_file))
    text = httpx.get(f"{env.process.url}/metrics", verify=context, timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("rdmaplane_webhook_requests_total{")
    )


def _claims_only(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A DRA pod: its devices through a claim, no GPU in limits."""
    obj = cpu_pod(name)
    if annotations:
        obj["metadata"]["annotations"] = annotations
    obj["spec"]["resourceClaims"] = [
        {"name": "gpus-nics", "resourceClaimTemplateName": "gpu-nic-pcie-x1"}
    ]
    obj["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus-nics"}]}
    return obj


def _requests_only(name: str) -> dict[str, Any]:
    obj = gpu_pod(name)
    obj["spec"]["containers"][0]["resources"] = {"requests": {GPU: "8"}}
    return obj


@pytest.mark.parametrize(
    ("where", "obj"),
    [
        ("opted_in", gpu_pod("call-limits")),
        ("opted_in", _requests_only("call-requests")),
        ("opted_in", gpu_pod("call-off", annotations={"rdmaplane.io/rdma": "off"})),
        ("plain", gpu_pod("call-plain")),
        ("plain", gpu_pod("call-asked", annotations={"rdmaplane.io/rdma": "auto"})),
        ("kube-system", gpu_pod("call-system", annotations={"rdmaplane.io/rdma": "exclusive"})),
        ("opted_in", cpu_pod("call-cpu")),
        ("opted_in", _claims_only("call-claims")),
        ("plain", _claims_only("call-claims-plain")),
        ("plain", _claims_only("call-claims-asked", {"rdmaplane.io/rdma": "auto"})),
        ("opted_in", _claims_only("call-claims-off", {"rdmaplane.io/rdma": "off"})),
    ],
    ids=lambda v: v if isinstance(v, str) else v["metadata"]["name"],
)
def test_the_preview_knows_which_pods_the_api_server_sends(
    kube_cluster: KubeCluster, env: Env, where: str, obj: dict[str, Any]
) -> None:
    """`rdmaplane inject`'s rule (`inject.not_sent`) against the real API server evaluating
    deploy/webhook/webhook.yaml's namespaceSelector and matchConditions: the webhook's own
    request counter moves exactly when the rule says the pod is sent."""
    namespace = {"opted_in": env.opted_in, "plain": env.plain}.get(where, where)
    why = inject.not_sent(obj, namespace, where == "opted_in", InjectPolicy())
    before = _calls(env)
    with kube_cluster.client() as client, contextlib.suppress(ApiError):
        create(client, namespace, obj, dry_run=True)  # requests only: refused after admission
    assert (_calls(env) > before) == (why is None), why


def _resubmittable(pod: dict[str, Any]) -> dict[str, Any]:
    """The admitted pod as a client would send it again (no server-owned fields, no token
    volume: the ServiceAccount plugin adds that one again)."""
    meta = {
        k: pod["metadata"][k] for k in ("name", "annotations", "labels") if k in pod["metadata"]
    }
    spec = copy.deepcopy(pod["spec"])
    spec.pop("nodeName", None)
    spec["volumes"] = [
        v for v in spec.get("volumes", []) if not v["name"].startswith("kube-api-access")
    ]
    for c in spec["containers"] + spec.get("initContainers", []):
        c["volumeMounts"] = [
            m for m in c.get("volumeMounts", []) if not m["name"].startswith("kube-api-access")
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def test_a_second_pass_changes_nothing(kube_cluster: KubeCluster, env: Env) -> None:
    with kube_cluster.client() as client:
        first = create(
            client,
            env.opted_in,
            gpu_pod("twice", annotations={"rdmaplane.io/doctor": "true"}),
            dry_run=True,
        )
        again = _resubmittable(first)
        second = create(client, env.opted_in, again, dry_run=True)
    assert first["spec"]["initContainers"][0]["name"] == "rdmaplane-doctor"
    assert _resubmittable(second) == again
    reply = httpx.post(
        f"{env.process.url}/mutate",
        json=admission_review(first),
        verify=ssl.create_default_context(cafile=str(env.ca_file)),
    )
    assert reply.json()["response"] == {"uid": "0f7c1d6e", "allowed": True}


def test_a_dra_pod_gets_ipc_lock_and_shm_and_no_device_plugin_resources(
    kube_cluster: KubeCluster, env: Env
) -> None:
    """Issue 40's pod: claims for its GPUs and NICs and `nvidia.com/gpu: 8` besides: admitted
    with IPC_LOCK and /dev/shm, and no `rdmaplane.io/hca` (it would ask for NICs twice)."""
    obj = _claims_only("dra-twice")
    obj["spec"]["containers"][0]["resources"]["limits"] = {GPU: "8"}
    with kube_cluster.client() as client:
        out = create(client, env.opted_in, obj, dry_run=True)
        claims_only = create(client, env.opted_in, _claims_only("dra-only"), dry_run=True)
    for pod in (out, claims_only):
        (c,) = pod["spec"]["containers"]
        assert not {HCA, SHARED} & set(c["resources"].get("limits", {}))
        assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        assert "/dev/shm" in [m["mountPath"] for m in c["volumeMounts"]]


def test_warnings_reach_the_client(kube_cluster: KubeCluster, env: Env) -> None:
    pod = gpu_pod(
        "risky",
        securityContext={"privileged": True},
        volumeMounts=[{"name": "ib", "mountPath": "/dev/infiniband"}],
    )
    pod["spec"]["volumes"] = [{"name": "ib", "hostPath": {"path": "/dev/infiniband"}}]
    url = f"{kube_cluster.server}/api/v1/namespaces/{env.opted_in}/pods?dryRun=All"
    reply = httpx.post(url, json=pod, verify=kube_cluster.tls_context(), timeout=30)
    assert reply.status_code == 201, reply.text
    warnings = reply.headers.get_list("warning")
    assert any("privileged" in w for w in warnings), warnings
    assert any("bypasses the device cgroup" in w for w in warnings), warnings


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(pods())
def test_random_pods_pass_the_api_servers_validation(
    kube_cluster: KubeCluster, env: Env, obj: dict[str, Any]
) -> None:
    """Admitted by the real API server (webhook, patch, defaulting, validation; dry run):
    every field the user set is still there, and GPU containers got what they need."""
    with kube_cluster.client() as client:
        out = create(client, env.opted_in, obj, dry_run=True)
    contains(obj["spec"], out["spec"], "spec")
    if obj["metadata"].get("annotations", {}).get("rdmaplane.io/rdma") == "off":
        return
    for c in out["spec"]["containers"] + out["spec"].get("initContainers", []):
        limits = c.get("resources", {}).get("limits", {})
        if GPU in limits:
            assert HCA in limits or SHARED in limits
            assert "/dev/shm" in [m["mountPath"].rstrip("/") for m in c["volumeMounts"]]


def test_two_replicas_agree_on_one_certificate_and_the_server_follows(
    kube_cluster: KubeCluster, env: Env
) -> None:
    """Two bootstraps racing on the empty Secret (as two replicas starting together on a fresh
    install) end with one certificate in it and its CA in caBundle; the running webhook loads
    the new certificate and the API server keeps admitting through it."""
    import asyncio

    from rdmaplane.adapters.kube import async_client
    from rdmaplane.core.settings.webhook import Tls
    from rdmaplane.services.webhook.tls import SecretCerts

    identity = kube_cluster.kubeconfig_for(f"system:serviceaccount:{NAMESPACE}:rdmaplane-webhook")

    async def race(workdir: Path) -> list[str]:
        clients = [async_client(identity) for _ in range(2)]
        tls = [
            Tls(
                secret_name=SECRET,
                secret_namespace=NAMESPACE,
                webhook_configuration=MWC,
                hosts=("127.0.0.1",),
                cert_dir=workdir / str(i),
            )
            for i in range(2)
        ]
        try:
            served = await asyncio.gather(
                *(SecretCerts(c, t).fetch() for c, t in zip(clients, tls, strict=True))
            )
        finally:
            for c in clients:
                await c.close()
        return [s.fingerprint for s in served]

    with kube_cluster.client() as client:
        empty_secret(client)
        fingerprints = asyncio.run(race(kube_cluster.workdir / f"race-{uuid.uuid4().hex[:6]}"))
        assert fingerprints[0] == fingerprints[1]
        new_ca = ca_from_secret(client, env.ca_file)
        assert new_ca is not None
        assert ca_bundle(client) == env.ca_file.read_bytes()

        def admitted() -> bool:
            try:
                pod = create(
                    client, env.opted_in, gpu_pod(f"after-{uuid.uuid4().hex[:4]}"), dry_run=True
                )
            except ApiError:
                return False  # the old certificate until the webhook's next check
            return HCA in pod["spec"]["containers"][0]["resources"]["limits"]

        poll_until(admitted, 60, "admission with the new certificate")
    assert "serving a new certificate" in env.process.log_text()


def _as_webhook(kube_cluster: KubeCluster) -> Client:
    identity = kube_cluster.kubeconfig_for(f"system:serviceaccount:{NAMESPACE}:rdmaplane-webhook")
    return sync_client(identity)


# Changes to its MutatingWebhookConfiguration a compromised webhook would want, beside caBundle.
WIDENINGS: list[tuple[str, Callable[[Any], None]]] = [
    (
        "drop the kube-system exclusion",
        lambda m: m.webhooks[0].namespaceSelector.matchExpressions.pop(),
    ),
    ("failurePolicy Ignore", lambda m: setattr(m.webhooks[0], "failurePolicy", "Ignore")),
    ("pod updates too", lambda m: m.webhooks[0].rules[0].operations.append("UPDATE")),
    ("drop the matchConditions", lambda m: setattr(m.webhooks[1], "matchConditions", None)),
    ("drop an entry", lambda m: m.webhooks.pop()),
    ("another URL", lambda m: setattr(m.webhooks[0].clientConfig, "url", "https://x.invalid/m")),
    ("a label", lambda m: setattr(m.metadata, "labels", {"x": "y"})),
]


def test_the_webhook_may_change_only_its_ca_bundle_and_own_secret(
    kube_cluster: KubeCluster, env: Env
) -> None:
    """Its rights as deploy/webhook/rbac.yaml narrows them: the caBundle of its own
    configuration and its one pre-made Secret; no other change to the configuration (the
    policy), no Secret of its own making (the Role has no `create`)."""
    with _as_webhook(kube_cluster) as webhook:

        def refused(widen: Callable[[Any], None]) -> str:
            mwc = webhook.get(MutatingWebhookConfiguration, MWC)
            widen(mwc)
            try:
                webhook.replace(mwc)
            except ApiError as e:
                return e.status.message or ""
            return "done"

        first = WIDENINGS[0][1]  # the policy takes effect once the API server's informer has it
        poll_until(lambda: "may change only the caBundle" in refused(first), 30, "the policy")
        for what, widen in WIDENINGS:
            message = refused(widen)
            assert "may change only the caBundle" in message, (what, message)
        current = webhook.get(MutatingWebhookConfiguration, MWC)
        bundle = base64.b64decode(current.webhooks[0].clientConfig.caBundle)
        for hook in current.webhooks:  # the same CA twice: still trusted, but a change
            hook.clientConfig.caBundle = base64.b64encode(bundle + bundle).decode()
        webhook.replace(current)
        with pytest.raises(ApiError) as refused:
            webhook.create(Secret(metadata=ObjectMeta(name="other", namespace=NAMESPACE)))
        assert refused.value.status.code == 403
        with pytest.raises(ApiError) as refused:
            webhook.get(MutatingWebhookConfiguration, "someone-elses")
        assert refused.value.status.code == 403
        assert webhook.get(Secret, SECRET, namespace=NAMESPACE).data
    poll_until(lambda: _ca_bundle_written(kube_cluster), 60, "the webhook's own caBundle back")


def _ca_bundle_written(kube_cluster: KubeCluster) -> bool:
    """The webhook's next check writes its one CA back."""
    with kube_cluster.client() as client:
        hooks = client.get(MutatingWebhookConfiguration, MWC).webhooks or []
        ca = base64.b64decode(client.get(Secret, SECRET, namespace=NAMESPACE).data["ca.crt"])
        return all(base64.b64decode(h.clientConfig.caBundle or "") == ca for h in hooks)


def test_with_the_webhook_down_only_opted_in_gpu_pods_are_refused(
    kube_cluster: KubeCluster, env: Env
) -> None:
    env.process.stop()
    with kube_cluster.client() as client:
        with pytest.raises(ApiError) as refused:
            create(client, env.opted_in, gpu_pod("refused"), dry_run=True)
        message = refused.value.status.message or ""
        assert 'failed calling webhook "namespace.inject.rdmaplane.io"' in message, message
        with pytest.raises(ApiError):
            create(
                client,
                env.plain,
                gpu_pod("asked", annotations={"rdmaplane.io/rdma": "auto"}),
                dry_run=True,
            )
        create(client, env.plain, gpu_pod("other-namespace"), dry_run=True)
        create(
            client,
            env.opted_in,
            cpu_pod("cpu"),
            dry_run=True,
        )
        create(
            client,
            env.opted_in,
            gpu_pod("out", annotations={"rdmaplane.io/rdma": "off"}),
            dry_run=True,
        )
        annotated = gpu_pod("system", annotations={"rdmaplane.io/rdma": "exclusive"})
        create(client, "kube-system", annotated, dry_run=True)  # exempt
