"""What a real arm did, replayed through one kubelet harness standing in for many nodes'
kubelets: the events (a job arrived, one of its pods bound or ended), a node's pods admitted
and deleted in order, the rails of the NICs the kubelet gave each pod, and the NRT the node's
agent would publish after each step."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rdmaplane.core import nrt
from rdmaplane.services.scheduler.cache import pod_key

from .trace import Job, pods_of


@dataclass(frozen=True)
class RailEvent:
    """What the real arm did, in order: a job arrived, or one of its pods bound or ended."""

    kind: str  # "arrive", "bind" or "end"
    job: Job
    pod: int = -1  # which of the job's pods (bind, end)
    node: str = ""

    @property
    def body(self) -> dict[str, Any]:
        return pods_of(self.job)[self.pod]


Step = tuple[bool, Mapping[str, Any]]  # a pod bound (True) or ended (False) on a node


class ReplayedKubelet:
    """One kubelet harness standing in for many nodes' kubelets, one node at a time: it holds
    the state the node's steps left (the kubelet's own allocations), and what its agent would
    publish from them."""

    def __init__(self, harness: Any) -> None:
        self.harness = harness
        self.node = ""
        self.done = 0  # how many of the node's steps the harness holds
        self.uids: dict[str, str] = {}  # pod key -> its uid in the harness
        self.empty("")

    def empty(self, node: str) -> None:
        """Hold `node`, with no pod on it."""
        self.harness.reset()
        self.node, self.done, self.uids = node, 0, {}

    def step(self, step: Step) -> frozenset[int] | None:
        """Admit or end one pod; the rails of the NICs an admitted pod got."""
        bind, body = step
        key = pod_key(body)
        self.done += 1
        if not bind:
            if key in self.uids:
                self.harness.delete(self.uids.pop(key))
            return None
        admission = self.harness.admit(body)
        if not admission.admitted:
            return None
        self.uids[key] = admission.uid
        rails: frozenset[int] = self.harness.rails(admission)
        return rails

    def hold(self, node: str, steps: Sequence[Step]) -> None:
        """The state `steps` (the node's, from empty) leave: only the new ones when the
        harness already holds the node's earlier ones."""
        if node != self.node or self.done > len(steps):
            self.empty(node)
        for s in steps[self.done :]:
            self.step(s)

    def allocated(self) -> dict[str, dict[str, frozenset[str]]]:
        """Each pod held: its devices per resource."""
        h = self.harness
        return {
            key: {r: h.admissions[uid].devices(r) for r in h.resources}
            for key, uid in self.uids.items()
        }

    def compact(self, node: str, steps: Sequence[Step]) -> list[Step]:
        """Steps as short as can be that leave the node's allocations as `steps` did: its live
        pods alone, ordered by their devices, when the kubelet then gives each the devices it
        has (checked); else `steps`, replayed again."""
        self.hold(node, steps)
        had = self.allocated()
        bodies = {pod_key(b): b for bind, b in steps if bind}
        by_devices = sorted(had, key=lambda k: sorted(d for ds in had[k].values() for d in ds))
        live: list[Step] = [(True, bodies[k]) for k in by_devices]
        self.empty(node)
        for s in live:
            self.step(s)
        if self.allocated() == had:
            return live
        self.empty(node)
        self.hold(node, steps)
        return list(steps)

    def nrt(self) -> dict[str, Any]:
        """The NRT the node's agent would publish now."""
        h = self.harness
        obj: dict[str, Any] = nrt.to_object(
            dataclasses.replace(h.published(h.rail_uplinks()), name=self.node)
        )
        return obj


def kubelet_replay(
    harness: Any, events: list[RailEvent]
) -> tuple[dict[str, frozenset[int]], dict[int, dict[str, Any]]]:
    """Each node's binds and ends, in order, through one kubelet harness (emptied between
    nodes): the rails of the NICs the kubelet gave each pod it admitted, and the NRT the agent
    would publish after each event."""
    by_node: dict[str, list[int]] = {}
    for i, e in enumerate(events):
        if e.node:
            by_node.setdefault(e.node, []).append(i)
    kubelet = ReplayedKubelet(harness)
    rails: dict[str, frozenset[int]] = {}
    published: dict[int, dict[str, Any]] = {}
    for node, indices in by_node.items():
        kubelet.empty(node)
        for i in indices:
            body = events[i].body
            got = kubelet.step((events[i].kind == "bind", body))
            if got is not None:
                rails[pod_key(body)] = got
            published[i] = kubelet.nrt()
    kubelet.empty("")
    return rails, published
