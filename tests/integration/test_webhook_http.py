"""The webhook over real HTTPS (a `rdmaplane webhook` process with certificate files): good
reviews get a patch, bad input a 4xx with a message, and the service keeps serving."""

from __future__ import annotations

import base64
import datetime as dt
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rdmaplane.services.webhook.policy import certs
from tests.e2e.controlplane import poll_until
from tests.webhook_pods import admission_review, gpu_pod
from tests.webhook_server import WebhookProcess, start_webhook


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[WebhookProcess, ssl.SSLContext]]:
    workdir = tmp_path_factory.mktemp("webhook")
    bundle = certs.create(["127.0.0.1"], dt.datetime.now(dt.UTC))
    for name, content in bundle.as_data().items():
        (workdir / name).write_bytes(content)
    config = {
        "apiVersion": "rdmaplane.io/v1alpha1",
        "kind": "WebhookConfig",
        "maxRequestBytes": 65536,
        "tls": {"certFile": str(workdir / "tls.crt"), "keyFile": str(workdir / "tls.key")},
    }
    process = start_webhook(workdir, config, lambda: workdir / "ca.crt")
    yield process, ssl.create_default_context(cafile=str(workdir / "ca.crt"))
    process.stop()


GPU_POD = gpu_pod("p")


def post(server: tuple[WebhookProcess, ssl.SSLContext], body: bytes) -> httpx.Response:
    process, context = server
    headers = {"Content-Type": "application/json"}
    return httpx.post(
        f"{process.url}/mutate", content=body, headers=headers, verify=context, timeout=10
    )


def test_gpu_pod_gets_a_patch(server: tuple[WebhookProcess, ssl.SSLContext]) -> None:
    reply = post(server, json.dumps(admission_review(GPU_POD)).encode())
    assert reply.status_code == 200
    response = reply.json()["response"]
    assert response["uid"] == "0f7c1d6e" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert {
        "op": "add",
        "path": "/spec/containers/0/resources/limits/rdmaplane.io~1hca",
        "value": "8",
    } in patch


def test_update_and_unknown_mode(server: tuple[WebhookProcess, ssl.SSLContext]) -> None:
    response = post(server, json.dumps(admission_review(GPU_POD, "UPDATE")).encode()).json()[
        "response"
    ]
    assert response == {"uid": "0f7c1d6e", "allowed": True}
    bad = json.loads(json.dumps(GPU_POD))
    bad["metadata"]["annotations"] = {"rdmaplane.io/rdma": "fast"}
    response = post(server, json.dumps(admission_review(bad)).encode()).json()["response"]
    assert response["allowed"] is False
    assert (
        "rdmaplane.io/rdma: 'fast' is not one of auto|exclusive|shared|off"
        in response["status"]["message"]
    )


def _nested(depth: int) -> Any:
    obj: Any = {}
    for _ in range(depth):
        obj = {"a": obj}
    return obj


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "body is not JSON"),
        (b"[1, 2]", 400, "expected an AdmissionReview object, got a list"),
        (
            json.dumps({"kind": "AdmissionReview"}).encode(),
            400,
            "expected apiVersion admission.k8s.io/v1",
        ),
        (
            json.dumps(admission_review(GPU_POD, kind="Deployment")).encode(),
            400,
            "is not a core/v1 Pod",
        ),
        (
            json.dumps({**admission_review(GPU_POD), "request": {"uid": ""}}).encode(),
            400,
            "request.uid",
        ),
        (json.dumps(admission_review(None)).encode(), 400, "request.object: missing"),
        (json.dumps(admission_review(_nested(200))).encode(), 400, "nested deeper than 64 levels"),
        (
            json.dumps(admission_review({"pad": "x" * 70000})).encode(),
            413,
            "exceeds the limit of 65536 bytes",
        ),
        (("[" * 5000 + "]" * 5000).encode(), 400, "body is not JSON"),
        (b"\xff\xfe junk", 400, "body is not JSON"),
    ],
    ids=[
        "malformed",
        "list",
        "no-version",
        "wrong-kind",
        "no-uid",
        "no-object",
        "deep",
        "huge",
        "deeper-than-the-parser",
        "binary",
    ],
)
def test_bad_input_gets_a_message_and_the_service_lives_on(
    server: tuple[WebhookProcess, ssl.SSLContext], body: bytes, status: int, message: str
) -> None:
    reply = post(server, body)
    assert reply.status_code == status
    assert message in reply.text
    assert len(reply.text.strip().splitlines()) == 1
    assert post(server, json.dumps(admission_review(GPU_POD)).encode()).status_code == 200


def test_metrics_count_outcomes(server: tuple[WebhookProcess, ssl.SSLContext]) -> None:
    post(server, json.dumps(admission_review(GPU_POD)).encode())
    process, context = server
    text = httpx.get(f"{process.url}/metrics", verify=context).text
    assert 'rdmaplane_webhook_requests_total{code="200",outcome="patched"}' in text
    assert "rdmaplane_webhook_request_duration_seconds_bucket" in text


def test_plain_http_is_refused(server: tuple[WebhookProcess, ssl.SSLContext]) -> None:
    process, _ = server
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{process.port}/healthz", timeout=5)


def test_files_replaced_by_cert_manager_are_served_without_a_restart(tmp_path: Path) -> None:
    """cert-manager renews the Secret, the kubelet swaps the mounted files: the next check
    loads them into the running server."""
    now = dt.datetime.now(dt.UTC)
    first, second = certs.create(["127.0.0.1"], now), certs.create(["127.0.0.1"], now)
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_bytes(first.as_data()[name])
    (tmp_path / "ca.crt").write_bytes(first.ca_crt)
    config = {
        "apiVersion": "rdmaplane.io/v1alpha1",
        "kind": "WebhookConfig",
        "tls": {
            "certFile": str(tmp_path / "tls.crt"),
            "keyFile": str(tmp_path / "tls.key"),
            "checkInterval": "200ms",
        },
    }
    process = start_webhook(tmp_path, config, lambda: tmp_path / "ca.crt")
    try:
        for name in ("tls.crt", "tls.key"):
            (tmp_path / f"new-{name}").write_bytes(second.as_data()[name])
            (tmp_path / f"new-{name}").replace(tmp_path / name)
        new_ca = ssl.create_default_context(cadata=second.ca_crt.decode())

        def served_new() -> bool:
            try:
                return (
                    httpx.get(f"{process.url}/healthz", verify=new_ca, timeout=5).status_code == 200
                )
            except httpx.HTTPError:
                return False

        poll_until(served_new, 60, "the new certificate served")
        assert "serving a new certificate" in process.log_text()
    finally:
        process.stop()
