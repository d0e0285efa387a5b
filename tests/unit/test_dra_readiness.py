"""One verdict per offered port: may a pod bind to it (the claim's binding conditions), is it
healthy (what the kubelet shows), and the claim status the driver writes from it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.adapters.discovery.samples import read_sample
from rdmaplane.core.faults import Fault, FaultClass
from rdmaplane.core.selectors import Selectors
from rdmaplane.core.usability import NO_NCCL_PLAN, PORT_DOWN
from rdmaplane.services.dra.policy.devices import DraPool, offer, unusable
from rdmaplane.services.dra.policy.readiness import (
    DEVICE_GONE,
    FAILED,
    PORT_READY,
    READY,
    Readiness,
    binding_status,
    readiness,
)
from tests.unit.test_dra_devices import with_ports_down

DRIVER = "rdma.rdmaplane.io"
NODE = "node-a"
TOPO = read_sample("hgx-h100-roce")
POOLS = [DraPool("rdmaplane.io/hca", Selectors())]
DEVICES = offer(TOPO, POOLS)
BY_HCA = {d.hca: name for name, d in DEVICES.items()}
T0, T1 = "2026-01-02T03:04:05Z", "2026-01-02T03:09:00Z"


def verdicts_for(down: Sequence[str] = (), faults: Mapping[str, FaultClass] | None = None):
    topo = with_ports_down(TOPO, *down)
    found = unusable(topo, DEVICES, POOLS, {h.uverbs for h in topo.hcas if h.uverbs}, "/dev")
    raised = {(h, 1): Fault(h, 1, cls, "port 1 DOWN", 0.0) for h, cls in (faults or {}).items()}
    return readiness(topo, DEVICES, found, raised)


def test_a_port_that_is_up_with_its_gid_is_ready_and_says_which_address() -> None:
    verdict = verdicts_for()[BY_HCA["mlx5_0"]]
    assert verdict == Readiness(
        True, True, PORT_READY, "mlx5_0 port 1 is ACTIVE; GID index 3 holds 10.99.91.39"
    )


def test_down_fatal_and_degraded_ports_are_judged_in_that_order() -> None:
    faults = {"mlx5_0": FaultClass.FATAL, "mlx5_1": FaultClass.FATAL, "mlx5_2": FaultClass.DEGRADED}
    v = verdicts_for(down=("mlx5_0",), faults=faults)
    down, fatal, degraded = (v[BY_HCA[h]] for h in ("mlx5_0", "mlx5_1", "mlx5_2"))
    assert (down.bindable, down.healthy, down.reason) == (False, False, PORT_DOWN)
    assert "no port ACTIVE and LinkUp" in down.message  # the plugin's message, word for word
    assert (fatal.bindable, fatal.healthy, fatal.reason) == (False, False, "FatalFault")
    assert fatal.message == "mlx5_1 port 1: fatal fault: port 1 DOWN"
    # a degraded port still carries traffic: pods may bind, but its pods are told
    assert (degraded.bindable, degraded.healthy, degraded.reason) == (True, False, "DegradedFault")


def test_a_roce_port_without_its_address_is_not_ready() -> None:
    hca = TOPO.hca("mlx5_3")
    assert hca is not None
    bare = dataclasses.replace(
        hca.ports[0], gids=tuple(g for g in hca.ports[0].gids if g.index < 2)
    )
    topo = dataclasses.replace(
        TOPO,
        hcas=tuple(dataclasses.replace(h, ports=(bare,)) if h is hca else h for h in TOPO.hcas),
    )
    found = unusable(topo, DEVICES, POOLS, {h.uverbs for h in topo.hcas if h.uverbs}, "/dev")
    verdict = readiness(topo, DEVICES, found, {})[BY_HCA["mlx5_3"]]
    assert (verdict.bindable, verdict.reason) == (False, NO_NCCL_PLAN)


def allocated(
    devices: Sequence[str],
    *,
    conditions: bool = True,
    status_devices: Sequence[Mapping[str, Any]] = (),
    pool: str = NODE,
) -> dict[str, Any]:
    results = [
        {
            "request": f"nic-{k}",
            "driver": DRIVER,
            "pool": pool,
            "device": d,
            **(
                {"bindingConditions": [READY], "bindingFailureConditions": [FAILED]}
                if conditions
                else {}
            ),
        }
        for k, d in enumerate(devices)
    ]
    results.append({"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"})
    return {
        "metadata": {"name": "c", "namespace": "ns", "generation": 2},
        "status": {
            "allocation": {"devices": {"results": results}},
            "devices": [dict(d) for d in status_devices],
        },
    }


def conditions_of(devices: Sequence[Mapping[str, Any]], device: str) -> dict[str, dict[str, Any]]:
    entry = next(d for d in devices if d["device"] == device)
    return {c["type"]: c for c in entry["conditions"]}


def test_ready_devices_get_ready_true_and_failed_ones_failed_true_with_the_reason() -> None:
    up, down = BY_HCA["mlx5_0"], BY_HCA["mlx5_1"]
    other = {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0", "conditions": []}
    claim = allocated([up, down], status_devices=[other])
    devices = binding_status(
        claim, driver=DRIVER, pool=NODE, verdicts=verdicts_for(down=("mlx5_1",)), now=T0
    )
    assert devices is not None
    assert devices[0] == other  # another driver's entry, untouched
    ready = conditions_of(devices, up)
    assert ready[READY]["status"] == "True" and ready[FAILED]["status"] == "False"
    assert ready[READY]["reason"] == PORT_READY and ready[READY]["observedGeneration"] == 2
    failed = conditions_of(devices, down)
    assert failed[FAILED]["status"] == "True" and failed[READY]["status"] == "False"
    assert failed[FAILED]["reason"] == PORT_DOWN and "mlx5_1" in failed[FAILED]["message"]
    assert {c["lastTransitionTime"] for d in (ready, failed) for c in d.values()} == {T0}


def test_nothing_changes_nothing_is_written_and_a_flip_moves_the_transition_time() -> None:
    device = BY_HCA["mlx5_0"]
    first = binding_status(allocated([device]), driver=DRIVER, pool=NODE,
                           verdicts=verdicts_for(), now=T0)  # fmt: skip
    assert first is not None
    again = allocated([device], status_devices=first)
    assert binding_status(again, driver=DRIVER, pool=NODE, verdicts=verdicts_for(), now=T1) is None
    flipped = binding_status(
        again, driver=DRIVER, pool=NODE, verdicts=verdicts_for(down=("mlx5_0",)), now=T1
    )
    assert flipped is not None
    said = conditions_of(flipped, device)
    assert said[FAILED]["status"] == "True" and said[FAILED]["lastTransitionTime"] == T1


def test_claims_without_binding_conditions_or_of_other_pools_are_left_alone() -> None:
    device = BY_HCA["mlx5_0"]
    for claim in (allocated([device], conditions=False), allocated([device], pool="node-b")):
        assert (
            binding_status(claim, driver=DRIVER, pool=NODE, verdicts=verdicts_for(), now=T0) is None
        )
    assert binding_status({"metadata": {}}, driver=DRIVER, pool=NODE, verdicts={}, now=T0) is None


def test_a_device_this_node_no_longer_offers_fails_binding() -> None:
    devices = binding_status(allocated(["pci-gone-p1"]), driver=DRIVER, pool=NODE,
                             verdicts=verdicts_for(), now=T0)  # fmt: skip
    assert devices is not None
    assert conditions_of(devices, "pci-gone-p1")[FAILED]["reason"] == DEVICE_GONE


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(sorted(DEVICES)), min_size=1, max_size=4, unique=True),
    st.sets(st.sampled_from(sorted(BY_HCA)), max_size=4),
    st.sets(st.sampled_from(sorted(BY_HCA)), max_size=4),
)
def test_exactly_one_of_ready_and_failed_is_true_and_a_second_pass_writes_nothing(
    devices: list[str], down: set[str], fatal: set[str]
) -> None:
    verdicts = verdicts_for(down=sorted(down), faults=dict.fromkeys(fatal, FaultClass.FATAL))
    status = binding_status(allocated(devices), driver=DRIVER, pool=NODE, verdicts=verdicts, now=T0)
    assert status is not None
    for device in devices:
        said = conditions_of(status, device)
        assert {said[READY]["status"], said[FAILED]["status"]} == {"True", "False"}
        hca = DEVICES[device].hca
        assert (said[READY]["status"] == "True") == (hca not in down | fatal)
    settled = allocated(devices, status_devices=status)
    assert binding_status(settled, driver=DRIVER, pool=NODE, verdicts=verdicts, now=T1) is None
