"""The extender's prediction against what the kubelet's own code did, one pod at a time.

Every pod is predicted from the NodeResourceTopology the agent would publish from the kubelet's
real allocations so far (`KubeletHarness.published`), so an earlier mistake cannot snowball.
Two levels are compared:

1. The pod, as the extender decides it (`fit.evaluate`): fits or not, against the
   kubelet's admission (the Topology Manager's `TopologyAffinityError`, or the device manager's
   `UnexpectedAdmissionError` when devices run out under best-effort/none).
2. Each container, replayed from the real node state before it (the devices the kubelet really
   gave the pod's earlier containers, and what its init containers left to reuse): the
   Topology Manager's hint (NUMA affinity, preferred, admitted) against `GetAffinity`, whether
   the device manager can allocate it, and the NUMA zones of the devices it got (how many of
   each resource per zone, which also settles NUMA pairing and what came from outside the
   affinity), and that the PCIe pairs really made are no more than the predicted best.

Which devices a container gets is the kubelet's decision only as far as NUMA zones go, and not
even there when the device plugins have a choice: inside an affinity of several zones that holds
more free devices than asked for, under policy `none`, or among reusable devices of several
zones (the device manager takes those in Go map order). There the per-zone counts may differ
from the prediction's plan without it being wrong; the pod is then marked `diverged`, and a
level-1 difference after that point is counted, not failed (level 2 still holds exactly).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rdmaplane.core.resources import Amounts
from rdmaplane.services.scheduler.policy import (
    devicemanager,
    fit,
    nodestate,
    numamask,
    podrequest,
    topologymanager,
)
from tests.kubelet.harness import (
    RESOURCES,
    Admission,
    ContainerAdmission,
    DeviceFact,
    KubeletHarness,
)

KINDS = ("init", "sidecar", "app")


@dataclass(frozen=True)
class Container:
    kind: str  # init | sidecar | app
    gpus: int = 0
    hcas: int = 0
    shared: int = 0
    zeros: bool = False  # name the resources it wants none of, with a count of "0"

    @property
    def named(self) -> bool:
        """Whether the container names a device resource at all (so the kubelet hints it)."""
        return any(self.counts) or (self.zeros and 0 in self.counts)

    @property
    def counts(self) -> tuple[int, int, int]:
        """GPUs, exclusive HCAs, shared slots."""
        return (self.gpus, self.hcas, self.shared)


@dataclass(frozen=True)
class PodShape:
    """A pod's containers in the kubelet's order: init containers and sidecars, then apps."""

    containers: tuple[Container, ...]

    def kubelet_order(self) -> list[Container]:
        """The containers as the kubelet admits them (and as the manifest lists them): init
        containers and sidecars, then apps, then the empty app a pod without apps is given."""
        init = [c for c in self.containers if c.kind != "app"]
        apps = [c for c in self.containers if c.kind == "app"] or [Container("app")]
        return init + apps

    def manifest(self, name: str, resources: Sequence[str] = RESOURCES) -> dict[str, Any]:
        """The pod, asking for `resources` (GPU, exclusive pool, shared pool) by name."""
        init, apps = [], []
        for i, c in enumerate(self.containers):
            limits = {k: str(v) for k, v in zip(resources, c.counts, strict=True) if v or c.zeros}
            body: dict[str, Any] = {
                "name": f"{c.kind}-{i}",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": limits, "requests": limits},
            }
            if c.kind == "app":
                apps.append(body)
            else:
                if c.kind == "sidecar":
                    body["restartPolicy"] = "Always"
                init.append(body)
        if not apps:  # a pod needs an app container; this one asks for nothing
            apps.append({"name": "main", "image": "registry.k8s.io/pause:3.10"})
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"initContainers": init, "containers": apps},
        }


@dataclass(frozen=True)
class Outcome:
    """One pod: the prediction, the kubelet's answer, what disagrees, what the plugins chose."""

    shape: PodShape
    verdict: fit.Verdict
    admission: Admission
    disagreements: tuple[str, ...]
    choices: int  # containers whose devices' NUMA zones the plugins chose
    diverged: bool  # a plugin's choice differed from the prediction's plan, before the end


def numa_ids(state: nodestate.NodeState) -> tuple[int, ...]:
    return tuple(int(z.name.removeprefix("node-")) for z in state.zones)


