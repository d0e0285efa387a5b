"""The extender's view of the cluster: NRTs, nodes and bound pods, kept by watches.

No I/O here; the watch loop (`watch.py`), the CLI's one-shot listing and the tests feed it the
same Kubernetes objects (dicts). For every node it keeps a `NodeState` that already subtracts the
pods bound to the node but absent from the NRT's `rdmaplane.io/accounted-pods` (taken from the
zones the kubelet would pick), so decisions made before the agent republishes still see them.
Decisions are memoised per (pod request, node state): identical nodes share them, and a request
touches only dict lookups for nodes that did not change.

For job-aware scoring it also keeps each node's place on the fabric (tier ids from its labels,
per-HCA rails from the NRT's HCA zones), the rails each bound pod's NICs are predicted on
(`rails.pod_rails`), and the members of every pod group it has seen, bound or
still pending, with the node each is bound to. Like kube-scheduler's own cache, it *assumes* a
job's pod on the node it scored best (`assume`) until the watch shows where the pod was bound:
a job's pods are scored back to back, each before its predecessors' binds reach the watch, and
without the assumption each would be scored as if it were the job's first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any

import msgspec

from rdmaplane.core import fabric as fab
from rdmaplane.core import nrt as nrtmod
from rdmaplane.core.decoding import DecodeError, convert
from rdmaplane.core.pod import ObjectMeta, Pod
from rdmaplane.core.settings.scheduler import ExtenderSettings, FabricScoring
from rdmaplane.services.scheduler.policy import (
    devicemanager,
    fit,
    nodestate,
    podrequest,
    score,
    topologymanager,
)
from rdmaplane.services.scheduler.policy import jobaware as ja
from rdmaplane.services.scheduler.policy import rails as rl

KINDS = ("nrt", "node", "pod")
REASON_PREFIX = "rdmaplane: "
MIN_STATES = 10_000  # interned node states kept before the dead ones are dropped
MAX_REQUEST_SHAPES = 4_096  # distinct pod requests memoised at once
_SCORE = attrgetter("score")


@dataclass(frozen=True, slots=True)
class BoundPod:
    key: str  # namespace/name
    node: str
    created: str
    request: podrequest.PodRequest


@dataclass(frozen=True, slots=True)
class NodeEntry:
    name: str
    topology: nrtmod.NodeResourceTopology
    state: nodestate.NodeState
    sid: int  # interned id of `state`
    unaccounted: tuple[str, ...]  # bound pods subtracted here, on top of the NRT
    last: tuple[str, str] = ("", "")  # (created, key) of the latest pod subtracted or refused


def _bulk(table: Mapping[Any, Any], keys: Sequence[Any]) -> tuple[Any, ...]:
    """table[k] for every key, in one C-level call (KeyError if one is missing)."""
    got = itemgetter(*keys)(table)
    return got if len(keys) > 1 else (got,)


class _Named(msgspec.Struct, frozen=True):
    """Any object, as far as its name goes: what an object the models refuse is known by."""

    metadata: ObjectMeta = ObjectMeta()


class _Condition(msgspec.Struct, frozen=True):
    type: str
    status: str = ""
    reason: str | None = None
    message: str | None = None


class _NodeStatus(msgspec.Struct, frozen=True):
    conditions: tuple[_Condition, ...] | None = None


class WatchedNode(msgspec.Struct, frozen=True):
    """A v1 Node as the extender reads it: its labels (fabric tiers) and RDMAReady."""

    metadata: ObjectMeta = ObjectMeta()
    status: _NodeStatus | None = None


def _named(obj: Mapping[str, Any]) -> ObjectMeta:
    try:
        return convert(obj, _Named).metadata
    except DecodeError:
        return ObjectMeta()


def pod_key(obj: Pod | Mapping[str, Any]) -> str:
    """namespace/name of a pod, read through the model (an unreadable one by its name alone)."""
    if isinstance(obj, Pod):
        return obj.key
    meta = _named(obj)
    return f"{meta.namespace or 'default'}/{meta.name}"


class ClusterCache:
    def __init__(
        self,
        policy: score.Policy = score.Policy(),
        memo_limit: int = 200_000,
        tier_schemes: Sequence[Sequence[str]] = fab.DEFAULT_LABEL_SCHEMES,
        assume_for_s: float = FabricScoring().assume_for_s,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.tier_schemes = tier_schemes
        self._assume_for_s = assume_for_s
        self._clock = clock
        self.synced = dict.fromkeys(KINDS, False)
        self._memo_limit = memo_limit
        self._nrts: dict[str, nrtmod.NodeResourceTopology] = {}
        self._published: dict[str, nodestate.NodeState] = {}  # each NRT's state, before bound pods
        self._nrt_errors: dict[str, str] = {}
        self._not_ready: dict[str, str] = {}  # node → RDMAReady=False message
        self._nodes: set[str] = set()
        self._pods: dict[str, BoundPod] = {}
        self._pods_by_node: dict[str, set[str]] = {}
        self._entries: dict[str, NodeEntry] = {}
        self._sids: dict[nodestate.NodeState, int] = {}
        self._states: list[nodestate.NodeState] = []  # by state id
        self._sid_by_name: dict[str, int] = {}
        self._memo: dict[podrequest.PodRequest, dict[int, fit.Verdict]] = {}
        self._slots: dict[tuple[int, podrequest.PodRequest, int], int] = {}
        self._tiers: dict[str, tuple[str, ...]] = {}  # node → tier ids from its labels
        self._rails: dict[str, tuple[tuple[int, str], ...]] = {}  # node → rails from its NRT
        self._root_rails: dict[str, dict[str, tuple[int, ...]]] = {}  # node → root → rails
        self._pod_rails: dict[str, rl.Rails] = {}  # bound pod's key → its predicted rails
        self.locations: dict[str, fab.Location] = {}
        self._group_of: dict[str, tuple[str, str]] = {}  # pod key → (group, node or "")
        self._members: dict[str, dict[str, str]] = {}  # group → {pod key: node or ""}
        self._readers: dict[str, dict[str, str]] = {}  # group → {pending reader: its group}
        self._reads: dict[str, str] = {}  # pending reader's key → the group it reads
        # group → {key: (node, until, rails there)}
        self._assumed: dict[str, dict[str, tuple[str, float, rl.Rails]]] = {}
        self._assumed_in: dict[str, str] = {}  # assumed pod's key → its group

    @classmethod
    def configured(cls, settings: ExtenderSettings) -> ClusterCache:
        """The cache as the extender's settings say: its policy, memo size, label schemes."""
        policy = score.Policy(settings.weights, settings.resources)
        fabric = settings.fabric
        return cls(policy, settings.memo_entries, fabric.tier_labels, fabric.assume_for_s)

    # ---- feeding -------------------------------------------------------------------------------

    def apply(self, kind: str, event: str, obj: Mapping[str, Any] | Pod) -> None:
        """One watch event (`ADDED`, `MODIFIED`, `DELETED`) of a kind in `KINDS`; a pod's
        object may come already read (`rdmaplane.core.pod.Pod`, as the watch decodes it)."""
        if kind == "pod":
            self._set_pod(obj) if event != "DELETED" else self._forget_pod(pod_key(obj))
        elif isinstance(obj, Pod):
            raise TypeError(f"a Pod in a {kind} event")
        elif event == "DELETED":
            name = _named(obj).name
            self._drop_nrt(name) if kind == "nrt" else self._drop_node(name)
        else:
            self._set_nrt(obj) if kind == "nrt" else self._set_node(obj)

    def replace(self, kind: str, objs: Iterable[Mapping[str, Any] | Pod]) -> None:
        """A fresh listing of a kind: forget what it no longer has, take in the rest."""
        objs = list(objs)
        if kind == "pod":
            keep = {pod_key(o) for o in objs}
            for key in [k for k in {*self._pods, *self._group_of} if k not in keep]:
                self._forget_pod(key)
        else:
            known = (set(self._nrts) | set(self._nrt_errors)) if kind == "nrt" else set(self._nodes)
            keep = {o.metadata.name if isinstance(o, Pod) else _named(o).name for o in objs}
            for name in known - keep:
                self.apply(kind, "DELETED", {"metadata": {"name": name}})
        for obj in objs:
            self.apply(kind, "ADDED", obj)
        self.synced[kind] = True

    def _set_nrt(self, obj: Mapping[str, Any]) -> None:
        try:
            topology = nrtmod.from_object(obj)
            name = topology.name
        except nrtmod.NrtError as exc:
            name = _named(obj).name
            self._nrts.pop(name, None)
            self._published.pop(name, None)
            self._nrt_errors[name] = str(exc)
        else:
            self._nrt_errors.pop(name, None)
            self._nrts[name] = topology
            self._published[name] = nodestate.node_state(topology, self.policy.vocabulary)
        uplinks = topology.uplinks() if name in self._nrts else ()
        self._rails[name] = tuple(
            sorted({(u.rail, u.switch) for u in uplinks if u.rail is not None})
        )
        self._root_rails[name] = rl.root_rails(uplinks)
        self._relocate(name)
        self._rebuild(name)

    def _drop_nrt(self, name: str) -> None:
        self._nrts.pop(name, None)
        self._published.pop(name, None)
        self._nrt_errors.pop(name, None)
        self._rails.pop(name, None)
        self._root_rails.pop(name, None)
        self._relocate(name)
        self._rebuild(name)

    def _relocate(self, name: str) -> None:
        """The node's location: tiers from its labels (else the tier-0 switches its NRT names),
        rails from its NRT."""
        rails = self._rails.get(name, ())
        tiers = self._tiers.get(name) or ((fab.collapse(s for _, s in rails),) if rails else ())
        if tiers:
            self.locations[name] = fab.Location(tiers, rails)
        else:
            self.locations.pop(name, None)

    def _set_node(self, obj: Mapping[str, Any]) -> None:
        try:
            node = convert(obj, WatchedNode)
        except DecodeError:
            node = WatchedNode(_named(obj))  # the API server's Nodes are always readable: no news
        name = node.metadata.name
        self._nodes.add(name)
        labels = node.metadata.labels
        found = fab.location_from_labels(labels, self.tier_schemes) if labels else None
        if (found.tiers if found else ()) != self._tiers.get(name, ()):
            self._tiers[name] = found.tiers if found else ()
            self._relocate(name)
        conditions = (node.status.conditions if node.status else None) or ()
        ready = next((c for c in conditions if c.type == nrtmod.CONDITION_RDMA_READY), None)
        if ready is not None and ready.status == "False":
            why = ready.message or ready.reason or "no reason given"
            self._not_ready[name] = f"{nrtmod.CONDITION_RDMA_READY}=False: {why}"
        else:
            self._not_ready.pop(name, None)

    def _drop_node(self, name: str) -> None:
        self._nodes.discard(name)
        self._not_ready.pop(name, None)
        self._tiers.pop(name, None)
        self._relocate(name)

    def _set_pod(self, obj: Mapping[str, Any] | Pod) -> None:
        try:
            pod = podrequest.read_pod(obj)
            key = pod.key
            request: podrequest.PodRequest | None = podrequest.pod_request(pod)
        except podrequest.RequestError:  # admitted by the API server, yet we cannot count it
            pod, key, request = Pod(), pod_key(obj), None
        node = (pod.spec.node_name if pod.spec else None) or ""
        finished = pod.status is not None and pod.status.phase in ("Succeeded", "Failed")
        wants = request is not None and request.wants_devices and not finished
        group = ja.pod_group(pod) if wants else ja.PodGroup(None, None, None)
        self._track_group(key, group.group, node)
        self._track_reader(key, group.kv_peers if group.group and not node else None, group.group)
        if not node or not wants or request is None:
            self._drop_pod(key)
            return
        bound = BoundPod(key, node, pod.metadata.creation_timestamp or "", request)
        if self._pods.get(key) == bound:
            return
        self._drop_pod(key)
        self._pods[key] = bound
        self._pods_by_node.setdefault(node, set()).add(key)
        self._add_to(node, bound)

    def _track_group(self, key: str, group: str | None, node: str) -> None:
        """Keep the pod's group membership (bound or pending) in step with the pod."""
        if node or not group:  # bound, or gone: the watch knows better than an assumption
            self._unassume(key)
        was = self._group_of.get(key)
        if was == ((group, node) if group else None):
            return
        if was is not None:
            members = self._members.get(was[0], {})
            members.pop(key, None)
            if not members:
                self._members.pop(was[0], None)
            del self._group_of[key]
        if group:
            self._group_of[key] = (group, node)
            self._members.setdefault(group, {})[key] = node

    def assume(self, pod: Pod | Mapping[str, Any], node: str) -> None:
        """Count a pending pod of a group at `node` (the node it scored best) for its peers'
        scores, until its bind is watched or `assume_for_s` passes (kube-scheduler chose
        another node, or could not bind)."""
        group = ja.pod_group(pod).group
        key = pod_key(pod)
        if not group or self._group_of.get(key, ("", ""))[1]:
            return
        try:
            rails = self.rails_at(node, self.verdict(node, podrequest.pod_request(pod)))
        except podrequest.RequestError:
            rails = rl.NONE
        self._unassume(key)
        until = self._clock() + self._assume_for_s
        self._assumed.setdefault(group, {})[key] = (node, until, rails)
        self._assumed_in[key] = group

    def _unassume(self, key: str) -> None:
        group = self._assumed_in.pop(key, None)
        if group is not None:
            assumed = self._assumed[group]
            del assumed[key]
            if not assumed:
                del self._assumed[group]

    def _placed(self, group: str | None) -> dict[str, tuple[str, rl.Rails]]:
        """The group's pods with the node each is bound to, or assumed on ("" if neither), and
        their rails there; assumptions past their time are dropped here."""
        members = {
            k: (n, self._pod_rails.get(k, rl.NONE))
            for k, n in self._members.get(group or "", {}).items()
        }
        now = self._clock()
        for key, (node, until, rails) in list(self._assumed.get(group or "", {}).items()):
            if until <= now:
                self._unassume(key)
            elif not members.get(key, ("", rl.NONE))[0]:
                members[key] = (node, rails)
        return members

    def rails_at(self, name: str, verdict: fit.Verdict) -> rl.Rails:
        """The rails a pod gets on the node, by the verdict for it on the node's current state
        (empty when it does not fit or the node names no rails per PCIe root)."""
        entry, roots = self._entries.get(name), self._root_rails.get(name)
        if entry is None or not roots or not verdict.fits:
            return rl.NONE
        return rl.pod_rails(entry.state, verdict.placements, roots)

    def _track_reader(self, key: str, kv_peers: str | None, group: str | None) -> None:
        """Pending pods that read another group's KV cache, by that group: its first pod makes
        room for them too (decode deployments are created with their prefill)."""
        was = self._reads.pop(key, None)
        if was is not None:
            readers = self._readers[was]
            readers.pop(key, None)
            if not readers:
                del self._readers[was]
        if kv_peers and group and kv_peers != group:
            self._readers.setdefault(kv_peers, {})[key] = group
            self._reads[key] = kv_peers

    def _forget_pod(self, key: str) -> None:
        self._track_reader(key, None, None)
        self._track_group(key, None, "")
        self._drop_pod(key)

    def _drop_pod(self, key: str) -> None:
        pod = self._pods.pop(key, None)
        self._pod_rails.pop(key, None)
        if pod is not None:
            self._pods_by_node.get(pod.node, set()).discard(key)
            self._rebuild(pod.node)

    def _rebuild(self, name: str) -> None:
        """The node's state from its NRT, minus the bound pods the NRT does not account for,
        each where the kubelet would put it, in creation order."""
        topology = self._nrts.get(name)
        if topology is None:
            self._entries.pop(name, None)
            self._sid_by_name.pop(name, None)
            return
        accounted = topology.accounted_pods
        pods = sorted(
            (self._pods[k] for k in self._pods_by_node.get(name, ()) if k not in accounted),
            key=lambda p: (p.created, p.key),
        )
        state = self._published[name]
        self._subtract(name, topology, state, (), ("", ""), pods)

    def _add_to(self, name: str, pod: BoundPod) -> None:
        """A pod newly bound to the node: when it is the latest, subtract it from the state as
        it is (one placement, not the node's every pod again: a burst binds many pods to a
        node one after the other); else rebuild the node."""
        entry = self._entries.get(name)
        if entry is not None and pod.key in entry.topology.accounted_pods:
            return  # the NRT already counts it
        if entry is None or (pod.created, pod.key) < entry.last:
            self._rebuild(name)
            return
        self._subtract(name, entry.topology, entry.state, entry.unaccounted, entry.last, [pod])

    def _subtract(
        self,
        name: str,
        topology: nrtmod.NodeResourceTopology,
        state: nodestate.NodeState,
        subtracted: tuple[str, ...],
        last: tuple[str, str],
        pods: Sequence[BoundPod],
    ) -> None:
        """Place `pods` in order on `state` (a pod the kubelet refuses holds nothing) and keep
        the node's entry. Each placement is the decision memoised for the pod's request on
        that state: the filter call that chose this node for the pod usually made it."""
        sid = self._intern(state)
        roots = self._root_rails.get(name)
        for pod in pods:
            verdict = self._decided(sid, pod.request)
            if roots and verdict.fits:
                self._pod_rails[pod.key] = rl.pod_rails(state, verdict.placements, roots)
            if verdict.fits and verdict.state_after is not None:
                state = verdict.state_after
                sid = self._intern(state)
                subtracted = (*subtracted, pod.key)
            last = (pod.created, pod.key)
        entry = NodeEntry(name, topology, state, sid, subtracted, last)
        self._entries[name] = entry
        self._sid_by_name[name] = entry.sid

    def _intern(self, state: nodestate.NodeState) -> int:
        sid = self._sids.get(state)
        if sid is None:
            if len(self._states) >= max(MIN_STATES, 4 * len(self._entries)):
                self._compact()
            sid = self._sids[state] = len(self._states)
            self._states.append(state)
        return sid

    def _compact(self) -> None:
        """Forget states no node has any more (every bind makes a new one): renumber the live
        ones and drop the decisions memoised for the old numbers."""
        self._sids.clear()
        self._states.clear()
        self._memo.clear()
        self._slots.clear()
        for name, entry in list(self._entries.items()):
            sid = self._sids.get(entry.state)
            if sid is None:
                sid = self._sids[entry.state] = len(self._states)
                self._states.append(entry.state)
            self._entries[name] = NodeEntry(
                name, entry.topology, entry.state, sid, entry.unaccounted, entry.last
            )
            self._sid_by_name[name] = sid

    # ---- reading -------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return all(self.synced.values())

    def counts(self) -> dict[str, int]:
        return {"nrt": len(self._nrts), "node": len(self._nodes), "pod": len(self._pods)}

    def entry(self, name: str) -> NodeEntry | None:
        return self._entries.get(name)

    def verdicts(
        self, names: Sequence[str], request: podrequest.PodRequest
    ) -> Sequence[fit.Verdict]:
        """The decision for each node, in order. The request path: two C-level bulk lookups
        (node name → state id → decision), plus an evaluation per state new to this pod."""
        memo = self._memo_for(request)
        if not names:
            return []
        try:
            sids = _bulk(self._sid_by_name, names)
        except KeyError:  # some node without a usable NRT: the slow path
            return [self._one(name, request, memo) for name in names]
        for sid in set(sids).difference(memo):
            memo[sid] = fit.evaluate(self._states[sid], request, self.policy)
        found = _bulk(memo, sids)
        if self._not_ready and self._maybe_rdma(request):
            return [
                self._one(name, request, memo) if name in self._not_ready else v
                for name, v in zip(names, found, strict=True)
            ]
        return found

    def _maybe_rdma(self, request: podrequest.PodRequest) -> bool:
        """Whether some node may count one of the request's resources as RDMA: anything not a
        GPU by the cluster's names (a node's own names decide, in `_one`)."""
        return any(self.policy.vocabulary.kind(n) != "gpu" for n in request.total)

    def _memo_for(self, request: podrequest.PodRequest) -> dict[int, fit.Verdict]:
        """The decisions memoised for a pod request, by state id (emptied when too many)."""
        memo = self._memo.get(request)
        if memo is None:
            entries = sum(len(m) for m in self._memo.values())
            if entries >= self._memo_limit or len(self._memo) >= MAX_REQUEST_SHAPES:
                self._memo.clear()
            memo = self._memo[request] = {}
        return memo

    def _decided(self, sid: int, request: podrequest.PodRequest) -> fit.Verdict:
        memo = self._memo_for(request)
        found = memo.get(sid)
        if found is None:
            found = memo[sid] = fit.evaluate(self._states[sid], request, self.policy)
        return found

    def _one(
        self, name: str, request: podrequest.PodRequest, memo: dict[int, fit.Verdict]
    ) -> fit.Verdict:
        entry = self._entries.get(name)
        if entry is None:
            return self._without_topology(name, request)
        if name in self._not_ready and entry.state.vocabulary.wants_rdma(request.total):
            return fit.Verdict(False, False, self._not_ready[name], 0, "")
        found = memo.get(entry.sid)
        if found is None:
            found = memo[entry.sid] = fit.evaluate(entry.state, request, self.policy)
        return found

    def verdict(self, name: str, request: podrequest.PodRequest) -> fit.Verdict:
        return self.verdicts((name,), request)[0]

    def _without_topology(self, name: str, request: podrequest.PodRequest) -> fit.Verdict:
        """A node without a usable NRT, judged by the cluster's names."""
        request = request.on(self.policy.vocabulary)
        if not request.wants_devices:
            return fit.PASS_THROUGH
        if name in self._nrt_errors:
            why = f"malformed NodeResourceTopology: {self._nrt_errors[name]}"
        else:
            why = "no NodeResourceTopology published for this node"
        if self.policy.vocabulary.wants_rdma(request.total):
            return fit.Verdict(False, True, why, 0, "")
        return fit.Verdict(True, False, f"{why}; GPU-only pod passes unscored", 0, "")

    # ---- job-aware scoring ----------------------------------------------------------------------

    def job_context(self, pod: Pod | Mapping[str, Any]) -> ja.JobContext | None:
        """The pod's bound peers and how many of its group are left to place (None when the
        pod belongs to no group and reads no other group's KV cache)."""
        group = ja.pod_group(pod)
        if group.group is None and group.kv_peers is None:
            return None
        me = pod_key(pod)
        own = {k: n for k, n in self._placed(group.group).items() if k != me}
        kv = self._placed(group.kv_peers) if group.kv_peers != group.group else {}
        bound = [n for n, _ in own.values() if n]
        placed = [p for p in own.values() if p[0]] + [p for k, p in kv.items() if p[0] and k != me]
        peers = tuple(n for n, _ in placed)
        known = len(own) + 1
        size = max(group.size or 0, known) if group.group else 0
        remaining = size - len(bound) if group.size or known > 1 else None
        readers = len(self._readers.get(group.group or "", {}))
        if readers and not bound:
            remaining = (remaining or 1) + readers
        left = max(remaining, 1) if remaining is not None else None
        rails = tuple(r for _, r in placed) if any(r for _, r in placed) else ()
        return ja.JobContext(peers, left, group.gang is not None, rails)

    def job_scores(
        self,
        pod: Pod | Mapping[str, Any],
        names: Sequence[str],
        request: podrequest.PodRequest,
        verdicts: Sequence[fit.Verdict],
        weights: FabricScoring,
    ) -> tuple[list[int], list[float] | None]:
        """The scores kube-scheduler gets: node-local, with the pod's fabric term composed in
        when it has one (and that term per node, for explaining)."""
        scores = list(map(_SCORE, verdicts))
        job = self.job_context(pod)
        if job is None:
            return scores, None
        terms = ja.fabric_terms(
            names,
            lambda i, cap: self.slots(names[i], request, cap) if verdicts[i].fits else 0,
            self.locations,
            job,
            lambda i: self.rails_at(names[i], verdicts[i]),
        )
        if terms is None:
            return scores, None
        fits = [v.fits for v in verdicts]
        return ja.job_scores(names, scores, fits, terms, self.locations, weights), terms

    def slots(self, name: str, request: podrequest.PodRequest, cap: int) -> int:
        """How many copies of the pod the node can still take, up to `cap`."""
        entry = self._entries.get(name)
        if entry is None:
            return 1 if self.verdict(name, request).fits else 0
        key = (entry.sid, request, cap)
        found = self._slots.get(key)
        if found is None:
            found, state = 0, entry.state
            while found < cap:
                placed = topologymanager.place_pod(state, request)
                if isinstance(placed, devicemanager.Rejection):
                    break
                found, state = found + 1, placed[1]
            if len(self._slots) >= self._memo_limit:
                self._slots.clear()
            self._slots[key] = found
        return found
