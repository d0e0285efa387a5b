"""The node's ResourceSlices: one pool split within the API's limits, one generation on every
slice, taints for faulty ports as configured and for ports that cannot be handed out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.core.faults import TAINT_KEY, Fault, FaultClass, Taint
from rdmaplane.core.model import LinkLayer, PhysState, Port, PortState
from rdmaplane.core.settings.dra import DraSharing
from rdmaplane.core.usability import NO_NCCL_PLAN, PORT_DOWN, Unusable
from rdmaplane.services.dra.policy.devices import DraDevice, share_of
from rdmaplane.services.dra.policy.slices import (
    BANDWIDTH,
    MAX_DEVICES,
    MAX_DEVICES_TAINTED,
    MAX_NAME,
    UNUSABLE_EFFECT,
    device_taints,
    generation_of,
    same_content,
    slice_name,
    slice_objects,
    taint_object,
)

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
    taints = {f"dev-{i:04d}": [taint] for i in tainted if i < n}
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
            assert d.get("taints", []) == taints.get(d["name"], [])
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
    fatal = taint_object(Taint(TAINT_KEY, FATAL, "NoSchedule"), ADDED)
    down = taint_object(Taint(TAINT_KEY, PORT_DOWN, UNUSABLE_EFFECT), ADDED)
    one = slice_objects(DRIVER, "n", devices(3), {"dev-0001": [fatal]}, 4)
    assert not same_content(old, one)
    assert not same_content(
        one, slice_objects(DRIVER, "n", devices(3), {"dev-0001": [fatal, down]}, 4)
    )


@pytest.mark.parametrize(
    ("effects", "expected"),
    [
        (
            {FATAL: "NoExecute", DEGRADED: None},
            {"dev-0000": (Taint(TAINT_KEY, FATAL, "NoExecute"),)},
        ),
        (
            {FATAL: "NoSchedule", DEGRADED: "NoSchedule"},
            {
                "dev-0000": (Taint(TAINT_KEY, FATAL, "NoSchedule"),),
                "dev-0001": (Taint(TAINT_KEY, DEGRADED, "NoSchedule"),),
            },
        ),
        ({FATAL: None, DEGRADED: None}, {}),
    ],
)
def test_faults_taint_their_device_with_the_configured_effect(
    effects: dict[FaultClass, str | None], expected: dict[str, tuple[Taint, ...]]
) -> None:
    devs = {d.name: d for d in devices(3)}
    faults = {
        ("mlx5_0", 1): Fault("mlx5_0", 1, FATAL, "port 1 DOWN (DISABLED)", 0.0),
        ("mlx5_1", 1): Fault("mlx5_1", 1, DEGRADED, "symbol_error +400", 0.0),
        ("mlx5_9", 1): Fault("mlx5_9", 1, FATAL, "an HCA the driver does not offer", 0.0),
    }
    assert device_taints(devs, faults, effects, {}) == expected


UNUSABLE = {
    "dev-0000": Unusable(PORT_DOWN, "mlx5_0: no port ACTIVE and LinkUp (port 1 DOWN/DISABLED)"),
    "dev-0002": Unusable(NO_NCCL_PLAN, "no NCCL plan for mlx5_2: no usable GID on mlx5_2:1"),
}


@pytest.mark.parametrize(
    "effects",
    [
        {FATAL: "NoExecute", DEGRADED: None},
        {FATAL: "NoSchedule", DEGRADED: "NoExecute"},
        {FATAL: None, DEGRADED: None},
    ],
)
def test_a_port_that_cannot_be_handed_out_is_tainted_noschedule_beside_its_fault(
    effects: dict[FaultClass, str | None],
) -> None:
    devs = {d.name: d for d in devices(3)}
    fatal = {("mlx5_0", 1): Fault("mlx5_0", 1, FATAL, "port 1 DOWN (DISABLED)", 0.0)}

    taints = device_taints(devs, fatal, effects, UNUSABLE)

    down = Taint(TAINT_KEY, PORT_DOWN, "NoSchedule")
    no_plan = Taint(TAINT_KEY, NO_NCCL_PLAN, "NoSchedule")
    fault = () if effects[FATAL] is None else (Taint(TAINT_KEY, FATAL, effects[FATAL]),)
    assert taints == {"dev-0000": (*fault, down), "dev-0002": (no_plan,)}


@given(
    st.sets(st.integers(0, 5)),
    st.sets(st.integers(0, 5)),
    st.sampled_from(["NoExecute", "NoSchedule", "None", None]),
)
def test_every_unusable_device_and_only_those_carry_a_noschedule_reason(
    faulty: set[int], unusable: set[int], effect: str | None
) -> None:
    devs = {d.name: d for d in devices(6)}
    faults = {(f"mlx5_{i}", 1): Fault(f"mlx5_{i}", 1, FATAL, "down", 0.0) for i in faulty}
    why = {f"dev-{i:04d}": Unusable(PORT_DOWN, "down") for i in unusable}

    taints = device_taints(devs, faults, {FATAL: effect, DEGRADED: None}, why)

    for name in devs:
        values = {t.value: t.effect for t in taints.get(name, ())}
        assert values.get(PORT_DOWN) == ("NoSchedule" if name in why else None)
        i = int(name[-4:])
        assert values.get(FATAL) == (effect if i in faulty else None)
    assert set(taints) == set(why) | ({f"dev-{i:04d}" for i in faulty} if effect else set())


@pytest.mark.parametrize("added", ["2026-01-02 03:04:05", "2026-01-02T03:04:05.5Z", "yesterday"])
def test_taint_time_must_be_what_the_server_stores(added: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        taint_object(Taint(TAINT_KEY, FATAL, "NoExecute"), added)


def test_with_binding_conditions_every_device_binds_to_the_node_and_waits_for_ready() -> None:
    (s,) = slice_objects(DRIVER, "node-a", devices(3), {}, 1, binding=True)
    for d in s["spec"]["devices"]:
        assert d["bindsToNode"] is True
        assert d["bindingConditions"] == ["rdmaplane.io/rdma-ready"]
        assert d["bindingFailureConditions"] == ["rdmaplane.io/rdma-failed"]
    (plain,) = slice_objects(DRIVER, "node-a", devices(3), {}, 1)
    assert not any("bindsToNode" in d for d in plain["spec"]["devices"])


@given(st.integers(1, 1600), st.integers(1, 400), st.integers(1, 16))
def test_a_shared_port_publishes_its_rate_as_capacity_the_api_accepts(
    rate: int, step: int, defaults: int
) -> None:
    port = Port(1, PortState.ACTIVE, PhysState.LINK_UP, LinkLayer.ETHERNET, rate_gbps=float(rate))
    share = share_of(port, DraSharing(step * defaults, step))
    if rate < step:
        assert share is None  # offered whole
        return
    assert share is not None
    device = DraDevice("d", "mlx5_0", 1, "p", share=share)
    (s,) = slice_objects(DRIVER, "node-a", [device], {}, 1)
    (body,) = s["spec"]["devices"]
    assert body["allowMultipleAllocations"] is True
    capacity = body["capacity"][BANDWIDTH]
    value = int(capacity["value"].removesuffix("G"))
    policy = capacity["requestPolicy"]
    default = int(policy["default"].removesuffix("G"))
    lo, hi, by = (int(policy["validRange"][k].removesuffix("G")) for k in ("min", "max", "step"))
    # ResourceSlice validation (pkg/apis/resource/validation): min <= default <= max <= value,
    # default and max a whole number of steps from min
    assert 0 < lo <= default <= hi <= value <= rate
    assert (default - lo) % by == 0 and (hi - lo) % by == 0
    assert value > rate - step  # no more than one step of the port left out