def kubelet_affinity(
    state: nodestate.NodeState, hint: numamask.Hint | None
) -> tuple[tuple[int, ...] | None, bool]:
    """What `GetAffinity` answers for a container given the predicted hint."""
    if hint is None:  # policy none: no hint is ever stored
        return None, False
    ids = numa_ids(state)
    full = (1 << len(ids)) - 1
    if state.policy == "single-numa-node" and hint.mask == full:
        return None, hint.preferred  # the whole machine's mask is handed out as "any"
    return tuple(ids[z] for z in range(len(ids)) if hint.mask >> z & 1), hint.preferred


class _Locator:
    """Device IDs to (zone, root) positions of a node state, and back to Roots counts."""

    def __init__(self, state: nodestate.NodeState, facts: Mapping[str, DeviceFact]) -> None:
        self.state = state
        self.facts = facts
        zone_of = {int(z.name.removeprefix("node-")): i for i, z in enumerate(state.zones)}
        self.where: dict[str, tuple[int, int]] = {}
        for dev_id, fact in facts.items():
            if fact.resource not in state.vocabulary.rooted:  # a shared slot: on no root
                continue
            z = zone_of.get(fact.numa[0] if fact.numa else 0, 0)  # unknown NUMA: node-0
            names = [r.name for r in state.zones[z].roots]
            i = names.index(fact.root) if fact.root in names else names.index("")
            self.where[dev_id] = (z, i)

    def roots(self, ids: Iterable[str]) -> nodestate.Roots:
        counts: list[list[dict[str, int]]] = [[{} for _ in z.roots] for z in self.state.zones]
        for dev_id in ids:
            if dev_id in self.where:
                z, i = self.where[dev_id]
                resource = self.facts[dev_id].resource
                counts[z][i][resource] = counts[z][i].get(resource, 0) + 1
        return tuple(tuple(Amounts(held) for held in zone) for zone in counts)

    def slots(self, ids: Iterable[str]) -> Amounts:
        """Shared slots among `ids`, by pool."""
        pools = [self.facts[i].resource for i in ids]
        return Amounts((p, pools.count(p)) for p in self.state.vocabulary.shared)


def _zone_counts(roots: nodestate.Roots) -> tuple[Amounts, ...]:
    return tuple(sum(zone, Amounts()) for zone in roots)


def plugins_choose(
    state: nodestate.NodeState,
    unit: Amounts,
    affinity: tuple[int, ...],
    reusable: devicemanager.Reusable,
) -> bool:
    """Whether the device plugins (or Go's map order) pick the NUMA zones of some of the
    container's GPUs or HCAs: a stage of the device manager's allocation (reusable devices,
    then free ones in the affinity, then the others) that is only partly taken and spans
    several zones."""
    inside = affinity or tuple(range(len(state.zones)))
    for r in state.vocabulary.rooted:
        reuse = [sum(p[r] for p in zone) for zone in reusable.roots]
        free = [z.free[r] for z in state.zones]
        stages = (
            reuse,
            [f if i in inside else 0 for i, f in enumerate(free)],
            [f if i not in inside else 0 for i, f in enumerate(free)],
        )
        need = unit[r]
        for stage in stages:
            take = min(need, sum(stage))
            if 0 < take < sum(stage) and sum(1 for n in stage if n) > 1:
                return True
            need -= take
    return False


def _without_numa(harness: KubeletHarness) -> frozenset[str]:
    """Resources whose devices all lack a NUMA node on this node (the degraded sample)."""
    return frozenset(
        resource
        for resource in harness.resources
        if not any(f.numa for f in harness.facts.values() if f.resource == resource)
    )


def _hint(
    state: nodestate.NodeState,
    unit: Amounts,
    reusable: devicemanager.Reusable,
    no_numa: frozenset[str],
    zero: tuple[str, ...],
) -> tuple[numamask.Hint, bool] | None:
    """`topologymanager.kubelet_hint`, except that a resource whose devices report no NUMA node
    gives the kubelet no preference (`{any, preferred}`) where the NRT, which publishes such
    devices in node-0, makes the prediction treat them as node-0's."""
    named = set(unit) | set(zero)
    if not no_numa & named:
        return topologymanager.kubelet_hint(state, unit, reusable, zero)
    if state.policy == "none":
        return None
    full = (1 << len(state.zones)) - 1
    hints = [
        [numamask.Hint(full, True)]
        if r in no_numa
        else devicemanager.resource_hints(state, r, unit[r], reusable)
        for r in state.vocabulary.names
        if r in named
    ]
    best = topologymanager.merge_hints(state, hints)
    return best, best.preferred or state.policy == "best-effort"


