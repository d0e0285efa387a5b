"""The fleet (tests/e2e/fleet.py) as DRA drivers announce it, for tests/e2e/test_scale_dra.py and
bench/cluster.py: each node's RDMA NIC ports as rdmaplane's driver publishes them (its own code:
`devices.offer` over the device plugin's default pools, `slices.slice_objects`) and its GPUs as
NVIDIA's GPU DRA driver does (`dra.gpu_slice`); pods naming deploy/dra/'s ResourceClaimTemplates
that pair each GPU with a NIC port on its PCIe root, or the unpaired anchor's (`unpaired_template`:
as many GPUs and NIC ports, no constraint); and the judge, reading the allocations the scheduler
wrote into the claims.

The driver's devices go out without binding conditions (`dra.bindingConditions: false`): no
driver runs beside a KWOK node to say its ports are ready, and with them every binding would
wait for that write and kube-scheduler's next look (up to 5 s, docs/dra.md).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from lightkube import AsyncClient
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimTemplate, ResourceSlice

from rdmaplane.adapters.discovery.samples import read_sample
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.core.settings.dra import DraSettings
from rdmaplane.services.dra.driver import pools_of
from rdmaplane.services.dra.policy.devices import PCIE_ROOT, DraDevice, offer
from rdmaplane.services.dra.policy.slices import slice_objects
from tests.e2e import fleet
from tests.e2e.controlplane import delete_if_there
from tests.e2e.dra import DRIVER, GPU_CLASS, GPU_DRIVER, gpu_slice, templates

CLAIM = "gpus-nics"  # the pod's name for its claim
PAIRS = "gpu-nic-pcie-x{}"  # deploy/dra/claim-templates.yaml's names, by pairs
UNPAIRED = "gpu-nic-unpaired-x{}"  # the anchor's (unpaired_template), by GPUs; not deployed
DeviceKey = tuple[str, str]  # driver, device


@dataclass(frozen=True)
class _Sample:
    topo: NodeTopology
    devices: tuple[DraDevice, ...]  # rdmaplane's driver's
    roots: dict[DeviceKey, str]  # every device's PCIe root, both drivers'


@functools.cache
def _sample(name: str) -> _Sample:
    topo = read_sample(name)
    devices = offer(topo, pools_of(PluginSettings().pools, DraSettings().sharing))
    roots = {(GPU_DRIVER, f"gpu-{g.index}"): g.pci.root for g in topo.gpus}
    for device_name, device in devices.items():
        root = device.attribute(PCIE_ROOT)
        if isinstance(root, str):
            roots[(DRIVER, device_name)] = root
    return _Sample(topo, tuple(devices.values()), roots)


def slices_of(node: fleet.FleetNode) -> list[dict[str, Any]]:
    """The node's ResourceSlices: rdmaplane's driver's, then NVIDIA's GPU driver's."""
    sample = _sample(node.sample)
    ours = slice_objects(DRIVER, node.name, sample.devices, {}, generation=1)
    return [*ours, gpu_slice(node.name, sample.topo)]


def roots_of(node: fleet.FleetNode) -> dict[DeviceKey, str]:
    return _sample(node.sample).roots


async def create_slices(kube: AsyncClient, nodes: Sequence[fleet.FleetNode]) -> int:
    """Publish every node's slices; how many."""
    bodies = [s for n in nodes for s in slices_of(n)]

    async def one(body: dict[str, Any]) -> None:
        await kube.create(cast(ResourceSlice, ResourceSlice.from_dict(body)))

    await fleet.bounded(fleet.CREATE_PARALLEL, (functools.partial(one, b) for b in bodies))
    return len(bodies)


async def delete_slices(kube: AsyncClient, nodes: Sequence[fleet.FleetNode]) -> None:
    names = [s["metadata"]["name"] for n in nodes for s in slices_of(n)]
    drops = (functools.partial(delete_if_there, kube, ResourceSlice, n) for n in names)
    await fleet.bounded(fleet.CREATE_PARALLEL, drops)


# ---------------------------------------------------------------- the pods


def pair_template(pairs: int) -> dict[str, Any]:
    """The ResourceClaimTemplate for `pairs` GPU+NIC pairs, each on one PCIe root: deploy/dra's
    when it has that size, else `by_pattern`."""
    known = templates().get(PAIRS.format(pairs))
    return copy.deepcopy(known) if known is not None else by_pattern(pairs)


