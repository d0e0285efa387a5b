"""`rdmaplane webhook` as a real process on loopback, for the integration, e2e, node and bench
code; `deployed_webhook` installs it in a test cluster as deploy/webhook/ does."""

from __future__ import annotations

import base64
import contextlib
import copy
import ssl
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration
from lightkube.resources.core_v1 import Namespace, Pod, Secret, ServiceAccount

from rdmaplane.adapters.config.base import validate
from rdmaplane.core.resources import GPU, Vocabulary
from tests.e2e.controlplane import KubeCluster, Process, free_port, poll_until

__all__ = ["WebhookProcess", "deployed_webhook", "free_port", "start_webhook"]

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "webhook"
NAMESPACE = "rdmaplane"
SECRET = "rdmaplane-webhook-tls"
MWC = "rdmaplane-webhook"


@dataclass
class WebhookProcess:
    process: Process
    port: int

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.process.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.process.stop()


def start_webhook(
    workdir: Path,
    config: dict[str, Any],
    ca_file: Callable[[], Path | None],
    kubeconfig: Path | None = None,
    port: int | None = None,
    timeout: float = 90.0,
) -> WebhookProcess:
    """Start the webhook with `config` (a WebhookConfig as a dict) and wait until it answers
    /readyz over TLS trusting the CA file `ca_file()` returns (None: not there yet, as when
    the webhook makes its own CA). It dies with the test process."""
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / f"webhook-{port}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    args = ["-m", "rdmaplane", "webhook", "--config", str(config_file)]
    args += ["--host", "127.0.0.1", "--port", str(port)]
    if kubeconfig is not None:
        args += ["--kubeconfig", str(kubeconfig)]
    process = Process.start(Path(sys.executable), args, workdir / f"webhook-{port}.log")
    webhook = WebhookProcess(process, port)

    def ready() -> bool:
        ca = ca_file()
        return ca is not None and _ready(webhook.url, ca)

    process.wait_ready(ready, timeout)
    return webhook


def _ready(url: str, ca_file: Path) -> bool:
    with contextlib.suppress(httpx.HTTPError, OSError, ssl.SSLError):
        context = ssl.create_default_context(cafile=str(ca_file))
        return httpx.get(f"{url}/readyz", verify=context, timeout=2).status_code == 200
    return False


def apply_rbac(client: Client) -> None:
    client.apply(Namespace(metadata=ObjectMeta(name=NAMESPACE)), field_manager="e2e", force=True)
    for obj in codecs.load_all_yaml((DEPLOY / "rbac.yaml").read_text()):
        client.apply(obj, field_manager="e2e", force=True)
    empty_secret(client)


def empty_secret(client: Client) -> None:
    """The Secret as rbac.yaml makes it, without data (an earlier run may have filled it): the
    webhook may not create it, only fill it."""
    secret = client.get(Secret, SECRET, namespace=NAMESPACE)
    secret.data = None
    client.replace(secret)


# deploy/webhook/webhook.yaml's `asks-for-gpus` term for its one GPU name
_ASKS_FOR = f"'{GPU}' in c.resources.limits"


def webhook_configuration(url: str, gpus: Sequence[str] = (GPU,)) -> Any:
    """deploy/webhook/webhook.yaml, its clientConfig pointed at `url` and its `asks-for-gpus`
    conditions naming `gpus` (as docs/webhook.md has users of other GPU names change it)."""
    (mwc,) = codecs.load_all_yaml((DEPLOY / "webhook.yaml").read_text())
    names = " || ".join(f"'{name}' in c.resources.limits" for name in gpus)
    for hook in mwc.webhooks:
        hook.clientConfig.service = None
        hook.clientConfig.url = url
        for condition in hook.matchConditions:
            if condition.name == "asks-for-gpus":
                assert _ASKS_FOR in condition.expression, condition.expression
                condition.expression = condition.expression.replace(_ASKS_FOR, f"({names})")
    return mwc