def _failed_at(
    admission: Admission,
    pairs: Sequence[tuple[podrequest.ContainerRequest, ContainerAdmission]],
    scope: str,
    resources: Sequence[str],
) -> int | None:
    """Where the kubelet stopped: None when it admitted the pod, -1 at the pod's own hint
    (scope pod), else the container it refused: the first whose hint was never stored
    (TopologyAffinityError), the first that names a resource with no healthy device, or the
    first that got fewer devices than it asked for (the device manager's
    UnexpectedAdmissionError)."""
    if admission.admitted:
        return None
    if admission.reason == "TopologyAffinityError":
        if scope == "pod":
            return -1
        unset = (k for k, (_, c) in enumerate(pairs) if c.affinity is None and not c.preferred)
        return next(unset, len(pairs))
    dead = _UNHEALTHY.search(admission.message)
    if dead and dead.group(1) in resources:  # a named resource with no healthy device, 0 too
        r = dead.group(1)
        naming = (k for k, (step, _) in enumerate(pairs) if step.devices[r] or r in step.zero)
        return next(naming, len(pairs))
    short = (
        k
        for k, (step, c) in enumerate(pairs)
        if sum(len(ids) for ids in c.devices.values()) < step.devices.total()
    )
    return next(short, len(pairs))


# devicemanager `devicesToAllocate`, when every device of a resource the container names is
# unhealthy: it says so before it looks at the count, so a count of 0 fails too.
_UNHEALTHY = re.compile(r"cannot allocate unhealthy devices (\S+?),")


def judge(harness: KubeletHarness, shape: PodShape, name: str) -> Outcome:
    """Predict, admit, compare; the harness keeps the pod when the kubelet admitted it."""
    state = nodestate.node_state(harness.published())
    manifest = shape.manifest(name, harness.resources)
    request = podrequest.pod_request(manifest)
    verdict = fit.evaluate(state, request)
    admission = harness.admit(manifest)
    with_devices = [
        c for c, spec in zip(admission.containers, shape.kubelet_order(), strict=True) if spec.named
    ]
    pairs = list(zip(request.steps, with_devices, strict=True))
    failed = _failed_at(admission, pairs, state.scope, harness.resources)
    replay = _Replay(harness, state)
    replay.run(request, pairs, failed)
    decided_at = len(pairs) if failed is None else failed
    diverged = replay.diverged_at < decided_at
    problems = replay.problems
    if verdict.fits != admission.admitted and not diverged:
        problems.insert(
            0,
            f"admission: predicted {'fits' if verdict.fits else 'refused'} ({verdict.reason}), "
            f"kubelet {'admitted' if admission.admitted else 'refused'} "
            f"({admission.reason}: {admission.message})",
        )
    return Outcome(shape, verdict, admission, tuple(problems), replay.choices, diverged)