def by_pattern(pairs: int) -> dict[str, Any]:
    """A template of `pairs` pairs made by deploy/dra's pattern: its one-pair template's GPU
    request, NIC request and constraint, once per pair (`gpu-k`, `nic-k`)."""
    one = templates()[PAIRS.format(1)]
    devices = one["spec"]["spec"]["devices"]
    (gpu, nic), (constraint,) = devices["requests"], devices["constraints"]
    requests, constraints = [], []
    for k in range(pairs):
        requests += [{**gpu, "name": f"gpu-{k}"}, {**nic, "name": f"nic-{k}"}]
        constraints.append({**constraint, "requests": [f"gpu-{k}", f"nic-{k}"]})
    body = copy.deepcopy(one)
    body["metadata"] = {"name": PAIRS.format(pairs)}
    body["spec"]["spec"]["devices"] = {"requests": requests, "constraints": constraints}
    return body


def unpaired_template(gpus: int) -> dict[str, Any]:
    """The anchor's ResourceClaimTemplate for `gpus` GPUs and as many NIC ports, in no relation
    to each other: one request per DeviceClass, `count: gpus` (allocationMode ExactCount), no
    selector beyond the class, no constraint.

    Upstream's DRA benchmark (kubernetes v1.37's test/integration/scheduler_perf/dra/
    performance-config.yaml, SchedulingWithResourceClaimTemplate with templates/
    resourceclaimtemplate.yaml) asks one device of one class in one request, with no selector
    and no constraint. For one GPU this template is that claim once per driver. For N GPUs it
    keeps one request per class and asks `count: N` rather than N requests of one device each:
    with no constraint, a count-1 request per device would bring back the allocator's search
    over the requests' orders on a node one device short (field notes: every order of same-class
    requests is tried before the node is rejected), so the anchor would measure that search, not
    what DRA itself costs; within one request the allocator tries combinations only (PR
    #133678, in the incubating allocator v1.37 runs by default). What the template leaves out
    against deploy/dra's is exactly the pairing: a GPU's NIC may sit on any root of the node."""
    gpu_class = GPU_CLASS["metadata"]["name"]
    nic_class = DRIVER  # deploy/dra/deviceclass.yaml's class bears the driver's name
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": UNPAIRED.format(gpus)},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpus", "exactly": {"deviceClassName": gpu_class, "count": gpus}},
                        {"name": "nics", "exactly": {"deviceClassName": nic_class, "count": gpus}},
                    ]
                }
            }
        },
    }


async def create_templates(
    kube: AsyncClient, namespace: str, sizes: Iterable[int], *, paired: bool = True
) -> None:
    """The templates the pods of `pod_body(paired=...)` name, for every size in `sizes`."""
    for pairs in sorted(set(sizes) - {0}):
        body = pair_template(pairs) if paired else unpaired_template(pairs)
        body["metadata"]["namespace"] = namespace
        await kube.create(cast(ResourceClaimTemplate, ResourceClaimTemplate.from_dict(body)))


def pod_body(
    name: str, namespace: str, fleet_label: str, gpus: int, *, paired: bool = True
) -> dict[str, Any]:
    """`fleet.pod_body`'s pod with its GPUs and HCAs asked for through DRA: a claim from the
    template pairing `gpus` GPUs with NIC ports on their PCIe roots, or with `paired=False` from
    the anchor's asking as many GPUs and NIC ports unpaired (CPU-only pods as there)."""
    body = fleet.pod_body(name, namespace, fleet_label, gpus)
    if gpus:
        template = (PAIRS if paired else UNPAIRED).format(gpus)
        body["spec"]["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": template}]
        body["spec"]["containers"][0]["resources"] = {"claims": [{"name": CLAIM}]}
    return body


def unpaired_pod_body(name: str, namespace: str, fleet_label: str, gpus: int) -> dict[str, Any]:
    return pod_body(name, namespace, fleet_label, gpus, paired=False)


def _asked(body: Mapping[str, Any]) -> tuple[int, bool]:
    """The GPUs a pod of `pod_body` asks for, each with a NIC port, and whether paired."""
    for claim in body["spec"].get("resourceClaims") or ():
        template = claim.get("resourceClaimTemplateName") or ""
        for names, paired in ((PAIRS, True), (UNPAIRED, False)):
            prefix = names.format("")
            if template.startswith(prefix):
                return int(template.removeprefix(prefix)), paired
    return 0, True


def pairs_of(body: Mapping[str, Any]) -> int:
    """The GPUs a pod of `pod_body` asks for, each with a NIC port: paired on a PCIe root, or
    unpaired (the anchor's); 0: none, a CPU-only pod."""
    return _asked(body)[0]


