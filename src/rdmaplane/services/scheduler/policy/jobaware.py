"""Job-aware scoring: pods of one job close together on the fabric. Pure.

kube-scheduler asks about one pod at a time. What this adds to each node's node-local score
(`fit.evaluate`):

- **Peers.** A pod belongs to a group named by the first label it carries of `GROUP_LABELS`
  (our own `rdmaplane.io/group`, then the job controllers' labels), within its namespace. A
  LeaderWorkerSet pod's group is its replica (`name` + `group-index`). A pod with
  `rdmaplane.io/kv-peers: <group>` also counts that group's pods as peers (decode near prefill).
- **With peers bound**: the mean `fabric.closeness` of the node to the peers' nodes: 1 under
  their tier-0 switch, 0.5 under their tier-1, 0.25 under tier-2.
- **No peer bound yet** (the job's first pod): room for the rest of the job. Per tier-0 switch,
  how many copies of the pod the candidate nodes under it can still take. When the job's size
  is known, the tightest switch that holds all of it scores 1 (best fit keeps whole switches free
  for larger jobs), other switches that hold it 0.5–0.8, switches too small for it below 0.45:
  steps wide enough to survive the rounding to whole scores. When the size is unknown, the
  switch with the most room scores highest.
- **Rails.** When peers' rails are known (`rails.pod_rails`, from the devices the kubelet is
  predicted to give them), a candidate's closeness is scaled by `1 - RAIL_SHARE` times the share
  of those peers whose rails its own predicted rails do not match: a node where the pod lands
  on the job's rails wins over one under the same switch where it would not, yet never over a
  closer switch (a mismatched node under the peers' tier-0 still scores 0.75, their tier-1
  0.5). A peer on the same node counts too: the two need no rail between them, but every pod
  of the job elsewhere then has two rail sets to match, and can match only one. A job's first
  pod decides the rails the rest must match: its room term is scaled down (`_rail_factor`) on
  nodes whose rails too few other nodes under the same switch still offer
  (`rails.rail_room`).
- **Gangs.** A pod naming a PodGroup (`spec.schedulingGroup.podGroupName`, kube-scheduler's
  Workload API) is asked about only with the nodes of the one domain kube-scheduler is trying
  for the whole group (its `TopologyConstraint`). Peers outside the closest switch all
  candidates share are left out: they are where the same pods were assumed while another
  domain was tried, and (closeness to them being the same from every candidate) they would only
  flatten the scores; they count as still to place, so the room term asks for room for the
  whole gang.
  A gang pod with no PodGroup label of ours is grouped by its PodGroup.
- The node's score is `10 × (node × local/10 + fabric × F) / (node + fabric)`, weights
  configurable; a pod with no group, or no known fabric, keeps its node-local score. Where
  several nodes tie at the top, all but one are scored one lower (`job_scores`), so that
  kube-scheduler binds the pod where the extender assumes it.

Sizes come from `rdmaplane.io/group-size` (label or annotation), LeaderWorkerSet's
`leaderworkerset.sigs.k8s.io/size` annotation, or the number of the group's pods the cache has
seen (bound or pending), whichever is largest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rdmaplane.core import names
from rdmaplane.core.fabric import Location, closeness
from rdmaplane.core.pod import Pod
from rdmaplane.core.settings.scheduler import FabricScoring
from rdmaplane.services.scheduler.policy.podrequest import read_pod
from rdmaplane.services.scheduler.policy.rails import NONE, Rails, match_share, rail_room
from rdmaplane.services.scheduler.policy.score import MAX_SCORE

GROUP_LABEL = names.GROUP_LABEL
KV_PEERS = names.KV_PEERS
GROUP_SIZE = names.GROUP_SIZE
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
# In this order: a JobSet's pods span several Jobs, so the JobSet names the group before the
# Job does; our own label wins over all.
GROUP_LABELS = (
    GROUP_LABEL,
    "jobset.sigs.k8s.io/jobset-name",
    LWS_NAME,
    "training.kubeflow.org/job-name",
    "volcano.sh/job-name",
    "batch.kubernetes.io/job-name",
)
MAX_SLOTS = 16  # copies of a pod counted per node when the job's size is unknown
RAIL_SHARE = 0.25  # of the closeness a candidate loses on rails that match no peer's


@dataclass(frozen=True, slots=True)
class PodGroup:
    group: str | None  # "namespace/name", None when the pod belongs to no job we know
    kv_peers: str | None  # "namespace/name" of the group whose KV cache it reads
    size: int | None  # stated size of the group, if any
    gang: str | None = None  # "namespace/name" of its PodGroup, when it names one


def pod_group(pod: Pod | Mapping[str, Any]) -> PodGroup:
    """The group a pod belongs to, by its labels and annotations (`podrequest.read_pod`)."""
    read = read_pod(pod)
    meta = read.metadata
    labels, annotations = meta.labels or {}, meta.annotations or {}
    namespace = meta.namespace or "default"
    group = None
    for key in GROUP_LABELS:
        value = labels.get(key)
        if value:
            if key == LWS_NAME and labels.get(LWS_GROUP_INDEX):
                value = f"{value}/{labels[LWS_GROUP_INDEX]}"
            group = f"{namespace}/{value}"
            break
    kv = labels.get(KV_PEERS) or annotations.get(KV_PEERS)
    sizes = [_count(labels.get(GROUP_SIZE)), _count(annotations.get(GROUP_SIZE))]
    sizes.append(_count(annotations.get(LWS_SIZE)))
    known = [s for s in sizes if s]
    named = read.spec.scheduling_group if read.spec else None
    gang = f"{namespace}/{named.pod_group_name}" if named and named.pod_group_name else None
    kv_group = f"{namespace}/{kv}" if kv else None
    return PodGroup(group or gang, kv_group, max(known) if known else None, gang)


def _count(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() and 0 < int(value) < 1 << 20 else None


@dataclass(frozen=True, slots=True)
class JobContext:
    """What the cache knows of a pod's job when it is scored."""

    peer_nodes: tuple[str, ...]  # one entry per bound peer (own group and KV peers)
    remaining: int | None  # pods of its own group still to place, this one included
    gang: bool = False  # the pod names a PodGroup: its candidates are one domain's nodes
    peer_rails: tuple[Rails, ...] = ()  # per entry of `peer_nodes`, its rails (empty: unknown)