class _Replay:
    """Level 2: each container predicted from the real node state before it."""

    def __init__(self, harness: KubeletHarness, state: nodestate.NodeState) -> None:
        self.harness = harness
        self.state = state
        self.locate = _Locator(state, harness.facts)
        self.no_numa = _without_numa(harness)
        self.reuse_ids: set[str] = set()
        self.problems: list[str] = []
        self.choices = 0
        self.diverged_at = 1 << 30

    def _reusable(self) -> devicemanager.Reusable:
        return devicemanager.Reusable(
            self.locate.roots(self.reuse_ids), self.locate.slots(self.reuse_ids)
        )

    def run(
        self,
        request: podrequest.PodRequest,
        pairs: Sequence[tuple[podrequest.ContainerRequest, ContainerAdmission]],
        failed: int | None,
    ) -> None:
        pod_hint = None
        if self.state.scope == "pod":
            pod_hint = _hint(
                self.state, request.total, self._reusable(), self.no_numa, request.zero
            )
            refused = pod_hint is not None and not pod_hint[1]
            if refused != (failed == -1):
                kubelet = "refused" if failed == -1 else "did not"
                self.problems.append(f"pod hint {pod_hint}: the kubelet {kubelet} refuse the pod")
            if refused or failed == -1:
                return
        for k, (step, got) in enumerate(pairs):
            if self.state.scope == "pod":
                decided = pod_hint
            else:
                decided = _hint(self.state, step.devices, self._reusable(), self.no_numa, step.zero)
            if not self._container(k, step, got, decided, failed == k):
                return
        if failed is not None:
            self.problems.append(f"the kubelet refused container {failed}, the replay did not")

    def _container(
        self,
        k: int,
        step: podrequest.ContainerRequest,
        got: ContainerAdmission,
        decided: tuple[numamask.Hint, bool] | None,
        refused_here: bool,
    ) -> bool:
        """Check one container against what the kubelet did; False when the replay ends here
        (the kubelet or the prediction refused it)."""
        if decided is not None and not decided[1]:
            if not refused_here:
                self.problems.append(f"{got.name}: hint {decided[0]} refused, the kubelet did not")
            return False
        hint = decided[0] if decided is not None else None
        if kubelet_affinity(self.state, hint) != (got.affinity, got.preferred):
            self.problems.append(
                f"{got.name}: affinity predicted {kubelet_affinity(self.state, hint)}, "
                f"kubelet {(got.affinity, got.preferred)}"
            )
        zones = () if hint is None else _zones(hint.mask, len(self.state.zones))
        reusable = self._reusable()
        placed = devicemanager.allocate(
            self.state, step, zones, hint is not None and hint.preferred, reusable
        )
        if isinstance(placed, devicemanager.Rejection) or refused_here:
            if isinstance(placed, devicemanager.Rejection) != refused_here:
                why = (
                    placed.reason if isinstance(placed, devicemanager.Rejection) else "allocatable"
                )
                kubelet = "refused" if refused_here else "did not refuse"
                self.problems.append(f"{got.name}: predicted {why}, the kubelet {kubelet} it")
            return False
        ids = [i for v in got.devices.values() for i in v]
        real = _zone_counts(self.locate.roots(ids))
        choose = plugins_choose(self.state, step.devices, zones, reusable)
        self.choices += choose
        if _zone_counts(placed.devices) != real:
            if not choose:
                self.problems.append(
                    f"{got.name}: devices per zone predicted {_zone_counts(placed.devices)}, "
                    f"kubelet {real} (the plugins had no choice)"
                )
            self.diverged_at = min(self.diverged_at, k)
        self.problems += _pcie_bound(self.harness, got.name, placed, ids)
        taken = [i for i in ids if i not in self.reuse_ids]
        self.state = devicemanager.apply(
            self.state,
            replace(placed, taken=self.locate.roots(taken), shared_taken=self.locate.slots(taken)),
        )
        if step.kind == "init":
            self.reuse_ids |= set(ids)
        else:
            self.reuse_ids -= set(ids)
        return True


def _zones(mask: int, n: int) -> tuple[int, ...]:
    return tuple(i for i in range(n) if mask >> i & 1)


def _pcie_bound(
    harness: KubeletHarness, name: str, placed: devicemanager.UnitPlacement, ids: Sequence[str]
) -> list[str]:
    """The PCIe pairs the kubelet's devices make never exceed the predicted best (which is
    computed on the same free devices); not checked when devices were reused, as the device
    manager takes reusable ones in random order, nor without an affinity (policy none), where
    the prediction's zones are a guess at what the plugins pick."""
    if not placed.zones or any(any(z) for z in placed.reused):
        return []
    gpu, hca, shared = harness.resources
    facts = [harness.facts[i] for i in ids]
    gpus = [f for f in facts if f.resource == gpu]
    hcas = [f for f in facts if f.resource == hca]
    if hcas:
        made = sum(
            min(sum(g.root == r for g in gpus), sum(h.root == r for h in hcas))
            for r in {h.root for h in hcas if h.root}
        )
    elif any(f.resource == shared for f in facts):
        pool = {f.root for f in harness.facts.values() if f.resource == hca and f.root}
        made = sum(1 for g in gpus if g.root in pool)
    else:
        return []
    made = min(made, placed.needed)
    if made > placed.pcie_pairs:
        return [f"{name}: {made} PCIe pairs made, the predicted best was {placed.pcie_pairs}"]
    return []


def run_sequence(
    harness: KubeletHarness, steps: Sequence[PodShape | int], prefix: str = "p"
) -> list[Outcome]:
    """Replay steps on an empty node: a shape is a pod to admit, an int deletes the active pod
    at that position (modulo how many there are)."""
    harness.reset()
    outcomes = []
    for i, step in enumerate(steps):
        if isinstance(step, int):
            if harness.active:
                harness.delete(list(harness.active)[step % len(harness.active)])
            continue
        outcomes.append(judge(harness, step, f"{prefix}{i}"))
    return outcomes
