"""An allocated ResourceClaim → what the container runtime must add; pure.

The kubelet names a claim (namespace, name, UID); its allocation says which devices of which
driver and pool it got, per request, and carries the opaque configuration of the claim and its
DeviceClasses. For this driver's devices the answer is one CDI spec per claim, written as a
*transient* spec (`<vendor>-<class>_<claim UID>`, as the CDI library names them):

- one CDI device per allocated device, named `<claim UID>-<device>` (and `-<share ID>` for a
  share of a shared port), holding its HCA's verbs device node (`/dev/infiniband/uverbsN`) and
  its port's `umadN`;
- the spec's own edits, applied once to every container that gets any of the claim's devices:
  `/dev/infiniband/rdma_cm` and the NCCL/UCX environment of exactly the claim's devices (the
  same plan the device plugin's Allocate makes: `nccl.nccl_env`), with `RDMAPLANE_RAILS` when
  every device names its `rail`.

The environment is the claim's: a container that takes only some requests of a claim gets
their device nodes but the whole claim's environment (CDI merges per device, and NCCL_IB_HCA is
one list); give such containers a claim each.

Opaque configuration (`RdmaDeviceConfig`) for this driver applies to the requests it names (all
when none), class configuration before claim configuration, the last one winning. Every device
of a claim must end up with the same settings (the environment is one), else the claim fails.
Every failure is a `ClaimError` whose message names the claim: the kubelet shows it in the pod's
events and tries again; the driver never fails the whole batch for one claim.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from rdmaplane.core.decoding import DecodeError, convert
from rdmaplane.core.errors import InputError
from rdmaplane.core.model import Hca, NodeTopology, Port
from rdmaplane.core.nccl import NcclPlanError, NcclSettings, nccl_env, rails_env
from rdmaplane.core.usability import DEV_DIR
from rdmaplane.services.dra.policy.devices import DraDevice

CDI_CLASS = "claim"
CDI_VERSION = "0.5.0"  # the lowest that allows device names starting with a digit (claim UIDs)

ReadConfig = Callable[[object, str], NcclSettings | None]


class ClaimError(InputError):
    """This claim cannot be prepared on this node, and why (one line naming the claim)."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None  # the allocation's share of a device several claims hold


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """What NodePrepareResources answers for a claim, and the CDI spec behind it (None when the
    claim holds none of this driver's devices on this node)."""

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    spec_name: str
    spec: Mapping[str, Any] | None


def cdi_vendor(driver: str) -> str:
    return f"k8s.{driver}"


def spec_name(driver: str, uid: str) -> str:
    """The transient spec's file name without extension (the CDI library's scheme)."""
    return f"{cdi_vendor(driver)}-{CDI_CLASS}_{uid.replace('/', '_')}"


@dataclass(frozen=True, slots=True)
class _Allocated:
    request: str
    device: DraDevice
    hca: Hca
    port: Port
    share_id: str | None


# The ResourceClaim as this driver reads it (resource.k8s.io/v1; every other field skipped).


class _Meta(msgspec.Struct, frozen=True):
    uid: str | None = None


class _Result(msgspec.Struct, frozen=True):
    request: str = ""
    driver: str = ""
    pool: str = ""
    device: str = ""
    share_id: str | None = msgspec.field(default=None, name="shareID")


class _Opaque(msgspec.Struct, frozen=True):
    driver: str = ""
    parameters: Any = None  # the driver's own config, read by `read_config`


class _Config(msgspec.Struct, frozen=True):
    source: str = "FromClaim"
    requests: tuple[str, ...] | None = None
    opaque: _Opaque | None = None


class _Devices(msgspec.Struct, frozen=True):
    results: tuple[_Result, ...] | None = None
    config: tuple[_Config, ...] | None = None


class _Allocation(msgspec.Struct, frozen=True):
    devices: _Devices | None = None


class _Status(msgspec.Struct, frozen=True):
    allocation: _Allocation | None = None


class _Claim(msgspec.Struct, frozen=True):
    metadata: _Meta = _Meta()
    status: _Status | None = None


def _read(claim: Mapping[str, Any], ref: ClaimRef) -> _Claim:
    try:
        return convert(claim, _Claim)
    except DecodeError as e:
        what = e.reason.removeprefix("expected ")
        raise ClaimError(f"claim {ref}: {e.path or 'the claim'} is not {what}") from None


