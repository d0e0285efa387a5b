"""Admission latency of the rdmaplane webhook, at the API server. Goal (issue 17): p99 <= 10 ms.

Usage: python bench/webhook.py [--pods 400]

A real kube-apiserver (the e2e fixtures' code; needs `make k8s-bins`) calls a `rdmaplane webhook`
process over TLS on loopback, registered with deploy/webhook/webhook.yaml (`url` clientConfig).
The same GPU pod is created (server-side dry run: admission, patch, validation, no etcd write)
alternately in an opted-in namespace and in one the webhook never sees, so both series share
the machine's noise. Printed, in milliseconds:

- at the API server: its own histogram `apiserver_admission_webhook_admission_duration_seconds`
  for this webhook (the call: connection, TLS, request, patch decode), mean and the share of
  calls under each bucket bound (Kubernetes' buckets are coarse: 5 ms, 25 ms, ...);
- at the client: pod create p50/p99 with and without the webhook, and the difference;
- in the webhook: its own request-duration histogram (body read to reply);
- over the wire, as the API server calls it: p50/p99 of POST /mutate with the AdmissionReview
  the API server sent, over one kept-alive TLS connection (exact quantiles, which the API
  server's buckets cannot give).
"""

from __future__ import annotations

import argparse
import base64
import copy
import re
import ssl
import statistics
import sys
import time
import uuid
from pathlib import Path

import httpx
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lightkube import codecs  # noqa: E402
from lightkube.resources.core_v1 import Namespace  # noqa: E402

from tests.e2e.controlplane import build_dir, control_plane  # noqa: E402
from tests.webhook_pods import admission_review, gpu_pod  # noqa: E402
from tests.webhook_server import free_port, start_webhook  # noqa: E402

POD = gpu_pod("bench")
HOOK = "namespace.inject.rdmaplane.io"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def histogram(text: str, metric: str, label: str = "") -> tuple[float, float, dict[str, float]]:
    """(sum, count, {le: cumulative count}) of one histogram in Prometheus text."""
    buckets: dict[str, float] = {}
    total = count = 0.0
    for line in text.splitlines():
        if not line.startswith(metric) or label not in line:
            continue
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith(f"{metric}_bucket"):
            le = re.search(r'le="([^"]+)"', line)
            if le:
                buckets[le.group(1)] = buckets.get(le.group(1), 0.0) + value
        elif line.startswith(f"{metric}_sum"):
            total += value
        elif line.startswith(f"{metric}_count"):
            count += value
    return total, count, buckets


