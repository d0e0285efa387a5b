"""The fleet (tests/e2e/fleet.py) as DRA drivers announce it, for tests/e2e/test_scale_dra.py and
bench/cluster.py: each node's RDMA NIC ports as rdmaplane's driver publishes them (its own code:
`devices.offer` over the device plugin's default pools, `slices.slice_objects`) and its GPUs as
NVIDIA's GPU DRA driver does (`dra.gpu_slice`); pods naming deploy/dra/'s ResourceClaimTemplates
by GPU count, by the webhook's default table (`rdmaplane.core.settings.webhook.CLAIM_TEMPLATES`,
read from the settings), or the unpaired anchor's (`unpaired_template`: as many GPUs and NIC
ports, no constraint); and one pairing judge for any claim's allocation (`judge_allocation`),
which `judge` runs over the claims the scheduler wrote and the single-node e2e tests run on one.

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
from rdmaplane.core.settings.webhook import DraNodePool
from rdmaplane.services.dra.driver import pools_of
from rdmaplane.services.dra.policy.devices import PCIE_ROOT, DraDevice, offer
from rdmaplane.services.dra.policy.slices import slice_objects
from tests.e2e import fleet
from tests.e2e.controlplane import delete_if_there
from tests.e2e.dra import DRIVER, GPU_CLASS, GPU_DRIVER, gpu_slice, templates

CLAIM = "gpus-nics"  # the pod's name for its claim
UNPAIRED = "gpu-nic-unpaired-x{}"  # the anchor's (unpaired_template), by GPUs; not deployed
DeviceKey = tuple[str, str]  # driver, device
# The drivers of the DeviceClasses deploy/dra's templates name.
CLASS_DRIVERS = {GPU_CLASS["metadata"]["name"]: GPU_DRIVER, DRIVER: DRIVER}


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


def shipped_template(gpus: int) -> dict[str, Any]:
    """deploy/dra/claim-templates.yaml's template for `gpus` GPUs, as the webhook's default
    table names it (the settings' `CLAIM_TEMPLATES`: the one table, not a copy)."""
    name = DraNodePool().template(gpus)
    if name is None:
        raise KeyError(f"the webhook's default DRA table has no template for {gpus} GPUs")
    return copy.deepcopy(templates()[name])


def _sizes() -> dict[str, int]:
    """Template name → GPUs: the default table's, and the anchor's names."""
    return {t.name: t.gpus for t in DraNodePool().claim_templates}


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
    for gpus in sorted(set(sizes) - {0}):
        body = shipped_template(gpus) if paired else unpaired_template(gpus)
        body["metadata"]["namespace"] = namespace
        await kube.create(cast(ResourceClaimTemplate, ResourceClaimTemplate.from_dict(body)))


def pod_body(
    name: str, namespace: str, fleet_label: str, gpus: int, *, paired: bool = True
) -> dict[str, Any]:
    """`fleet.pod_body`'s pod with its GPUs and HCAs asked for through DRA: a claim from the
    shipped template for `gpus` GPUs (`shipped_template`), or with `paired=False` from the
    anchor's asking as many GPUs and NIC ports unpaired (CPU-only pods as there)."""
    body = fleet.pod_body(name, namespace, fleet_label, gpus)
    if gpus:
        template = shipped_template(gpus) if paired else unpaired_template(gpus)
        template = template["metadata"]["name"]
        body["spec"]["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": template}]
        body["spec"]["containers"][0]["resources"] = {"claims": [{"name": CLAIM}]}
    return body


def unpaired_pod_body(name: str, namespace: str, fleet_label: str, gpus: int) -> dict[str, Any]:
    return pod_body(name, namespace, fleet_label, gpus, paired=False)