def prepare(
    claim: Mapping[str, Any],
    ref: ClaimRef,
    *,
    driver: str,
    pool: str,
    devices: Mapping[str, DraDevice],
    topo: NodeTopology,
    pool_settings: Mapping[str, NcclSettings],
    read_config: ReadConfig,
    present: Callable[[str], bool],
) -> PreparedClaim:
    """Prepare one claim (see the module docstring). `present(name)`: does
    `/dev/infiniband/<name>` exist on the host."""
    read = _read(claim, ref)
    if read.metadata.uid != ref.uid:
        raise ClaimError(
            f"claim {ref}: the API server holds UID {read.metadata.uid}, the kubelet asked for "
            f"{ref.uid} (the claim was deleted and created again)"
        )
    allocation = read.status.allocation if read.status else None
    if allocation is None:
        raise ClaimError(f"claim {ref}: not allocated")
    listed = allocation.devices or _Devices()
    ours = [r for r in listed.results or () if r.driver == driver]
    allocated = [_allocated(r, ref, pool, devices, topo) for r in ours]
    name = spec_name(driver, ref.uid)
    if not allocated:
        return PreparedClaim(ref, (), name, None)
    settings = _settings(listed.config or (), ref, driver, allocated, pool_settings, read_config)
    ports = list(dict.fromkeys((a.hca, a.port) for a in allocated))  # two shares: one port
    try:
        env = nccl_env(topo, ports, settings)
    except NcclPlanError as e:
        raise ClaimError(f"claim {ref}: no NCCL plan for its devices: {e}") from None
    env |= rails_env(env, _rails(allocated))
    vendor = cdi_vendor(driver)
    cdi_devices = [_cdi_device(a, ref, present) for a in allocated]
    spec: dict[str, Any] = {
        "cdiVersion": CDI_VERSION,
        "kind": f"{vendor}/{CDI_CLASS}",
        "devices": cdi_devices,
        "containerEdits": {
            "env": [f"{k}={v}" for k, v in sorted(env.items())],
            "deviceNodes": _nodes(["rdma_cm"], present),
        },
    }
    prepared = tuple(
        PreparedDevice(
            (a.request.split("/", 1)[0],),
            pool,
            a.device.name,
            (f"{vendor}/{CDI_CLASS}={d['name']}",),
            a.share_id,
        )
        for a, d in zip(allocated, cdi_devices, strict=True)
    )
    return PreparedClaim(ref, prepared, name, spec)


def _rails(allocated: Sequence[_Allocated]) -> dict[str, int]:
    """Each allocated HCA's rail, where its device names one (the fabric known)."""
    return {a.hca.name: r for a in allocated if isinstance(r := a.device.attribute("rail"), int)}


def _allocated(
    result: _Result,
    ref: ClaimRef,
    pool: str,
    devices: Mapping[str, DraDevice],
    topo: NodeTopology,
) -> _Allocated:
    request, name = result.request, result.device
    if result.pool != pool:
        raise ClaimError(
            f"claim {ref}: device {name} (request {request}) was allocated from pool "
            f"{result.pool!r}; this node's pool is {pool!r}"
        )
    device = devices.get(name)
    hca = topo.hca(device.hca) if device is not None else None
    port = hca.port(device.port) if device is not None and hca is not None else None
    if device is None or hca is None or port is None:
        raise ClaimError(
            f"claim {ref}: device {name} (request {request}) is not on this node any more"
        )
    return _Allocated(request, device, hca, port, result.share_id or None)


def _settings(
    entries: Sequence[_Config],
    ref: ClaimRef,
    driver: str,
    allocated: Sequence[_Allocated],
    pool_settings: Mapping[str, NcclSettings],
    read_config: ReadConfig,
) -> NcclSettings:
    """The one NCCL setting for the claim's devices (see the module docstring)."""
    configs = []
    for i, entry in enumerate(entries):
        if entry.opaque is None or entry.opaque.driver != driver:
            continue
        where = f"claim {ref}: config[{i}] ({entry.source})"
        try:
            settings = read_config(entry.opaque.parameters, where)
        except ValueError as e:
            raise ClaimError(str(e)) from None
        configs.append((entry.source != "FromClass", i, entry.requests or (), settings))
    configs.sort(key=lambda c: (c[0], c[1]))  # class configs first, then the claim's, in order
    chosen: dict[str, tuple[str, NcclSettings]] = {}
    for a in allocated:
        origin, settings = f"pool {a.device.pool}", pool_settings.get(a.device.pool)
        for _, i, requests, given in configs:
            applies = not requests or a.request in requests or _base(a.request) in requests
            if applies and given is not None:
                origin, settings = f"config[{i}]", given
        chosen[a.device.name] = (origin, settings or NcclSettings())
    distinct = {s for _, s in chosen.values()}
    if len(distinct) > 1:
        origins = ", ".join(sorted({f"{d} from {o}" for d, (o, _) in chosen.items()}))
        raise ClaimError(
            f"claim {ref}: its devices get different NCCL settings ({origins}); a claim has one "
            "environment: give all its RDMA requests the same configuration"
        )
    return distinct.pop()


def _base(request: str) -> str:
    return request.split("/", 1)[0]


def _cdi_device(a: _Allocated, ref: ClaimRef, present: Callable[[str], bool]) -> dict[str, Any]:
    if a.hca.uverbs is None or not present(a.hca.uverbs):
        missing = f"{DEV_DIR}/{a.hca.uverbs}" if a.hca.uverbs else "no uverbs device in sysfs"
        raise ClaimError(f"claim {ref}: {a.hca.name} has no verbs device node ({missing})")
    names = [a.hca.uverbs, *([a.port.umad] if a.port.umad else [])]
    return {
        "name": "-".join(filter(None, (ref.uid, a.device.name, a.share_id))),
        "containerEdits": {"deviceNodes": _nodes(names, present)},
    }


def _nodes(names: Sequence[str], present: Callable[[str], bool]) -> list[dict[str, str]]:
    return [{"path": f"{DEV_DIR}/{n}", "permissions": "rw"} for n in names if present(n)]
