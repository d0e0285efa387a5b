"""The extender's answers, whoever asks: kube-scheduler over HTTP (`/filter`, then
`/prioritize` with the nodes that passed), `/debug/explain` and `rdmaplane explain-placement`.

An explanation is the two calls in that order, made by the same code, so it cannot disagree
with what kube-scheduler is told: the same verdicts, and the same scores, fabric term included
(the job-aware term depends on which nodes are candidates, and kube-scheduler only ever asks
to prioritize the ones that passed the filter). No I/O: the cache is fed by its callers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, not_
from typing import Any

from rdmaplane.core.pod import Pod
from rdmaplane.core.settings.scheduler import FabricScoring
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.policy import fit, podrequest
from rdmaplane.services.scheduler.policy import jobaware as ja

_FITS = attrgetter("fits")
_REASON = attrgetter("reason")
_UNRESOLVABLE = attrgetter("unresolvable")


@dataclass(frozen=True, slots=True)
class Filtered:
    """A filter answer: the nodes that passed, the others by reason (reasons without the
    wire prefix), and what it was decided from."""

    request: podrequest.PodRequest
    verdicts: Sequence[fit.Verdict]  # one per asked node, in order
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


@dataclass(frozen=True, slots=True)
class Scored:
    """A prioritize answer: a score per asked node (0-10), and the fabric term behind each
    when the pod's job has one."""

    request: podrequest.PodRequest
    verdicts: Sequence[fit.Verdict]
    scores: list[int]
    terms: list[float] | None


@dataclass(frozen=True, slots=True)
class LastFilter:
    """The last filter call's pod (by UID), the nodes it passed and their verdicts: the
    scheduler's prioritize call for that pod follows it with exactly those nodes, and is
    answered from the same view (as kube-scheduler scores on its cycle's snapshot)."""

    uid: str
    passed: list[str]
    request: podrequest.PodRequest
    verdicts: list[fit.Verdict]

    def answers(self, pod: Pod, names: list[str]) -> bool:
        """Whether a prioritize call for `pod` over `names` is the one that follows."""
        return self.uid == _uid(pod) and self.passed == names


class Decisions:
    """The extender's decider: its one piece of state besides the cache is `last`."""

    def __init__(self, cache: ClusterCache, weights: FabricScoring) -> None:
        self.cache = cache
        self.weights = weights
        self.last: LastFilter | None = None

    def filter(self, pod: Pod | Mapping[str, Any], names: list[str]) -> Filtered:
        """Raises `podrequest.RequestError` for a pod whose request cannot be read."""
        self.last = None
        pod = podrequest.read_pod(pod)
        request = podrequest.pod_request(pod)
        found = self.cache.verdicts(names, request)
        fits = list(map(_FITS, found))
        passed = list(compress(names, fits))
        uid = _uid(pod)
        if uid is not None:
            self.last = LastFilter(uid, passed, request, list(compress(found, fits)))
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        if len(passed) < len(names):  # C-level passes over the failures, no Python loop
            bad = list(map(not_, fits))
            bad_names, bad_verdicts = list(compress(names, bad)), list(compress(found, bad))
            final = list(map(_UNRESOLVABLE, bad_verdicts))
            for target, keep in ((unresolvable, final), (failed, list(map(not_, final)))):
                reasons = map(_REASON, compress(bad_verdicts, keep))
                target.update(zip(compress(bad_names, keep), reasons, strict=True))
        return Filtered(request, found, passed, failed, unresolvable)

    def prioritize(self, pod: Pod | Mapping[str, Any], names: list[str]) -> Scored:
        pod = podrequest.read_pod(pod)
        last = self.last
        if last is not None and last.answers(pod, names):
            request, found = last.request, last.verdicts
        else:
            request = podrequest.pod_request(pod)
            found = list(self.cache.verdicts(names, request))
        scores, terms = self.cache.job_scores(pod, names, request, found, self.weights)
        return Scored(request, found, scores, terms)

    def answer_prioritize(self, pod: Pod | Mapping[str, Any], names: list[str]) -> Scored:
        """`prioritize` as kube-scheduler is told it; a pod of a job is then assumed on its
        best node (`ClusterCache.assume`), so the job's next pod, scored before this one's
        bind reaches the watch, is scored with it. Explaining assumes nothing."""
        scored = self.prioritize(pod, names)
        if scored.terms is not None and names:
            best = max(range(len(names)), key=scored.scores.__getitem__)
            self.cache.assume(pod, names[best])
        return scored

    def explain(self, pod: Pod | Mapping[str, Any], names: list[str]) -> dict[str, Any]:
        """Filter `names`, prioritize those that passed: one row per node, best first."""
        pod = podrequest.read_pod(pod)
        filtered = self.filter(pod, names)
        scored = self.prioritize(pod, filtered.passed)
        score = dict(zip(filtered.passed, scored.scores, strict=True))
        term = dict(zip(filtered.passed, scored.terms or (), strict=False))
        rows = [
            _row(self.cache, name, verdict, score.get(name, 0), term.get(name))
            for name, verdict in zip(names, filtered.verdicts, strict=True)
        ]
        rows.sort(key=lambda r: (not r["fits"], -r["score"], r["node"]))
        job = self.cache.job_context(pod)
        return {
            "request": explain_request(filtered.request),
            "job": explain_job(job),
            "nodes": rows,
        }


def _uid(pod: Pod) -> str | None:
    return pod.metadata.uid or None


def explain_request(request: podrequest.PodRequest) -> dict[str, Any]:
    """The devices asked for, by resource name: per container, per init container, in all."""
    return {
        "containers": [dict(c) for c in request.containers],
        "initContainers": [dict(c) for c in request.init],
        "total": dict(request.total),
    }


def explain_job(job: ja.JobContext | None) -> dict[str, Any] | None:
    """What the extender knows of the pod's job: its bound peers and how many are left."""
    if job is None:
        return None
    return {
        "peerNodes": sorted(set(job.peer_nodes)),
        "boundPeers": len(job.peer_nodes),
        "remaining": job.remaining,
    }


def _row(
    cache: ClusterCache, name: str, v: fit.Verdict, score: int, term: float | None
) -> dict[str, Any]:
    """A node's verdict and its score as /prioritize gives it (0 for a node that did not
    pass: kube-scheduler never asks to score it), the node-local score and the fabric term."""
    entry = cache.entry(name)
    place = cache.locations.get(name)
    row: dict[str, Any] = {
        "node": name,
        "policy": f"{entry.state.policy}/{entry.state.scope}" if entry else "",
        "fits": v.fits,
        "unresolvable": v.unresolvable,
        "score": score,
        "nodeScore": v.score,
        "alignment": v.alignment,
        "detail": v.reason,
        "unaccountedPods": list(entry.unaccounted) if entry else [],
        "tiers": list(place.tiers) if place else [],
    }
    if term is not None:
        row["fabricTerm"] = round(term, 3)
    return row