def _asked(body: Mapping[str, Any]) -> tuple[int, str | None]:
    """The GPUs a pod of `pod_body` asks for, each with a NIC port, and its template's name
    (None: a CPU-only pod)."""
    sizes, prefix = _sizes(), UNPAIRED.format("")
    for claim in body["spec"].get("resourceClaims") or ():
        template = claim.get("resourceClaimTemplateName") or ""
        if template in sizes:
            return sizes[template], template
        if template.startswith(prefix):
            return int(template.removeprefix(prefix)), template
    return 0, None


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
class Verdict:
    """One claim's allocation judged against its own spec (`judge_allocation`)."""

    gpus: int = 0  # GPUs allocated (of NVIDIA's driver)
    # GPUs with a NIC port of the claim on their own PCIe root, each NIC counted once (per
    # root, the lesser of the claim's GPUs and NICs there)
    aligned: int = 0
    wrong: list[str] = field(default_factory=list)  # the claim's own terms broken
    unaligned: list[str] = field(default_factory=list)  # GPUs without a NIC on their root

    @property
    def paired(self) -> bool:
        """Every GPU of the claim beside a NIC of it, and nothing wrong."""
        return not self.wrong and self.aligned == self.gpus


def _requests(devices: Mapping[str, Any]) -> dict[str, tuple[str | None, int | None]]:
    """Request (as allocation results name it: `req`, or `req/alternative` for a
    `firstAvailable` one) → the driver of its DeviceClass, its count (None: `All`)."""
    out: dict[str, tuple[str | None, int | None]] = {}
    for r in devices.get("requests") or ():
        if "exactly" in r:
            asked = [(r["name"], r["exactly"])]
        else:
            asked = [(f"{r['name']}/{a['name']}", a) for a in r.get("firstAvailable") or ()]
        for key, a in asked:
            count = None if a.get("allocationMode") == "All" else int(a.get("count", 1))
            out[key] = (CLASS_DRIVERS.get(a.get("deviceClassName", "")), count)
    return out


def judge_allocation(
    devices: Mapping[str, Any],
    results: Sequence[Mapping[str, Any]],
    roots: Mapping[DeviceKey, str],
) -> Verdict:
    """Any claim's allocation (`status.allocation.devices.results`), judged against its spec
    (`spec.devices`, as the template made it) and the PCIe roots both drivers published:

    - its own terms: every request got devices of its class's driver, as many as its count (at
      least one for `All`), one alternative of a `firstAvailable` request; the devices of the
      requests a `pcieRoot` constraint names (a per-pair template's gpu-k and nic-k) on one root;
    - the aligned check, for every shape (per-pair, count, All, rails, unpaired): how many of
      its GPUs have a NIC port of the claim on their root, each NIC serving one GPU; the GPUs
      without one in `unaligned` (whether that is wrong depends on what the template promises
      on that node: the caller's to say)."""
    asked = _requests(devices)
    out = Verdict()
    got: dict[str, list[Mapping[str, Any]]] = {}
    for r in results:
        got.setdefault(r["request"], []).append(r)
    for key, rs in sorted(got.items()):
        if key not in asked:
            out.wrong.append(f"{', '.join(r['device'] for r in rs)} for {key}, not asked")
            continue
        driver, count = asked[key]
        for r in rs:
            if r["driver"] != driver:
                out.wrong.append(f"{r['device']} of {r['driver']} for {key} ({driver} asked)")
        if count is not None and len(rs) != count:
            out.wrong.append(f"{key}: {len(rs)} devices, {count} asked")
    for r in devices.get("requests") or ():
        alternatives = [k for k in got if k == r["name"] or k.startswith(f"{r['name']}/")]
        if len(alternatives) != 1:
            out.wrong.append(f"{r['name']}: got {alternatives or 'nothing'}")

    def of(request: str) -> list[Mapping[str, Any]]:
        return [x for k, xs in got.items() if k.split("/")[0] == request for x in xs]

    for c in devices.get("constraints") or ():
        if c.get("matchAttribute") != PCIE_ROOT:
            continue  # numaNode: the aligned check below judges what it is for
        named = [x for request in c.get("requests") or () for x in of(request)]
        on = {roots.get((x["driver"], x["device"])) for x in named}
        if len(on) != 1 or None in on:
            where = ", ".join(
                f"{x['device']} on {roots.get((x['driver'], x['device']))}" for x in named
            )
            out.wrong.append(f"{'/'.join(c.get('requests') or ())} not on one PCIe root: {where}")
    gpus = [
        (r["device"], roots.get((r["driver"], r["device"])))
        for r in results
        if r["driver"] == GPU_DRIVER
    ]
    nics = Counter(roots.get((r["driver"], r["device"])) for r in results if r["driver"] == DRIVER)
    out.gpus = len(gpus)
    by_root = Counter(root for _, root in gpus)
    out.aligned = sum(min(n, nics[root]) for root, n in by_root.items() if root)
    short = {root for root, n in by_root.items() if not root or nics[root] < n}
    alone = [f"{d} on {root}" for d, root in gpus if root in short]
    if out.aligned < out.gpus:
        out.unaligned.append(
            f"{out.gpus - out.aligned} of {out.gpus} GPUs without a NIC of the claim on "
            f"their root (among {', '.join(alone)})"
        )
    return out