def report_histogram(title: str, text: str, metric: str, label: str = "") -> None:
    total, count, buckets = histogram(text, metric, label)
    if not count:
        print(f"{title}: no samples")
        return
    shares = ", ".join(
        f"<= {float(le) * 1000:g} ms {n / count:.1%}"
        for le, n in buckets.items()
        if le != "+Inf" and float(le) <= 0.1
    )
    print(f"{title}: {count:.0f} calls, mean {total / count * 1000:.2f} ms; {shares}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=400, help="pods per series")
    args = parser.parse_args()
    bin_dir = build_dir("--bin-dir")
    if not (bin_dir / "kube-apiserver").is_file():
        sys.exit(f"no kube-apiserver in {bin_dir}: run `make k8s-bins` first")
    with control_plane(bin_dir) as cluster:
        workdir = cluster.workdir / "webhook-bench"
        workdir.mkdir()
        import datetime as dt

        from rdmaplane.services.webhook.policy import certs

        bundle = certs.create(["127.0.0.1"], dt.datetime.now(dt.UTC))
        for name, content in bundle.as_data().items():
            (workdir / name).write_bytes(content)
        port = free_port()
        config = {
            "apiVersion": "rdmaplane.io/v1alpha1",
            "kind": "WebhookConfig",
            "tls": {"certFile": str(workdir / "tls.crt"), "keyFile": str(workdir / "tls.key")},
        }
        process = start_webhook(workdir, config, lambda: workdir / "ca.crt", port=port)
        try:
            (mwc,) = codecs.load_all_yaml((REPO / "deploy/webhook/webhook.yaml").read_text())
            for hook in mwc.webhooks:
                hook.clientConfig.service = None
                hook.clientConfig.url = f"https://127.0.0.1:{port}/mutate"
                hook.clientConfig.caBundle = base64.b64encode(bundle.ca_crt).decode()
            opted, plain = f"bench-in-{uuid.uuid4().hex[:4]}", f"bench-plain-{uuid.uuid4().hex[:4]}"
            with cluster.client() as client:
                client.create(mwc)
                for ns in (opted, plain):
                    cluster.create_namespace(ns)
                client.patch(
                    Namespace, opted, {"metadata": {"labels": {"rdmaplane.io/inject": "enabled"}}}
                )
            run(cluster, process.url, workdir, opted, plain, args.pods)
        finally:
            process.stop()


def run(cluster: object, webhook_url: str, workdir: Path, opted: str, plain: str, n: int) -> None:
    server = cluster.server  # type: ignore[attr-defined]
    context = cluster.tls_context()  # type: ignore[attr-defined]
    series: dict[str, list[float]] = {opted: [], plain: []}
    with httpx.Client(verify=context, timeout=30) as http:
        for i in range(n + 20):  # the first 20 of each warm connections and caches
            for ns in (opted, plain):
                pod = copy.deepcopy(POD)
                start = time.perf_counter()
                reply = http.post(f"{server}/api/v1/namespaces/{ns}/pods?dryRun=All", json=pod)
                elapsed = (time.perf_counter() - start) * 1000
                if reply.status_code != 201:
                    sys.exit(f"pod create failed: {reply.status_code} {reply.text}")
                if ns == opted and "rdmaplane.io/hca" not in reply.text:
                    sys.exit("the opted-in pod came back without rdmaplane.io/hca")
                if i >= 20:
                    series[ns].append(elapsed)
        apiserver_metrics = http.get(f"{server}/metrics").text
    webhook_tls = ssl.create_default_context(cafile=str(workdir / "ca.crt"))
    webhook_metrics = httpx.get(f"{webhook_url}/metrics", verify=webhook_tls).text
    direct: list[float] = []
    body = orjson.dumps(admission_review(POD))
    with httpx.Client(verify=webhook_tls, timeout=30) as http:
        for i in range(n + 20):
            start = time.perf_counter()
            reply = http.post(f"{webhook_url}/mutate", content=body)
            if i >= 20:
                direct.append((time.perf_counter() - start) * 1000)
            assert reply.status_code == 200, reply.text
    print(f"== rdmaplane webhook admission, {n} pods per series (dry-run create, 8-GPU pod)")
    report_histogram(
        "at the API server (webhook call)",
        apiserver_metrics,
        "apiserver_admission_webhook_admission_duration_seconds",
        f'name="{HOOK}"',
    )
    with_hook, without = series[opted], series[plain]
    for title, values in (("client, with webhook", with_hook), ("client, without", without)):
        print(
            f"{title}: p50 {quantile(values, 0.5):.2f} ms, p99 {quantile(values, 0.99):.2f} ms, "
            f"mean {statistics.fmean(values):.2f} ms"
        )
    print(
        f"client, difference: p50 {quantile(with_hook, 0.5) - quantile(without, 0.5):+.2f} ms, "
        f"p99 {quantile(with_hook, 0.99) - quantile(without, 0.99):+.2f} ms"
    )
    print(
        f"over the wire (POST /mutate, kept-alive TLS): p50 {quantile(direct, 0.5):.2f} ms, "
        f"p99 {quantile(direct, 0.99):.2f} ms"
    )
    report_histogram(
        "inside the webhook", webhook_metrics, "rdmaplane_webhook_request_duration_seconds"
    )


if __name__ == "__main__":
    main()
