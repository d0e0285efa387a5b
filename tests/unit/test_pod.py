"""The one Pod model (`rdmaplane.core.pod`) and its counting rule, the API server's for extended
resources: the count is the limit, the request defaults to it or must equal it, a request
without a limit is refused, and so is a quantity that is not a whole, non-negative number."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.core.decoding import DecodeError, convert
from rdmaplane.core.pod import Pod, PodSpec, ResourceList, Resources, parse_count
from rdmaplane.services.scheduler.policy import podrequest
from rdmaplane.services.webhook.policy import podview

GPU, HCA, SHARED = "nvidia.com/gpu", "rdmaplane.io/hca", "rdmaplane.io/hca-shared"
EXTENDED = st.sampled_from([GPU, HCA, SHARED, "amd.com/gpu", "example.com/fpga"])


def resources(obj: dict[str, Any]) -> Resources:
    return convert(obj, Resources)


def test_a_limit_alone_is_the_count_and_the_request() -> None:
    res = resources({"limits": {GPU: "8", HCA: 0, "memory": "64Gi", "cpu": "500m"}})
    assert res.count(GPU) == 8 and res.count(HCA) == 0 and res.count(SHARED) == 0
    assert dict(res.devices) == {GPU: 8, HCA: 0}  # naming a resource with 0 matters
    assert res.limits is not None and res.limits.other == {"memory": "64Gi", "cpu": "500m"}
    assert list(res.faults()) == [] and res.unlimited == () and res.mismatched == ()


def test_a_request_equal_to_its_limit_is_the_same_count() -> None:
    res = resources({"limits": {GPU: "2"}, "requests": {GPU: 2, "cpu": "1"}})
    assert res.count(GPU) == 2 and list(res.faults()) == []


def test_a_request_other_than_its_limit_is_a_fault_naming_the_field() -> None:
    res = resources({"limits": {GPU: "2"}, "requests": {GPU: "1"}})
    assert res.mismatched == (GPU,) and res.count(GPU) == 2
    [(field, why)] = res.faults()
    assert field == f"requests[{GPU}]" and "1 is not the limit 2" in why


def test_a_request_without_a_limit_is_a_fault_and_no_count() -> None:
    res = resources({"requests": {GPU: "8", "cpu": "2"}})
    assert res.unlimited == (GPU,) and res.count(GPU) == 0 and dict(res.devices) == {}
    [(field, why)] = res.faults()
    assert field == f"requests[{GPU}]" and "without a limit" in why
    assert res.names == {GPU}


@pytest.mark.parametrize(
    ("value", "count"),
    [("2", 2), (2, 2), ("1k", 1000), ("2Ki", 2048), ("1e3", 1000), ("1000m", 1), ("0", 0)],
)
def test_whole_quantities_in_every_form(value: object, count: int) -> None:
    assert parse_count(value) == count


@pytest.mark.parametrize("value", ["1.5", "500m", "-1", -2, "x", "", None, True, 1.0, [1]])
def test_other_quantities_are_refused_when_the_pod_is_read(value: object) -> None:
    with pytest.raises(ValueError, match="expected a whole number of devices"):
        parse_count(value)
    pod = {"spec": {"initContainers": [{"resources": {"limits": {GPU: value}}}]}}
    with pytest.raises(DecodeError) as err:
        convert(pod, Pod, "Pod")
    assert err.value.path == f"Pod.spec.initContainers[0].resources.limits[{GPU}]"


def test_other_resources_are_never_counted() -> None:
    res = resources({"limits": {"cpu": "1.5", "memory": 3, "hugepages-2Mi": "1Gi"}})
    assert dict(res.devices) == {} and res.limits is not None
    assert res.limits.other == {"cpu": "1.5", "memory": 3, "hugepages-2Mi": "1Gi"}


def test_containers_in_the_kubelets_order_and_faults_named_from_the_pod() -> None:
    spec = convert(
        {
            "containers": [{"name": "app", "resources": {"requests": {HCA: "1"}}}],
            "initContainers": [{"name": "init"}, {"name": "side", "restartPolicy": "Always"}],
        },
        PodSpec,
    )
    assert [(f, i, c.name) for f, i, c in spec.every()] == [
        ("initContainers", 0, "init"),
        ("initContainers", 1, "side"),
        ("containers", 0, "app"),
    ]
    assert [f for f, _ in spec.faults()] == [f"spec.containers[0].resources.requests[{HCA}]"]


# ------------------------------------------------------------------------------ properties

COUNTS = st.dictionaries(EXTENDED, st.integers(0, 16), max_size=4)


@given(COUNTS, COUNTS)
def test_the_rule_on_any_limits_and_requests(
    limits: dict[str, int], requests: dict[str, int]
) -> None:
    """The count is the limit; the faults are exactly the requests the API server refuses."""
    res = Resources(ResourceList.of(limits), ResourceList.of(requests))
    for name in {*limits, *requests, GPU}:
        assert res.count(name) == limits.get(name, 0)
    assert dict(res.devices) == limits
    assert set(res.unlimited) == set(requests) - set(limits)
    assert set(res.mismatched) == {n for n in requests if n in limits and limits[n] != requests[n]}
    valid = all(limits.get(n) == k for n, k in requests.items())
    assert (list(res.faults()) == []) == valid


@given(st.integers(0, 2**40), st.sampled_from(["", "k", "M", "Ki", "Mi"]))
def test_whole_quantities_read_as_the_number_they_name(number: int, suffix: str) -> None:
    scale = {"": 1, "k": 10**3, "M": 10**6, "Ki": 2**10, "Mi": 2**20}[suffix]
    assert parse_count(f"{number}{suffix}") == number * scale


@st.composite
def valid_pods(draw: st.DrawFn) -> dict[str, Any]:
    """Pods the API server stores: each extended request equal to its limit, or none."""

    def container(index: int) -> dict[str, Any]:
        limits = draw(COUNTS)
        requests = {n: k for n, k in limits.items() if draw(st.booleans())}
        resources: dict[str, Any] = {"limits": {n: str(k) for n, k in limits.items()}}
        if requests or draw(st.booleans()):
            resources["requests"] = {**requests, "cpu": "100m"}
        return {"name": f"c{index}", "resources": resources}

    apps = draw(st.integers(1, 3))
    inits = draw(st.integers(0, 2))
    return {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [container(i) for i in range(apps)],
            "initContainers": [container(apps + i) for i in range(inits)],
        },
    }


@given(valid_pods())
def test_the_extender_and_the_webhook_count_alike(pod: dict[str, Any]) -> None:
    """Both callers read the one model: the extender's steps and the webhook's counts are the
    containers' limits, and neither finds a fault in a pod the API server stores."""
    seen = podview.read_pod(pod)
    assert seen.spec is not None and list(seen.spec.faults()) == []
    by_webhook = [
        {n: k for n, k in c.requirements.devices.items() if k} for _, _, c in seen.spec.every()
    ]
    request = podrequest.pod_request(pod)  # raises on a fault
    steps = [dict(step.devices) for step in request.steps if step.devices]
    assert steps == [counts for counts in by_webhook if counts]