async def wait_for_claims(kube: AsyncClient, namespace: str, count: int, within: float) -> None:
    """Until kube-controller-manager made `count` claims in `namespace` (one per pod naming a
    template); TimeoutError after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        made = len([c async for c in kube.list(ResourceClaim, namespace=namespace)])
        if made >= count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{namespace}: {made} of {count} claims made")
        await asyncio.sleep(0.5)


# ---------------------------------------------------------------- the judge


@dataclass
class Pairing:
    """What the scheduler allocated to the bound pods' claims, judged."""

    claims: int = 0  # bound pods' claims read
    pairs: int = 0  # GPU+NIC pairs among them (unpaired claims: GPUs asked, each with a NIC)
    wrong: list[str] = field(default_factory=list)  # pairs not on one PCIe root, or missing
    # GPUs that got a NIC of the claim on their own PCIe root: every pair of a paired claim
    # judged right; for unpaired claims, the most GPUs a NIC of theirs on one root could serve
    # (per root, the lesser of its GPUs and NICs in the claim), i.e. what chance paired
    aligned: int = 0
    elsewhere: list[str] = field(default_factory=list)  # devices not on the pod's node
    unallocated: list[str] = field(default_factory=list)  # bound pods whose claim has none
    doubled: list[str] = field(default_factory=list)  # devices allocated to two claims

    @property
    def problems(self) -> int:
        return len(self.wrong) + len(self.elsewhere) + len(self.unallocated) + len(self.doubled)


def _owner(claim: Mapping[str, Any]) -> str | None:
    owners = claim["metadata"].get("ownerReferences") or []
    return next((o["name"] for o in owners if o.get("kind") == "Pod"), None)


async def judge(
    kube: AsyncClient,
    namespace: str,
    nodes: Iterable[fleet.FleetNode],
    pods: Mapping[str, Mapping[str, Any]],
    bound: Mapping[str, fleet.Bound],
) -> Pairing:
    """Every bound pod's claim, as the API server holds it: each GPU-k/NIC-k pair on the pod's
    node, of the right drivers, on one PCIe root (from the slices both drivers published), and
    no device in two claims. An unpaired claim (the anchor's): as many GPUs and NIC ports as
    asked, of the right drivers, on the pod's node, none in two claims; its GPUs whose root got
    one of its NICs counted in `aligned`."""
    by_node = {n.name: n for n in nodes}
    claims = {}
    async for c in kube.list(ResourceClaim, namespace=namespace):
        body = c.to_dict()
        owner = _owner(body)
        if owner is not None:
            claims[owner] = body
    out = Pairing()
    held: Counter[tuple[str, str, str]] = Counter()
    for name, where in sorted(bound.items()):
        pairs, paired = _asked(pods[name])
        if not pairs:
            continue
        claim = claims.get(name)
        allocation = ((claim or {}).get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        if not results:
            out.unallocated.append(name)
            continue
        out.claims += 1
        roots = roots_of(by_node[where.node])
        got = {r["request"]: r for r in results}
        for r in results:
            held[(r["driver"], r["pool"], r["device"])] += 1
            if r["pool"] != where.node:
                out.elsewhere.append(f"{name}: {r['device']} of {r['pool']}, pod on {where.node}")
        if not paired:
            _judge_unpaired(out, name, pairs, results, roots)
            continue
        for k in range(pairs):
            out.pairs += 1
            gpu, nic = got.get(f"gpu-{k}"), got.get(f"nic-{k}")
            if gpu is None or nic is None:
                out.wrong.append(f"{name}: pair {k} missing")
                continue
            a = roots.get((gpu["driver"], gpu["device"])) if gpu["driver"] == GPU_DRIVER else None
            b = roots.get((nic["driver"], nic["device"])) if nic["driver"] == DRIVER else None
            if a is None or a != b:
                out.wrong.append(
                    f"{name}: pair {k}: {gpu['device']} on {a}, {nic['device']} on {b}"
                )
            else:
                out.aligned += 1
    out.doubled = [f"{d} of {p} ({drv}) in {n} claims" for (drv, p, d), n in held.items() if n > 1]
    return out


def _judge_unpaired(
    out: Pairing,
    name: str,
    gpus: int,
    results: Sequence[Mapping[str, Any]],
    roots: Mapping[DeviceKey, str],
) -> None:
    """An unpaired claim's allocation: `gpus` GPUs of NVIDIA's driver and as many NIC ports of
    ours; how many GPUs chance put beside one of the claim's NICs (one NIC serves one GPU)."""
    out.pairs += gpus
    by_driver: dict[str, Counter[str | None]] = {GPU_DRIVER: Counter(), DRIVER: Counter()}
    for r in results:
        request = {"gpus": GPU_DRIVER, "nics": DRIVER}.get(r["request"])
        if request is None or r["driver"] != request:
            out.wrong.append(f"{name}: {r['device']} of {r['driver']} for {r['request']}")
            continue
        by_driver[request][roots.get((r["driver"], r["device"]))] += 1
    for driver, got in by_driver.items():
        if got.total() != gpus:
            out.wrong.append(f"{name}: {got.total()} devices of {driver}, {gpus} asked")
    gpu_roots, nic_roots = by_driver[GPU_DRIVER], by_driver[DRIVER]
    out.aligned += sum(min(n, nic_roots[root]) for root, n in gpu_roots.items() if root)
