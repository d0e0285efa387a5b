"""The AdmissionReview wire format (`admission.k8s.io/v1`), both directions.

Pure: a decoded body in, a checked request out; a `Mutation` in, the response body out.
Anything that is not an AdmissionReview for a Pod raises `ReviewError`, whose message the HTTP
adapter sends back with a 400: the API server then shows it, and a misconfigured webhook (wrong
rules) is loud.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from rdmaplane.errors import InputError
from rdmaplane.webhook.inject import Mutation

API_VERSION: Final = "admission.k8s.io/v1"
POD: Final = {"group": "", "version": "v1", "kind": "Pod"}


class ReviewError(InputError):
    """Not an AdmissionReview this webhook can answer; the message says why."""


@dataclass(frozen=True)
class Request:
    uid: str
    operation: str
    namespace: str
    pod: Mapping[str, Any]


def parse(review: object) -> Request:
    """The request in a decoded AdmissionReview."""
    if not isinstance(review, dict):
        raise ReviewError(f"expected an AdmissionReview object, got {_what(review)}")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise ReviewError(
            f"expected apiVersion {API_VERSION}, kind AdmissionReview; got "
            f"{_short(review.get('apiVersion'))}, {_short(review.get('kind'))}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewError("request: missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid: missing or not a string")
    kind = request.get("kind")
    if not isinstance(kind, dict) or {k: kind.get(k) for k in POD} != POD:
        raise ReviewError(
            f"request.kind: {_short(kind)} is not a core/v1 Pod; the webhook's rules should "
            "match pods only"
        )
    pod = request.get("object")
    operation = request.get("operation")
    if operation == "CREATE" and not isinstance(pod, dict):
        raise ReviewError("request.object: missing or not an object")
    return Request(uid, str(operation), str(request.get("namespace") or ""), pod or {})


def respond(uid: str, mutation: Mutation | None = None, denied: str | None = None) -> bytes:
    """The AdmissionReview answer: allowed with the patch and warnings, or denied with a
    message (HTTP 200 either way: the API server reads `allowed`)."""
    response: dict[str, Any] = {"uid": uid, "allowed": denied is None}
    if denied is not None:
        response["status"] = {"code": 400, "reason": "BadRequest", "message": denied}
    if mutation is not None and mutation.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(mutation.patch)).decode()
    if mutation is not None and mutation.warnings:
        response["warnings"] = mutation.warnings
    return orjson.dumps(
        {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
    )


def _what(value: object) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