def fabric_terms(
    names: Sequence[str],
    slots: Callable[[int, int], int],
    locations: Mapping[str, Location],
    job: JobContext,
    rails: Callable[[int], Rails] | None = None,
) -> list[float] | None:
    """The fabric term (0–1) per candidate node, or None when it has nothing to say.

    `slots(i, cap)` is how many copies of the pod node `names[i]` can still take, at most
    `cap` (0 when it takes none); `rails(i)` the rails the pod would get on `names[i]`.
    """
    if not any(n in locations for n in names):
        return None
    peer_rails = job.peer_rails or (NONE,) * len(job.peer_nodes)
    placed = [
        (locations[n], r) for n, r in zip(job.peer_nodes, peer_rails, strict=True) if n in locations
    ]
    peers = [loc for loc, _ in placed]
    remaining = job.remaining
    if job.gang:
        inside = within_candidates(peers, [locations[n] for n in names if n in locations])
        if remaining is not None:  # the peers left out are still to place in this domain
            remaining += len(peers) - len(inside)
        placed = [(loc, r) for loc, r in placed if loc in inside]
        peers = inside
    if peers:
        near: dict[Location, float] = {}  # nodes under one switch share a location: once each
        terms = []
        for i, n in enumerate(names):
            here = locations.get(n)
            if here is not None and here not in near:
                near[here] = sum(closeness(here, p) for p in peers) / len(peers)
            term = near[here] if here is not None else 0.0
            share = match_share(rails(i), [r for _, r in placed]) if rails else None
            terms.append(term if share is None else term * (1 - RAIL_SHARE * (1 - share)))
        return terms
    if job.peer_nodes and not job.gang:
        return None  # peers bound on nodes of unknown place: no direction to give
    terms = _room_terms(names, slots, locations, remaining)
    if rails is None or remaining is None or remaining < 2:
        return terms
    switches = [w.tier0 if (w := locations.get(n)) is not None else None for n in names]
    room = rail_room(list(zip(switches, map(rails, range(len(names))), strict=True)), remaining - 1)
    return [t if r is None else t * _rail_factor(r) for t, r in zip(terms, room, strict=True)]


