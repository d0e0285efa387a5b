"""Is an offered port ready for a pod, healthy for the kubelet, and what the claim says; pure.

One verdict per device feeds three consumers, so they never disagree:

- **binding conditions**: the driver publishes its devices with `bindingConditions: [READY]`
  and `bindingFailureConditions: [FAILED]`; kube-scheduler binds a pod only once `READY` is
  True for every such device of its claims, and gives the claim up (deallocates it, tries
  again elsewhere) when `FAILED` is True. `binding_status` is what the driver writes into the
  claim's `status.devices`: `READY` True when the port can carry the pod's traffic (the
  device plugin's rule, `rdmaplane.core.usability`: ACTIVE and LinkUp, a verbs device node, an
  NCCL plan, i.e. on RoCE the GID index the pool's policy picks holds an address) and no
  fatal fault; else `FAILED` True with the reason. The conditions follow the port while the
  claim stays allocated (a claim shared by a later pod is judged again then).
- **health**: what the kubelet shows in `containerStatuses[].allocatedResourcesStatus`:
  Healthy, or Unhealthy with the message, when the port cannot be handed out or has any fault
  (a degraded fault alone can still be bound to, but its pods are told).
- **taints** stay in `slices` (they keep new claims away; this tells the claims that have it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rdmaplane.core import names
from rdmaplane.core.faults import Fault
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.porthealth import FaultClass, PortKey
from rdmaplane.core.usability import Unusable
from rdmaplane.services.dra.policy.devices import DraDevice

READY = names.CLAIM_READY_CONDITION
FAILED = names.CLAIM_FAILED_CONDITION
PORT_READY = "PortReady"
DEVICE_GONE = "DeviceGone"  # allocated, but this node no longer offers it


@dataclass(frozen=True, slots=True)
class Readiness:
    """One device's verdict. `reason` is a condition reason word (`PortReady`, a reason of
    `rdmaplane.core.usability` such as `PortDown`, `FatalFault`, `DegradedFault`, `DeviceGone`)."""

    bindable: bool  # a pod may be bound to a claim holding it
    healthy: bool  # what the kubelet shows
    reason: str
    message: str


def fault_reason(cls: FaultClass) -> str:
    return f"{cls.value.capitalize()}Fault"


def readiness(
    topo: NodeTopology,
    devices: Mapping[str, DraDevice],
    unusable: Mapping[str, Unusable],
    faults: Mapping[PortKey, Fault],
) -> dict[str, Readiness]:
    """Every offered device's verdict, by name: why it cannot be handed out comes first, then
    its fault, else ready (the message says which GID index holds which address on RoCE)."""
    out = {}
    for name, device in devices.items():
        problem = unusable.get(name)
        fault = faults.get((device.hca, device.port))
        if problem is not None:
            out[name] = Readiness(False, False, problem.reason, problem.message)
        elif fault is not None:
            fatal = fault.cls == FaultClass.FATAL
            message = f"{device.hca} port {device.port}: {fault.cls.value} fault: {fault.reason}"
            out[name] = Readiness(not fatal, False, fault_reason(fault.cls), message)
        else:
            out[name] = Readiness(True, True, PORT_READY, _ready_message(topo, device))
    return out


def _ready_message(topo: NodeTopology, device: DraDevice) -> str:
    text = f"{device.hca} port {device.port} is ACTIVE"
    index = device.attribute("gidIndex")
    hca = topo.hca(device.hca)
    port = hca.port(device.port) if hca is not None else None
    gid = next((g for g in port.gids if g.index == index), None) if port is not None else None
    if gid is not None and gid.ip is not None:
        text += f"; GID index {index} holds {gid.ip}"
    return text


def gone(device: str) -> Readiness:
    return Readiness(False, False, DEVICE_GONE, f"device {device} is not offered on this node")


def waiting_results(claim: Mapping[str, Any], driver: str, pool: str) -> list[Mapping[str, Any]]:
    """The claim's allocated devices of `driver` from `pool` that carry binding conditions."""
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    return [
        r
        for r in results
        if r.get("driver") == driver and r.get("pool") == pool and r.get("bindingConditions")
    ]


def binding_status(
    claim: Mapping[str, Any],
    *,
    driver: str,
    pool: str,
    verdicts: Mapping[str, Readiness],
    now: str,
) -> list[dict[str, Any]] | None:
    """The claim's `status.devices` with the binding conditions of this driver's devices of
    `pool` brought up to date (`now`: RFC 3339, for a condition that changes status), or None
    when nothing would change. Entries of other drivers and conditions of other types are
    kept as they are."""
    status = claim.get("status") or {}
    ours = waiting_results(claim, driver, pool)
    if not ours:
        return None
    generation = (claim.get("metadata") or {}).get("generation")
    before: list[dict[str, Any]] = [dict(d) for d in status.get("devices") or []]
    after = [dict(d) for d in before]
    for result in ours:
        key = _key(result)
        entry = next((d for d in after if _key(d) == key), None)
        if entry is None:
            entry = {
                k: v for k, v in zip(("driver", "pool", "device", "shareID"), key, strict=True) if v
            }
            entry["conditions"] = []
            after.append(entry)
        verdict = verdicts.get(result["device"]) or gone(result["device"])
        conditions = list(entry.get("conditions") or [])
        for wanted, true in ((READY, verdict.bindable), (FAILED, not verdict.bindable)):
            named = result.get(
                "bindingConditions" if wanted == READY else "bindingFailureConditions"
            )
            if wanted in (named or ()):
                conditions = _set(conditions, wanted, true, verdict, now, generation)
        entry["conditions"] = conditions
    return None if after == before else after


def _key(d: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (d.get("driver", ""), d.get("pool", ""), d.get("device", ""), d.get("shareID") or "")


def _set(
    conditions: Sequence[Mapping[str, Any]],
    kind: str,
    true: bool,
    verdict: Readiness,
    now: str,
    generation: object,
) -> list[dict[str, Any]]:
    """`conditions` with the one of type `kind` set; its lastTransitionTime kept unless its
    status changes (as meta.SetStatusCondition does)."""
    status = "True" if true else "False"
    old = next((c for c in conditions if c.get("type") == kind), None)
    new: dict[str, Any] = {
        "type": kind,
        "status": status,
        "reason": verdict.reason,
        "message": verdict.message,
        "lastTransitionTime": (
            old["lastTransitionTime"]
            if old is not None and old.get("status") == status and old.get("lastTransitionTime")
            else now
        ),
    }
    if isinstance(generation, int):
        new["observedGeneration"] = generation
    if old is None:
        return [*map(dict, conditions), new]
    return [new if c is old else dict(c) for c in conditions]
