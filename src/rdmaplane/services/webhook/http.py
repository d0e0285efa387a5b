"""The HTTPS endpoints the API server calls: `/mutate`, plus health, readiness and metrics.

Bad input (not JSON, not an AdmissionReview for a Pod, nested too deep) gets a 400, a body over
`maxRequestBytes` a 413 (and the connection closed), both with a one-line message; an unexpected
fault a 503 naming it. The service keeps serving through all of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from fastapi import FastAPI, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

from rdmaplane.adapters.documents import DocumentError, check_depth
from rdmaplane.adapters.httpbody import BodyTooLarge, read_body
from rdmaplane.core.errors import InputError
from rdmaplane.core.settings.webhook import InjectPolicy
from rdmaplane.services.webhook.policy import inject, review

log = logging.getLogger("rdmaplane.services.webhook")


class BadReview(InputError):
    """A request body that is not an AdmissionReview for a Pod: a 400 with the message."""


class WebhookMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "rdmaplane_webhook_requests_total",
            "Admission requests by HTTP code and outcome.",
            ["code", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "rdmaplane_webhook_request_duration_seconds",
            "Time to answer an admission request, from body read to reply.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.warnings = Counter(
            "rdmaplane_webhook_warnings_total",
            "Admission warnings returned (hostPath devices, privileged containers).",
            registry=self.registry,
        )


@dataclass(frozen=True, slots=True)
class Admitted:
    """An AdmissionReview answered: the response body, the outcome (the metric's label:
    ignored, denied, patched, unchanged) and how many warnings it carries."""

    response: bytes
    outcome: str
    warnings: int = 0


def admit(body: bytes, policy: InjectPolicy) -> Admitted:
    """The webhook's decision on one request body, with no I/O; `BadReview` for bad input."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadReview(f"body is not JSON: {exc}") from None
    try:
        check_depth(doc, "AdmissionReview")
        request = review.parse(doc)
    except (DocumentError, review.ReviewError) as exc:
        raise BadReview(str(exc)) from None
    if request.operation != "CREATE":
        return Admitted(review.respond(request.uid), "ignored")
    try:
        mutation = inject.mutate(request.pod, policy, request.namespace or None)
    except inject.PodError as exc:
        return Admitted(review.respond(request.uid, denied=str(exc)), "denied")
    outcome = "patched" if mutation.patch else "unchanged"
    return Admitted(review.respond(request.uid, mutation), outcome, len(mutation.warnings))


def create_app(
    policy: InjectPolicy, max_request_bytes: int, ready: Callable[[], str | None]
) -> FastAPI:
    """The webhook's HTTP shell over `admit`: bodies read with a bound, faults mapped to
    400/413/503, requests counted. `ready()` returns None when the webhook can serve, else
    why not (no certificate yet, caBundle not written)."""
    app = FastAPI(title="rdmaplane admission webhook", openapi_url=None)
    metrics = WebhookMetrics()
    app.state.metrics = metrics

    @app.post("/mutate")
    async def mutate(request: Request) -> Response:
        start = time.perf_counter()
        try:
            admitted = admit(await read_body(request, max_request_bytes), policy)
            metrics.warnings.inc(admitted.warnings)
            body, outcome = admitted.response, admitted.outcome
            response = Response(body, media_type="application/json")
        except BodyTooLarge as exc:
            response, outcome = _error(413, str(exc)), "rejected"
            response.headers["Connection"] = "close"
        except BadReview as exc:
            response, outcome = _error(400, str(exc)), "rejected"
        except Exception as exc:  # never a crash: say what broke, keep serving
            log.exception("admission failed")
            response, outcome = _error(503, f"internal error: {type(exc).__name__}: {exc}"), "error"
        metrics.requests.labels(str(response.status_code), outcome).inc()
        metrics.latency.observe(time.perf_counter() - start)
        return response

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok\n", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        why = ready()
        if why is None:
            return Response("ok\n", media_type="text/plain")
        return Response(f"{why}\n", status_code=503, media_type="text/plain")

    @app.get("/metrics")
    async def metrics_() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _error(status: int, message: str) -> Response:
    return Response(f"{message}\n", status_code=status, media_type="text/plain")