def _rail_factor(share: float) -> float:
    """What a first pod's term keeps when only `share` of the rest of its job could match its
    rails: all of it at 1, else at most 1 - RAIL_SHARE/2 (a whole score point below)."""
    return 1.0 if share >= 1 else 1 - RAIL_SHARE + RAIL_SHARE / 2 * share


def within_candidates(peers: Sequence[Location], candidates: Sequence[Location]) -> list[Location]:
    """The peers under the closest switch that every candidate is under (all peers when the
    candidates share none)."""
    first, rest = (candidates[0], candidates[1:]) if candidates else (None, ())
    for switch in first.tiers if first else ():
        if all(switch in c.tiers for c in rest):
            return [p for p in peers if switch in p.tiers]
    return list(peers)


def _room_terms(
    names: Sequence[str],
    slots: Callable[[int, int], int],
    locations: Mapping[str, Location],
    remaining: int | None,
) -> list[float]:
    cap = remaining or MAX_SLOTS
    room: dict[str, int] = {}
    for i, n in enumerate(names):
        here = locations.get(n)
        if here is not None and here.tier0 is not None:
            room[here.tier0] = room.get(here.tier0, 0) + slots(i, cap)
    most = max(room.values(), default=0)
    tightest = min((r for r in room.values() if remaining and r >= remaining), default=0)
    terms = []
    for n in names:
        here = locations.get(n)
        free = room.get(here.tier0, 0) if here is not None and here.tier0 is not None else 0
        if not free:
            terms.append(0.0)
        elif remaining is None:
            terms.append(free / most)
        elif free == tightest:
            terms.append(1.0)  # best fit: the smallest switch that holds the whole job
        elif free >= remaining:
            terms.append(0.5 + 0.3 * remaining / free)  # fits, but breaks a bigger switch
        else:
            terms.append(0.45 * free / remaining)  # too small: below every one that fits
    return terms


def job_scores(
    names: Sequence[str],
    local: Sequence[int],
    fits: Sequence[bool],
    terms: Sequence[float],
    locations: Mapping[str, Location],
    weights: FabricScoring,
) -> list[int]:
    """Each node's score (`compose`), with one fitting node alone at the top when the fabric
    term counts: the others that tie with it are scored one lower.

    kube-scheduler picks at random among the nodes with the highest total, and the extender
    assumes the pod on its own best node (`ClusterCache.assume`) for the job's next pods: with
    a tie (a job's first pod: every free node of each leaf that fits it best) the two often
    differ, and the next pods are drawn to a leaf the first did not go to. One node at the top
    makes them agree. It is the first by place on the fabric (widest tier first), then by
    name, so the choice does not depend on the order kube-scheduler lists the nodes in."""
    scores = [compose(s, t, weights) for s, t in zip(local, terms, strict=True)]
    top = max((s for s, f in zip(scores, fits, strict=True) if f), default=0)
    tied = [i for i, (s, f) in enumerate(zip(scores, fits, strict=True)) if f and s == top]
    if weights.weight <= 0 or top <= 0 or len(tied) < 2:
        return scores
    keep = min(tied, key=lambda i: (_place(locations.get(names[i])), names[i]))
    for i in tied:
        if i != keep:
            scores[i] = top - 1
    return scores


def _place(where: Location | None) -> tuple[str, ...]:
    return tuple(reversed(where.tiers)) if where is not None else ()


def compose(local: int, term: float, weights: FabricScoring) -> int:
    """The node's score: its node-local score (0–10) weighed against the fabric term (0–1)."""
    total = weights.node_local + weights.weight
    if total <= 0:
        return local
    score = round(
        MAX_SCORE * (weights.node_local * local / MAX_SCORE + weights.weight * term) / total
    )
    return max(0, min(MAX_SCORE, score))
