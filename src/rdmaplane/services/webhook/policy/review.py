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

import msgspec
import orjson

from rdmaplane.core.decoding import DecodeError, convert
from rdmaplane.core.errors import InputError
from rdmaplane.core.untrusted import what_it_is
from rdmaplane.services.webhook.policy.inject import Mutation

API_VERSION: Final = "admission.k8s.io/v1"
POD: Final = ("", "v1", "Pod")


class ReviewError(InputError):
    """Not an AdmissionReview this webhook can answer; the message says why."""


@dataclass(frozen=True)
class Request:
    uid: str
    operation: str
    namespace: str
    pod: Mapping[str, Any]


class _Kind(msgspec.Struct, frozen=True):
    group: str = ""
    version: str = ""
    kind: str = ""


class _Request(msgspec.Struct, frozen=True):
    uid: str = ""
    kind: _Kind | None = None
    operation: str = ""
    namespace: str | None = None
    object: dict[str, Any] | None = None  # the pod: patched as it came, every field kept


class _Review(msgspec.Struct, frozen=True, rename="camel"):
    api_version: str | None = None
    kind: str | None = None
    request: _Request | None = None


def parse(review: object) -> Request:
    """The request in a decoded AdmissionReview."""
    try:
        doc = convert(review, _Review)
    except DecodeError as e:
        if not e.path:
            got = what_it_is(review)
            raise ReviewError(f"expected an AdmissionReview object, got {got}") from None
        raise ReviewError(str(e)) from None
    if doc.api_version != API_VERSION or doc.kind != "AdmissionReview":
        raise ReviewError(
            f"expected apiVersion {API_VERSION}, kind AdmissionReview; got "
            f"{_short(doc.api_version)}, {_short(doc.kind)}"
        )
    request = doc.request
    if request is None:
        raise ReviewError("request: missing or not an object")
    if not request.uid:
        raise ReviewError("request.uid: missing or not a string")
    kind = request.kind or _Kind()
    if (kind.group, kind.version, kind.kind) != POD:
        raise ReviewError(
            f"request.kind: {_short(f'{kind.group}/{kind.version} {kind.kind}')} is not a "
            "core/v1 Pod; the webhook's rules should match pods only"
        )
    if request.operation == "CREATE" and request.object is None:
        raise ReviewError("request.object: missing or not an object")
    return Request(request.uid, request.operation, request.namespace or "", request.object or {})


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


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
