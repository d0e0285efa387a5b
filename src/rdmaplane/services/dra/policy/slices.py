"""The node's ResourceSlices (`resource.k8s.io/v1`) and the taints of faulty devices; pure.

One pool per node, named after the node, split over as many slices as the API allows (128
devices a slice, 64 once any device carries a taint). Every slice of a pool carries the same
`pool.generation` and `resourceSliceCount`; the scheduler only trusts a pool whose slices all
show its newest generation, so a change is published as a new generation on every slice.

A device gets up to two taints, both with the node taint's key `rdmaplane.io/rdma-unhealthy`:

- when its port cannot be handed out (`devices.unusable`: down, no verbs device node, no NCCL
  plan such as no usable GID, error counters rising), `=<reason>:NoSchedule` (`PortDown`, ...)
  from the first slice that shows it, whatever the port's link class: what the device plugin's
  Unhealthy is. No new claim gets the device; the pods using it stay (evicting them is the
  fault classes' call).
- when its port has a fault (the fault classes judge compute ports, with their hysteresis),
  `=<class>` with the effect configured for that class; with NoExecute kube-controller-manager
  evicts the pods using it (after the tolerationSeconds their claims allow).

The scheduler gives a claim no device with a taint it does not tolerate, so a claim that
tolerates NoExecute faults (to ride out short ones) still never gets a port that is down. The
taints sit in the slice rather than in a DeviceTaintRule: the driver owns its slices already
(no extra RBAC), and a taint comes and goes with the same write that publishes the device.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rdmaplane.core.faults import TAINT_KEY, Fault, Taint
from rdmaplane.core.porthealth import FaultClass, PortKey
from rdmaplane.core.usability import Unusable
from rdmaplane.services.dra.policy.devices import AttributeValue, DraDevice, Share
from rdmaplane.services.dra.policy.readiness import FAILED, READY

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128
MAX_DEVICES_TAINTED = 64
MAX_NAME = 253
UNUSABLE_EFFECT = "NoSchedule"  # as the device plugin's Unhealthy: no new claim, no eviction
BANDWIDTH = "bandwidth"  # a shared port's capacity, in the driver's domain, as "<Gb/s>G"


def device_taints(
    devices: Mapping[str, DraDevice],
    faults: Mapping[PortKey, Fault],
    effects: Mapping[FaultClass, str | None],
    unusable: Mapping[str, Unusable],
) -> dict[str, tuple[Taint, ...]]:
    """The taints of each device that has any (by name): its fault's, the class as the value
    (`rdmaplane.io/rdma-unhealthy=fatal`; `effects[cls]` None: that class taints not), then
    why it cannot be handed out (`rdmaplane.io/rdma-unhealthy=PortDown:NoSchedule`)."""
    out = {}
    for name, device in devices.items():
        found = []
        fault = faults.get((device.hca, device.port))
        effect = effects.get(fault.cls) if fault is not None else None
        if fault is not None and effect is not None:
            found.append(Taint(TAINT_KEY, fault.cls.value, effect))
        problem = unusable.get(name)
        if problem is not None:
            found.append(Taint(TAINT_KEY, problem.reason, UNUSABLE_EFFECT))
        if found:
            out[name] = tuple(found)
    return out


def slice_name(node: str, driver: str, index: int) -> str:
    """`<node>-<driver>-<index>`, shortened with a digest when the node name is long."""
    name = f"{node}-{driver}-{index}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(f"{node}/{driver}".encode()).hexdigest()[:10]
    keep = MAX_NAME - len(f"-{digest}-{driver}-{index}")
    return f"{node[:keep].rstrip('-.')}-{digest}-{driver}-{index}"


def slice_objects(
    driver: str,
    node: str,
    devices: Sequence[DraDevice],
    taints: Mapping[str, Sequence[Mapping[str, Any]]],
    generation: int,
    owner_uid: str | None = None,
    *,
    binding: bool = False,
) -> list[dict[str, Any]]:
    """The pool's slices as API objects; `taints[name]` are the device's taint objects as they
    go on the wire (key, value, effect, timeAdded). `binding`: every device binds to the node
    and a pod binds once the driver set `READY` on its claim (`readiness`). No devices: no
    slices (no pool)."""
    ordered = sorted(devices, key=lambda d: d.name)
    size = MAX_DEVICES_TAINTED if any(d.name in taints for d in ordered) else MAX_DEVICES
    chunks = [ordered[i : i + size] for i in range(0, len(ordered), size)]
    out = []
    for index, chunk in enumerate(chunks):
        metadata: dict[str, Any] = {"name": slice_name(node, driver, index)}
        if owner_uid:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner_uid}
            ]
        out.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": metadata,
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {
                        "name": node,
                        "generation": generation,
                        "resourceSliceCount": len(chunks),
                    },
                    "devices": [_device(d, taints.get(d.name), binding) for d in chunk],
                },
            }
        )
    return out


def _device(
    device: DraDevice, taints: Sequence[Mapping[str, Any]] | None, binding: bool
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": device.name,
        "attributes": {name: _attribute(value) for name, value in device.attributes},
    }
    if device.share is not None:
        body["allowMultipleAllocations"] = True
        body["capacity"] = {BANDWIDTH: _bandwidth(device.share)}
    if taints:
        body["taints"] = [dict(t) for t in taints]
    if binding:
        body["bindsToNode"] = True
        body["bindingConditions"] = [READY]
        body["bindingFailureConditions"] = [FAILED]
    return body


def _bandwidth(share: Share) -> dict[str, Any]:
    """The port's rate as consumable capacity: a request naming none takes the default, one
    naming some is rounded up to a step, none may take more than the port has."""

    def gbps(n: int) -> str:
        return f"{n}G"

    return {
        "value": gbps(share.capacity_gbps),
        "requestPolicy": {
            "default": gbps(share.default_gbps),
            "validRange": {
                "min": gbps(share.step_gbps),
                "max": gbps(share.capacity_gbps),
                "step": gbps(share.step_gbps),
            },
        },
    }


def _attribute(value: AttributeValue) -> dict[str, AttributeValue]:
    if isinstance(value, bool):  # before int: a bool is an int too
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def same_content(stored: Sequence[Mapping[str, Any]], wanted: Sequence[Mapping[str, Any]]) -> bool:
    """Do the stored slices publish what `wanted` does (names, devices, their order in slices),
    whatever generation they carry? A taint's `timeAdded` is compared too: the server keeps
    what we send."""
    return _content(stored) == _content(wanted)


def _content(slices: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, object]]:
    out = []
    for s in slices:
        spec = s.get("spec", {})
        pool = spec.get("pool", {})
        out.append((s["metadata"]["name"], pool.get("resourceSliceCount"), spec.get("devices")))
    return sorted(out, key=lambda c: c[0])


def generation_of(slices: Sequence[Mapping[str, Any]]) -> int:
    """The newest pool generation among stored slices (0 when there are none)."""
    return max(
        (int(s.get("spec", {}).get("pool", {}).get("generation", 0)) for s in slices), default=0
    )


_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def taint_object(taint: Taint, added: str) -> dict[str, str]:
    """The taint as it goes into the slice, `added` an RFC 3339 UTC time (second precision, as
    the API server stores it)."""
    if not _RFC3339.match(added):
        raise ValueError(f"timeAdded {added!r} is not RFC 3339 UTC with second precision")
    return {"key": taint.key, "value": taint.value, "effect": taint.effect, "timeAdded": added}
