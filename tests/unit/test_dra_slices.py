"""The node's ResourceSlices: one pool split within the API's limits, one generation on every
slice, taints for faulty ports as configured."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.dra.devices import DraDevice
from rdmaplane.dra.slices import (
    MAX_DEVICES,
    MAX_DEVICES_TAINTED,
    MAX_NAME,
    device_taints,
    generation_of,
    same_content,
    slice_name,
    slice_objects,
    taint_object,
)
from rdmaplane.faults import TAINT_KEY, Fault, FaultClass, Taint

DRIVER = "rdma.rdmaplane.io"
FATAL, DEGRADED = FaultClass.FATAL, FaultClass.DEGRADED
ADDED = "2026-01-02T03:04:05Z"


def devices(n: int) -> list[DraDevice]:
    return [
        DraDevice(f"dev-{i:04d}", f"mlx5_{i}", 1, "rdmaplane.io/hca", (("port", 1),))
        for i in range(n)
    ]


@given(st.integers(0, 400), st.sets(st.integers(0, 399), max_size=20), st.integers(1, 10**9))
def test_a_pool_is_split_within_the_limits_and_carries_one_generation(
    n: int, tainted: set[int], generation: int
) -> None:
    devs = devices(n)
    taint = taint_object(Taint(TAINT_KEY, FATAL, "NoExecute"), ADDED)
    taints = {f"dev-{i:04d}": taint for i in tainted if i < n}
    slices = slice_objects(DRIVER, "node-a", devs, taints, generation, "uid-1")

    limit = MAX_DEVICES_TAINTED if taints else MAX_DEVICES
    assert len(slices) == -(-n // limit)  # no devices: no slices, no pool
    published = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert published == sorted(d.name for d in devs)
    for s in slices:
        spec = s["spec"]
        assert len(spec["devices"]) <= limit
        assert spec["pool"] == {
            "name": "node-a",
            "generation": generation,
            "resourceSliceCount": len(slices),
        }
        assert spec["driver"] == DRIVER and spec["nodeName"] == "node-a"
        assert s["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        for d in spec["devices"]:
            assert d.get("taints", []) == ([taint] if d["name"] in taints else [])
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)
    assert generation_of(slices) == (generation if slices else 0)


def test_attributes_go_on_the_wire_typed() -> None:
    device = DraDevice("d", "mlx5_0", 1, "p", (("flag", True), ("n", 3), ("s", "x")))
    (s,) = slice_objects(DRIVER, "n", [device], {}, 1)
    assert s["spec"]["devices"][0]["attributes"] == {
        "flag": {"bool": True},
        "n": {"int": 3},
        "s": {"string": "x"},
    }
    assert "ownerReferences" not in s["metadata"]


@given(st.text(alphabet="abc-.", min_size=1, max_size=300), st.integers(0, 99))
def test_slice_names_fit_and_differ_by_index(node: str, index: int) -> None:
    name = slice_name(node, DRIVER, index)
    assert len(name) <= MAX_NAME
    assert name != slice_name(node, DRIVER, index + 1)


def test_same_content_ignores_the_generation_and_sees_a_device_change() -> None:
    old = slice_objects(DRIVER, "n", devices(3), {}, 4)
    assert same_content(old, slice_objects(DRIVER, "n", devices(3), {}, 9))
    assert not same_content(old, slice_objects(DRIVER, "n", devices(2), {}, 4))
    taint = {"dev-0001": taint_object(Taint(TAINT_KEY, FATAL, "NoSchedule"), ADDED)}
    assert not same_content(old, slice_objects(DRIVER, "n", devices(3), taint, 4))


@pytest.mark.parametrize(
    ("effects", "expected"),
    [
        ({FATAL: "NoExecute", DEGRADED: None}, {"dev-0000": Taint(TAINT_KEY, FATAL, "NoExecute")}),
        (
            {FATAL: "NoSchedule", DEGRADED: "NoSchedule"},
            {
                "dev-0000": Taint(TAINT_KEY, FATAL, "NoSchedule"),
                "dev-0001": Taint(TAINT_KEY, DEGRADED, "NoSchedule"),
            },
        ),
        ({FATAL: None, DEGRADED: None}, {}),
    ],
)
def test_faults_taint_their_device_with_the_configured_effect(
    effects: dict[FaultClass, str | None], expected: dict[str, Taint]
) -> None:
    devs = {d.name: d for d in devices(3)}
    faults = {
        ("mlx5_0", 1): Fault("mlx5_0", 1, FATAL, "port 1 DOWN (DISABLED)", 0.0),
        ("mlx5_1", 1): Fault("mlx5_1", 1, DEGRADED, "symbol_error +400", 0.0),
        ("mlx5_9", 1): Fault("mlx5_9", 1, FATAL, "an HCA the driver does not offer", 0.0),
    }
    assert device_taints(devs, faults, effects) == expected


@pytest.mark.parametrize("added", ["2026-01-02 03:04:05", "2026-01-02T03:04:05.5Z", "yesterday"])
def test_taint_time_must_be_what_the_server_stores(added: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        taint_object(Taint(TAINT_KEY, FATAL, "NoExecute"), added)