def ca_from_secret(client: Client, path: Path) -> Path | None:
    """The webhook's CA from its Secret, written to `path`; None while there is none."""
    try:
        secret = client.get(Secret, SECRET, namespace=NAMESPACE)
    except ApiError:
        return None
    ca = (secret.data or {}).get("ca.crt")
    if ca is None:
        return None  # not filled yet
    path.write_bytes(base64.b64decode(ca))
    return path


def ca_bundle(client: Client) -> bytes:
    hooks = client.get(MutatingWebhookConfiguration, MWC).webhooks or []
    bundles = {h.clientConfig.caBundle for h in hooks}
    return base64.b64decode(bundles.pop()) if len(bundles) == 1 and None not in bundles else b""


@contextlib.contextmanager
def deployed_webhook(
    cluster: KubeCluster, config: dict[str, Any] | None = None
) -> Iterator[tuple[WebhookProcess, Path]]:
    """The webhook as deploy/webhook/ installs it: its RBAC, the MutatingWebhookConfiguration
    (pointed at a `rdmaplane webhook` process on loopback, running as the webhook's
    ServiceAccount with `config` besides its TLS settings), its own CA and serving certificate
    in the Secret and the caBundle it writes itself. Yields the process and the CA file;
    removes the configuration at the end."""
    workdir = cluster.workdir / f"webhook-{uuid.uuid4().hex[:6]}"
    workdir.mkdir()
    port = free_port()
    with cluster.client() as client:
        apply_rbac(client)
        client.apply(
            ServiceAccount(metadata=ObjectMeta(name="default", namespace="kube-system")),
            field_manager="e2e",
            force=True,
        )
        gpus = validate(Vocabulary, (config or {}).get("resources", {})).gpus
        client.apply(
            webhook_configuration(f"https://127.0.0.1:{port}/mutate", gpus),
            field_manager="e2e",
            force=True,
        )
        full = {
            "apiVersion": "rdmaplane.io/v1alpha1",
            "kind": "WebhookConfig",
            **(config or {}),
            "tls": {
                "secretName": SECRET,
                "secretNamespace": NAMESPACE,
                "webhookConfiguration": MWC,
                "hosts": ["127.0.0.1"],
                "certDir": str(workdir / "certs"),
                "checkInterval": "1s",
            },
        }
        identity = cluster.kubeconfig_for(f"system:serviceaccount:{NAMESPACE}:rdmaplane-webhook")
        ca_file = workdir / "ca.crt"
        process = start_webhook(
            workdir, full, lambda: ca_from_secret(client, ca_file), identity, port
        )
        try:
            poll_until(lambda: ca_bundle(client) == ca_file.read_bytes(), 60, "caBundle written")
            yield process, ca_file
        finally:
            process.stop()
            client.delete(MutatingWebhookConfiguration, MWC)


@contextlib.contextmanager
def webhook_namespaces(cluster: KubeCluster) -> Iterator[tuple[str, str]]:
    """Two fresh namespaces, the first opted in (`rdmaplane.io/inject=enabled`), the other
    not; their pods are deleted at the end."""
    opted_in, plain = (f"wh-{kind}-{uuid.uuid4().hex[:6]}" for kind in ("in", "plain"))
    cluster.create_namespace(opted_in)
    cluster.create_namespace(plain)
    with cluster.client() as client:
        client.patch(
            Namespace, opted_in, {"metadata": {"labels": {"rdmaplane.io/inject": "enabled"}}}
        )
        try:
            yield opted_in, plain
        finally:
            for ns in (opted_in, plain):
                client.deletecollection(Pod, namespace=ns, grace_period=0)


def create(
    client: Client, namespace: str, pod: dict[str, Any], dry_run: bool = False
) -> dict[str, Any]:
    """`pod` created through the API server (admission and all); the pod as stored."""
    obj = codecs.from_dict(copy.deepcopy(pod))
    created = client.create(obj, namespace=namespace, dry_run=dry_run)
    out: dict[str, Any] = created.to_dict()
    return out