def promised(template: str | None, sample: str) -> bool:
    """Whether `template` pairs every GPU by PCIe root on a node of `sample`, as its comment in
    deploy/dra/ says (tests/dra_allocator's `PAIRS`, which upstream's allocator holds to those
    comments); the anchor's promise nothing."""
    from tests.dra_allocator.test_templates import PAIRS  # the comments' promises, one table

    return PAIRS.get(template or "", {}).get(sample) == "pcie"


@dataclass
class Pairing:
    """What the scheduler allocated to the bound pods' claims, judged (`judge_allocation`)."""

    claims: int = 0  # bound pods' claims read
    pairs: int = 0  # GPUs asked, each with a NIC port
    # the claims' own terms broken, and GPUs without a NIC on their root where the template
    # promises one on that node (deploy/dra's templates; never the anchor's)
    wrong: list[str] = field(default_factory=list)
    # GPUs with a NIC port of their claim on their own PCIe root (each NIC once): all of them
    # where the template promises it; for the anchor's, what chance paired
    aligned: int = 0
    # GPUs without a NIC on their root where the template does not promise one on that node
    # shape (its comment says so: gpu-nic-node-x8 on the L40S server): reported, not wrong
    loose: int = 0
    loose_where: list[str] = field(default_factory=list)
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
    """Every bound pod's claim, as the API server holds it, by `judge_allocation` against the
    claim's own spec: its terms kept, as many GPUs as the pod asked, every device on the pod's
    node and in no other claim, and its GPUs each beside a NIC of the claim where the template
    promises that on the node's shape (`promised`); the anchor's GPUs beside a NIC by chance
    counted in `aligned`."""
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
        gpus, template = _asked(pods[name])
        if not gpus:
            continue
        claim = claims.get(name) or {}
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        if not results:
            out.unallocated.append(name)
            continue
        out.claims += 1
        out.pairs += gpus
        node = by_node[where.node]
        for r in results:
            held[(r["driver"], r["pool"], r["device"])] += 1
            if r["pool"] != where.node:
                out.elsewhere.append(f"{name}: {r['device']} of {r['pool']}, pod on {where.node}")
        verdict = judge_allocation(claim["spec"]["devices"], results, roots_of(node))
        out.wrong += [f"{name} ({template}): {w}" for w in verdict.wrong]
        if verdict.gpus != gpus:
            out.wrong.append(f"{name} ({template}): {verdict.gpus} GPUs, {gpus} asked")
        out.aligned += verdict.aligned
        if template is not None and not template.startswith(UNPAIRED.format("")):
            said = [f"{name} ({template}, {node.sample}): {u}" for u in verdict.unaligned]
            if promised(template, node.sample):
                out.wrong.extend(said)
            else:
                out.loose += verdict.gpus - verdict.aligned
                out.loose_where.extend(said)
    out.doubled = [f"{d} of {p} ({drv}) in {n} claims" for (drv, p, d), n in held.items() if n > 1]
    return out


async def judge_claim(
    kube: AsyncClient, namespace: str, claim: str, roots: Mapping[DeviceKey, str]
) -> Verdict:
    """`judge_allocation` on one claim as the API server holds it, once it is allocated."""
    stored = (await kube.get(ResourceClaim, claim, namespace=namespace)).to_dict()
    results = stored["status"]["allocation"]["devices"]["results"]
    return judge_allocation(stored["spec"]["devices"], results, roots)
