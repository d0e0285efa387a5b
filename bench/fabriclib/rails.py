"""Matching rails across a job's pods: an extender cache fed the NRTs kubelet harnesses publish,
every pod admitted by its node's harness (the kubelet's own device manager), and the tally of a
job's cross-node pod pairs whose rails match."""

from __future__ import annotations

import contextlib
import itertools
import random
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rdmaplane.core import nrt
from rdmaplane.core.settings.scheduler import FabricScoring
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.policy import podrequest
from rdmaplane.services.scheduler.policy import rails as rl


@dataclass
class RailTally:
    pairs: int = 0  # cross-node pairs of one job's pods
    matched: int = 0  # ... whose rails (the kubelet's allocation) match
    pods: int = 0
    predicted: int = 0  # pods whose rails the extender predicted as the kubelet gave them
    predicted_seen: int = 0  # ... on the NRTs as the real extender saw them (real arms)
    unplaced: int = 0
    allowed_pairs: int = 0  # cross-node pairs of jobs the fabric let match (`matchable`)
    allowed_matched: int = 0


def matchable(cache: ClusterCache, names: list[str], pod: dict[str, Any], count: int) -> bool:
    """Whether the cluster, as the job arrives, lets all its `count` pods match: one node
    takes them all (no pair crosses nodes), or `count` nodes would each give one of them
    the same rails (by the extender's prediction on the published NRTs, exact on this
    sample)."""
    request = podrequest.pod_request(pod)
    verdicts = cache.verdicts(names, request)
    offered = Counter(cache.rails_at(n, v) for n, v in zip(names, verdicts, strict=True) if v.fits)
    whole = any(cache.slots(n, request, count) >= count for n in names)
    return whole or any(n >= count for r, n in offered.items() if r)


def rail_cache(nodes: Mapping[str, Mapping[str, str]]) -> ClusterCache:
    """An extender cache of `nodes` (name -> labels), no NRT or pod yet."""
    cache = ClusterCache()
    objs = [{"metadata": {"name": n, "labels": dict(labels)}} for n, labels in nodes.items()]
    cache.replace("node", objs)
    cache.replace("pod", [])
    return cache


class RailCluster:
    """Kubelet harnesses (one per node) and an extender cache fed their published NRTs."""

    def __init__(
        self,
        backend: Any,
        sample: Any,
        weights: FabricScoring,
        nodes: Mapping[str, Mapping[str, str]],
    ) -> None:
        """`nodes`: each node's name and labels (the agent's tier labels, if any)."""
        from tests.kubelet.harness import KubeletHarness

        self.weights = weights
        self.nodes = {
            n: KubeletHarness(sample, "best-effort", "container", name=n, backend=backend).start()
            for n in nodes
        }
        self.names = sorted(self.nodes)
        self.cache = rail_cache(nodes)
        self.cache.replace("nrt", [self._nrt(n) for n in self.names])

    def _nrt(self, name: str) -> dict[str, Any]:
        h = self.nodes[name]
        return nrt.to_object(h.published(h.rail_uplinks()))

    def choose(self, pod: dict[str, Any], rng: random.Random, rdmaplane: bool) -> str | None:
        request = podrequest.pod_request(pod)
        verdicts = self.cache.verdicts(self.names, request)
        if rdmaplane:
            scores, _ = self.cache.job_scores(pod, self.names, request, verdicts, self.weights)
        else:  # kube-scheduler's default NodeResourcesFit: least allocated GPUs
            gpus = request.total[nrt.GPU]
            scores = [self._free_gpus(n) - gpus for n in self.names]
        fits = [(s, n) for s, n, v in zip(scores, self.names, verdicts, strict=True) if v.fits]
        if not fits:
            return None
        top = max(s for s, _ in fits)
        return rng.choice([n for s, n in fits if s == top])

    def matchable(self, pod: dict[str, Any], count: int) -> bool:
        return matchable(self.cache, self.names, pod, count)

    def _free_gpus(self, name: str) -> int:
        entry = self.cache.entry(name)
        return sum(z.free[nrt.GPU] for z in entry.state.zones) if entry else 0

    def bind(self, pod: dict[str, Any], name: str) -> tuple[str, frozenset[int], bool] | None:
        """Bind the pod, let the node's kubelet admit it; (uid, its real rails, predicted?)."""
        request = podrequest.pod_request(pod)
        predicted = self.cache.rails_at(name, self.cache.verdict(name, request))
        h = self.nodes[name]
        admission = h.admit(pod)
        if not admission.admitted:
            return None
        bound = {**pod, "spec": {**pod["spec"], "nodeName": name}}
        self.cache.apply("pod", "MODIFIED", bound)
        self.cache.apply("nrt", "MODIFIED", self._nrt(name))
        got = h.rails(admission)
        return admission.uid, got, got == predicted

    def end(self, pod: dict[str, Any], name: str, uid: str) -> None:
        self.nodes[name].delete(uid)
        self.cache.apply("pod", "DELETED", pod)
        self.cache.apply("nrt", "MODIFIED", self._nrt(name))


@contextlib.contextmanager
def rail_cluster(sample: Any, nodes: Mapping[str, Mapping[str, str]]) -> Iterator[RailCluster]:
    """A `RailCluster` on a kubelet backend of its own, closed after."""
    from tests.kubelet.harness import Backend, HarnessMissing

    try:
        backend = Backend.start()
    except HarnessMissing as exc:
        sys.exit(
            f"error: the kubelet harness is not built ({exc}); "
            "run scripts/build-k8s.sh kubelet-harness"
        )
    try:
        yield RailCluster(backend, sample, FabricScoring(), nodes)
    finally:
        backend.close()


def tally_pairs(tally: RailTally, rails: list[tuple[str, frozenset[int]]], allowed: bool) -> None:
    """Count a job's cross-node pod pairs (node, rails of each placed pod) and which match."""
    for (na, ra), (nb, rb) in itertools.combinations(rails, 2):
        if na != nb:
            match = rl.rails_match(ra, rb)
            tally.pairs += 1
            tally.matched += match
            tally.allowed_pairs += allowed
            tally.allowed_matched += allowed and match
