"""The webhook's decision on a request body, without HTTP: every outcome the metrics count,
and bad input as `BadReview` whatever the body holds."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.core.settings.webhook import InjectPolicy
from rdmaplane.services.webhook.http import BadReview, admit
from tests.webhook_pods import admission_review, cpu_pod, gpu_pod, pods

POLICY = InjectPolicy()


def _body(obj: Any, operation: str = "CREATE") -> bytes:
    return json.dumps(admission_review(obj, operation)).encode()


@pytest.mark.parametrize(
    ("obj", "operation", "outcome"),
    [
        (gpu_pod("p"), "CREATE", "patched"),
        (gpu_pod("p"), "UPDATE", "ignored"),
        (cpu_pod("web"), "CREATE", "unchanged"),
        (gpu_pod("p", annotations={"rdmaplane.io/rdma": "fast"}), "CREATE", "denied"),
    ],
)
def test_each_outcome(obj: dict[str, Any], operation: str, outcome: str) -> None:
    admitted = admit(_body(obj, operation), POLICY)
    assert admitted.outcome == outcome
    response = orjson.loads(admitted.response)["response"]
    assert response["uid"] == "0f7c1d6e"
    assert response["allowed"] is (outcome != "denied")
    assert ("patch" in response) is (outcome == "patched")


def test_a_privileged_gpu_pod_is_admitted_with_its_warning_counted() -> None:
    privileged = gpu_pod("p", securityContext={"privileged": True})
    admitted = admit(_body(privileged), POLICY)
    response = orjson.loads(admitted.response)["response"]
    assert admitted.warnings == len(response["warnings"]) > 0


@given(pods())
def test_any_pod_is_answered(pod: dict[str, Any]) -> None:
    assert admit(_body(pod), POLICY).outcome in ("patched", "unchanged", "denied")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@given(st.binary(max_size=64) | JSON.map(lambda doc: json.dumps(doc).encode()))
def test_bad_input_is_a_bad_review(body: bytes) -> None:
    try:
        admit(body, POLICY)
    except BadReview as exc:
        assert str(exc)
