"""Job-aware scoring through the extender's cache: pods of a job land under one leaf when they
fit, decode pods near their prefill, rails from the NRT when nodes carry no labels. Pods are
placed one at a time, as kube-scheduler does, on the highest score (ties: lowest name)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.adapters.config.fabric import fabric_from_document
from rdmaplane.core import fabric as fab
from rdmaplane.core import nrt
from rdmaplane.core.settings.scheduler import FabricScoring
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.decisions import Decisions
from rdmaplane.services.scheduler.policy import jobaware as ja
from rdmaplane.services.scheduler.policy import podrequest
from tests.fabrics import leaf_spine, rail_optimised
from tests.layouts import hgx_uplinks, layout
from tests.scheduler_helpers import pod

JOB = "batch.kubernetes.io/job-name"


def cluster(doc: dict[str, Any], labelled: bool = True) -> ClusterCache:
    """Every node an HGX (8 GPUs + 8 NICs); its tiers as topograph labels, or (rail-optimised
    fabrics, `labelled=False`) only as the NRT's HCA zones."""
    fabric = fabric_from_document(doc)
    cache = ClusterCache()
    nodes, nrts = [], []
    for name, where in sorted(fabric.locations().items()):
        labels = fab.tier_labels(where, fab.DEFAULT_TIER_LABELS) if labelled else {}
        nodes.append({"metadata": {"name": name, "labels": labels}})
        ups = None if labelled else hgx_uplinks([s for _, s in where.rails])
        nrts.append(nrt.to_object(layout("hgx", name, uplinks=ups)))
    cache.replace("node", nodes)
    cache.replace("nrt", nrts)
    cache.replace("pod", [])
    return cache


def job_pod(name: str, labels: dict[str, str], node: str = "", ns: str = "jobs") -> dict[str, Any]:
    obj = pod(name, 8, 8, node=node, ns=ns)
    obj["metadata"]["labels"] = labels
    return obj


def place(
    cache: ClusterCache, obj: dict[str, Any], weights: FabricScoring = FabricScoring()
) -> str:
    """Score every node as the extender would, bind the pod to the best one."""
    names = sorted(cache.locations)
    request = podrequest.pod_request(obj)
    verdicts = cache.verdicts(names, request)
    scores, _ = cache.job_scores(obj, names, request, verdicts, weights)
    best = max((s, -i) for i, (s, v) in enumerate(zip(scores, verdicts, strict=True)) if v.fits)
    chosen = names[-best[1]]
    cache.apply("pod", "MODIFIED", {**obj, "spec": {**obj["spec"], "nodeName": chosen}})
    return chosen


def occupy(cache: ClusterCache, busy: dict[int, int], per_leaf: int = 16) -> None:
    """Fill the first `busy[leaf]` nodes of each leaf with unrelated whole-node pods."""
    for leaf, count in busy.items():
        for k in range(count):
            node = f"gpu-{leaf * per_leaf + k:03d}"
            cache.apply("pod", "ADDED", pod(f"other-{node}", 8, 8, node=node, ns="other"))


def leaf_of(cache: ClusterCache, node: str) -> str:
    return cache.locations[node].tiers[0]


def test_pod_groups_from_job_controller_labels() -> None:
    def group(labels: dict[str, str], annotations: dict[str, str] | None = None) -> ja.PodGroup:
        meta = {"namespace": "ml", "labels": labels, "annotations": annotations or {}}
        return ja.pod_group({"metadata": meta})

    assert group({JOB: "train"}).group == "ml/train"
    assert group({JOB: "train-w-0", "jobset.sigs.k8s.io/jobset-name": "train"}).group == "ml/train"
    assert group({JOB: "x", "rdmaplane.io/group": "mine"}).group == "ml/mine"
    lws = {
        "leaderworkerset.sigs.k8s.io/name": "llm",
        "leaderworkerset.sigs.k8s.io/group-index": "2",
    }
    found = group(lws, {"leaderworkerset.sigs.k8s.io/size": "4"})
    assert (found.group, found.size) == ("ml/llm/2", 4)
    kv = group({"rdmaplane.io/group": "dec"}, {"rdmaplane.io/kv-peers": "pre"})
    assert (kv.group, kv.kv_peers) == ("ml/dec", "ml/pre")
    assert group({"rdmaplane.io/group-size": "nope"}).size is None
    assert group({}) == ja.PodGroup(None, None, None)


def test_an_eight_pod_job_lands_under_the_one_leaf_it_fits_best() -> None:
    cache = cluster(leaf_spine(4, 16))
    occupy(cache, {0: 10, 1: 12, 2: 4, 3: 7})  # free: 6, 4, 12, 9
    pods = [job_pod(f"train-{i}", {JOB: "train"}) for i in range(8)]
    for p in pods:  # the Job controller creates them all before the first is scheduled
        cache.apply("pod", "ADDED", p)
    placed = [place(cache, p) for p in pods]
    assert {leaf_of(cache, n) for n in placed} == {"leaf-3"}  # 9 free: the tightest that fits
    assert len(set(placed)) == 8


def test_without_the_fabric_term_the_same_job_spreads() -> None:
    """The control: node-local scores alone tie on every free node; kube-scheduler picks one
    of the tied nodes at random."""
    cache = cluster(leaf_spine(4, 16))
    occupy(cache, {0: 10, 1: 12, 2: 4, 3: 7})
    rng = random.Random(3)
    leaves = set()
    for i in range(8):
        obj = job_pod(f"train-{i}", {JOB: "train"})
        names = sorted(cache.locations)
        request = podrequest.pod_request(obj)
        verdicts = cache.verdicts(names, request)
        scores, _ = cache.job_scores(obj, names, request, verdicts, FabricScoring(0, 1))
        top = max(s for s, v in zip(scores, verdicts, strict=True) if v.fits)
        tied = [n for n, s, v in zip(names, scores, verdicts, strict=True) if v.fits and s == top]
        chosen = rng.choice(tied)
        cache.apply("pod", "MODIFIED", {**obj, "spec": {**obj["spec"], "nodeName": chosen}})
        leaves.add(leaf_of(cache, chosen))
    assert len(leaves) > 1


def test_a_job_of_unknown_size_starts_where_there_is_most_room() -> None:
    cache = cluster(leaf_spine(4, 16))
    occupy(cache, {0: 10, 1: 12, 2: 4, 3: 7})
    placed = [place(cache, job_pod(f"solo-{i}", {JOB: "solo"})) for i in range(8)]
    assert {leaf_of(cache, n) for n in placed} == {"leaf-2"}  # 12 free


def test_a_job_too_big_for_any_leaf_stays_under_one_spine() -> None:
    cache = cluster(leaf_spine(4, 16))
    occupy(cache, {0: 10, 1: 12, 2: 10, 3: 12})  # 6, 4, 6, 4 free
    pods = [job_pod(f"big-{i}", {JOB: "big"}) for i in range(10)]
    for p in pods:
        cache.apply("pod", "ADDED", p)
    placed = [place(cache, p) for p in pods]
    spines = {cache.locations[n].tiers[1] for n in placed}
    assert len(spines) == 1  # 6 + 4 under one spine hold all ten


def test_decode_pods_land_under_their_prefill_leaf() -> None:
    cache = cluster(leaf_spine(4, 16))
    occupy(cache, {0: 4, 1: 4, 2: 4, 3: 4})
    prefill = {"rdmaplane.io/group": "llm-prefill"}
    for i, node in enumerate(("gpu-036", "gpu-037")):  # on leaf-2
        cache.apply("pod", "ADDED", job_pod(f"prefill-{i}", prefill, node=node))
    decode = {"rdmaplane.io/group": "llm-decode", "rdmaplane.io/kv-peers": "llm-prefill"}
    placed = [place(cache, job_pod(f"decode-{i}", decode)) for i in range(6)]
    assert {leaf_of(cache, n) for n in placed} == {"leaf-2"}


def test_decode_overflows_to_the_sibling_leaf_under_the_same_spine() -> None:
    cache = cluster(leaf_spine(4, 16))
    occupy(cache, {0: 12, 1: 14, 2: 4, 3: 4})  # leaf-1 has 2 free, its sibling leaf-0 has 4
    prefill = {"rdmaplane.io/group": "p"}
    cache.apply("pod", "ADDED", job_pod("prefill-0", prefill, node="gpu-030"))
    decode = {"rdmaplane.io/group": "d", "rdmaplane.io/kv-peers": "p"}
    placed = [place(cache, job_pod(f"decode-{i}", decode)) for i in range(4)]
    assert [leaf_of(cache, n) for n in placed] == ["leaf-1", "leaf-0", "leaf-0", "leaf-0"]


def test_rail_optimised_nodes_known_only_by_their_nrt_rails() -> None:
    cache = cluster(rail_optimised(units=4, per_unit=8, rails=8), labelled=False)
    assert cache.locations["gpu-000"].rails == tuple((r, f"su0-rail{r}") for r in range(8))
    occupy(cache, {0: 5, 1: 2, 2: 7, 3: 3}, per_leaf=8)  # free: 3, 6, 1, 5
    pods = [job_pod(f"ring-{i}", {JOB: "ring"}) for i in range(5)]
    for p in pods:
        cache.apply("pod", "ADDED", p)
    placed = [place(cache, p) for p in pods]
    assert {leaf_of(cache, n) for n in placed} == {leaf_of(cache, "gpu-024")}  # su3: 5 free


def test_pods_without_a_group_keep_their_node_local_score() -> None:
    cache = cluster(leaf_spine(2, 4))
    obj = pod("loner", 4, 4, ns="x")
    names = sorted(cache.locations)
    request = podrequest.pod_request(obj)
    verdicts = cache.verdicts(names, request)
    scores, terms = cache.job_scores(obj, names, request, verdicts, FabricScoring())
    assert terms is None and scores == [v.score for v in verdicts]


@pytest.mark.parametrize(
    ("local", "term", "weights", "score"),
    [
        (10, 1.0, FabricScoring(), 10),
        (10, 0.0, FabricScoring(), 5),
        (8, 0.5, FabricScoring(1, 0), 5),
        (8, 0.5, FabricScoring(0, 0), 8),
    ],
)
def test_compose(local: int, term: float, weights: FabricScoring, score: int) -> None:
    assert ja.compose(local, term, weights) == score


def test_finished_and_deleted_pods_leave_their_group() -> None:
    cache = cluster(leaf_spine(2, 4))
    a = job_pod("a", {JOB: "j"}, node="gpu-000")
    cache.apply("pod", "ADDED", a)
    probe = job_pod("b", {JOB: "j"})
    context = cache.job_context(probe)
    assert context and context.peer_nodes == ("gpu-000",) and context.remaining == 1
    cache.apply("pod", "MODIFIED", {**a, "status": {"phase": "Succeeded"}})
    assert cache.job_context(probe) == ja.JobContext((), None)
    cache.apply("pod", "ADDED", a)
    cache.apply("pod", "DELETED", a)
    assert cache.job_context(probe) == ja.JobContext((), None)


def test_a_prefill_makes_room_for_its_pending_decode_pods() -> None:
    cache = cluster(leaf_spine(4, 16))
    occupy(cache, {0: 13, 1: 10, 2: 16, 3: 16})  # free: 3 under leaf-0, 6 under leaf-1
    prefill = [job_pod(f"pre-{i}", {"rdmaplane.io/group": "p"}) for i in range(2)]
    decode_labels = {"rdmaplane.io/group": "d", "rdmaplane.io/kv-peers": "p"}
    decode = [job_pod(f"dec-{i}", decode_labels) for i in range(3)]
    for p in prefill + decode:  # created together, as llm-d or Dynamo deployments are
        cache.apply("pod", "ADDED", p)
    placed = [place(cache, p) for p in prefill + decode]
    # alone, the prefill would best-fit leaf-0 (3 free) and push its decode pods away
    assert {leaf_of(cache, n) for n in placed} == {"leaf-1"}


def schedule_back_to_back(decide: Decisions, pods: list[dict[str, Any]], assume: bool) -> list[str]:
    """kube-scheduler's view of a burst: each pod is filtered and prioritized on the nodes its
    own cache still has room on (1 whole-node pod each), and none of the binds has reached
    the extender's watch yet."""
    taken: set[str] = set()
    placed = []
    for p in pods:
        names = [n for n in sorted(decide.cache.locations) if n not in taken]
        passed = decide.filter(p, names).passed
        answer = decide.answer_prioritize if assume else decide.prioritize
        scores = answer(p, passed).scores
        chosen = passed[max(range(len(passed)), key=scores.__getitem__)]
        taken.add(chosen)
        placed.append(chosen)
    return placed


@pytest.mark.parametrize("assume", [True, False])
def test_a_burst_scored_before_any_bind_is_watched_stays_under_one_leaf(assume: bool) -> None:
    """Without assuming each pod on its best node, the third pod sees 7 free nodes under the
    leaf the first two took for a job of 8 and turns to the next leaf: the e2e race."""
    cache = cluster(leaf_spine(4, 16))
    occupy(cache, {0: 10, 1: 12, 2: 4, 3: 7})  # free: 6, 4, 12, 9
    pods = [job_pod(f"train-{i}", {JOB: "train"}) for i in range(8)]
    for p in pods:
        cache.apply("pod", "ADDED", p)
    placed = schedule_back_to_back(Decisions(cache, FabricScoring()), pods, assume)
    leaves = {leaf_of(cache, n) for n in placed}
    assert (leaves == {"leaf-3"}) is assume, leaves


def test_an_assumption_gives_way_to_the_watched_bind_and_to_time() -> None:
    now = [0.0]
    cache = ClusterCache(assume_for_s=30, clock=lambda: now[0])
    a, probe = job_pod("a", {JOB: "j"}), job_pod("b", {JOB: "j"})
    cache.apply("pod", "ADDED", a)
    cache.assume(a, "gpu-001")
    assert cache.job_context(probe) == ja.JobContext(("gpu-001",), 1)
    cache.apply("pod", "MODIFIED", {**a, "spec": {**a["spec"], "nodeName": "gpu-002"}})
    assert cache.job_context(probe) == ja.JobContext(("gpu-002",), 1)  # where it really went
    cache.assume(a, "gpu-003")  # a bound pod is not assumed anywhere else
    assert cache.job_context(probe) == ja.JobContext(("gpu-002",), 1)
    cache.apply("pod", "DELETED", a)
    cache.apply("pod", "ADDED", a)
    cache.assume(a, "gpu-001")
    now[0] = 29.9
    assert cache.job_context(probe) == ja.JobContext(("gpu-001",), 1)
    now[0] = 30.0  # kube-scheduler chose another node or could not bind: the watch is silent
    assert cache.job_context(probe) == ja.JobContext((), 2)  # both pending again


def gang_pod(name: str, group: str | None) -> dict[str, Any]:
    obj = job_pod(name, {JOB: "gang"})
    if group is not None:
        obj["spec"]["schedulingGroup"] = {"podGroupName": group}
    return obj


def schedule_by_placements(decide: Decisions, pods: list[dict[str, Any]], tier: int) -> list[str]:
    """kube-scheduler's pod-group cycle with a `TopologyConstraint` on tier `tier`'s label:
    one placement per domain, in name order; each pod asked about with the free nodes of that
    placement only; the first placement where every pod finds a node wins (its last tried
    placement is the one kept by the extender's assumptions only when it wins)."""
    domains = sorted({where.tiers[tier] for where in decide.cache.locations.values()})
    for domain in domains:
        members = [n for n, w in sorted(decide.cache.locations.items()) if w.tiers[tier] == domain]
        taken: set[str] = set()
        placed = []
        for p in pods:
            passed = decide.filter(p, [n for n in members if n not in taken]).passed
            if not passed:
                break
            scores = decide.answer_prioritize(p, passed).scores
            placed.append(passed[max(range(len(passed)), key=scores.__getitem__)])
            taken.add(placed[-1])
        else:
            return placed
    raise AssertionError("no placement holds the gang")


@pytest.mark.parametrize("gang", [True, False])
def test_a_gang_under_one_spine_takes_the_leaf_that_holds_it_after_a_failed_spine(
    gang: bool,
) -> None:
    """Spine 0 (7 free nodes) is tried first and fails at the eighth pod, leaving seven
    assumptions there. Spine 1 has leaf 2 (5 free, lowest names) and leaf 3 (9 free). A pod
    naming its PodGroup leaves the peers assumed in spine 0 out and asks for room for all
    eight: leaf 3. Counted with them, the first pod sees peers equally far from every node of
    spine 1, takes the lowest name, and the gang splits across leaves 2 and 3."""
    cache = cluster(leaf_spine(4, 16))
    occupy(cache, {0: 13, 1: 12, 2: 11, 3: 7})  # free: 3, 4 | 5, 9
    pods = [gang_pod(f"g-{i}", "gang-workers" if gang else None) for i in range(8)]
    for p in pods:
        cache.apply("pod", "ADDED", p)
    placed = schedule_by_placements(Decisions(cache, FabricScoring()), pods, tier=1)
    leaves = {leaf_of(cache, n) for n in placed}
    assert (leaves == {"leaf-3"}) is gang, leaves


def test_peers_outside_the_switch_all_candidates_share_are_left_out() -> None:
    where = {
        "a": fab.Location(("leaf-0", "spine-0")),
        "b": fab.Location(("leaf-1", "spine-0")),
        "c": fab.Location(("leaf-2", "spine-1")),
    }
    peers = list(where.values())
    assert ja.within_candidates(peers, [where["a"], where["b"]]) == peers[:2]  # spine-0
    assert ja.within_candidates(peers, [where["a"]]) == peers[:1]  # leaf-0, not spine-0
    assert ja.within_candidates(peers, [where["a"], where["c"]]) == peers  # no shared switch
    assert ja.within_candidates(peers, []) == peers


def test_a_pod_naming_its_podgroup_is_grouped_by_it_without_job_labels() -> None:
    obj = pod("w-0", 8, 8, ns="ml")
    obj["spec"]["schedulingGroup"] = {"podGroupName": "train-workers"}
    assert ja.pod_group(obj) == ja.PodGroup("ml/train-workers", None, None, "ml/train-workers")
    obj["metadata"]["labels"] = {JOB: "train"}
    assert ja.pod_group(obj).group == "ml/train"  # the job's label still names the group


def _tree_location(index: int) -> fab.Location:
    """Node `index` of a 3-tier tree: 4 nodes a leaf, 2 leaves a spine, 2 spines a core."""
    leaf, spine, core = index // 4, index // 8, index // 16
    return fab.Location((f"leaf-{leaf}", f"spine-{spine}", f"core-{core}"))


@given(
    st.lists(st.integers(0, 31), min_size=1, max_size=8),
    st.lists(st.integers(0, 31), min_size=1, max_size=12),
)
def test_leaving_out_peers_outside_the_candidates_switch_never_reorders_them(
    candidates: list[int], peers: list[int]
) -> None:
    """Closeness to a peer outside the closest switch all candidates share is the same from
    every candidate: leaving such peers out changes no candidate's rank, only the spread."""
    names = [f"n{i}" for i in candidates]
    locations = {f"n{i}": _tree_location(i) for i in range(32)}
    peer_nodes = tuple(f"n{i}" for i in peers)
    kept = ja.within_candidates([locations[n] for n in peer_nodes], [locations[n] for n in names])
    every = ja.fabric_terms(names, lambda i, cap: 1, locations, ja.JobContext(peer_nodes, 1))
    gang = ja.fabric_terms(names, lambda i, cap: 1, locations, ja.JobContext(peer_nodes, 1, True))
    assert every is not None and gang is not None
    if kept:
        pairs = [(a, b) for a in range(len(names)) for b in range(len(names))]
        assert all((every[a] < every[b]) == (gang[a] < gang[b]) for a, b in pairs)
    else:  # every peer elsewhere: all candidates were equally far, now the room term decides
        assert len(set(every)) == 1


def test_kube_schedulers_random_pick_among_its_top_nodes_is_where_the_extender_assumed() -> None:
    """A job's first pod, two leaves holding the job equally tightly: every free node under
    either fits it best. kube-scheduler picks at random among the nodes with the top score and
    the extender assumes the pod on its own best node for the job's next pods (no bind is
    watched during the burst). One node alone at the top: the two agree, and the job stays
    under one leaf whatever kube-scheduler draws (the bench's --real: 80 % of jobs otherwise)."""
    for seed in range(10):
        cache = cluster(leaf_spine(4, 16))
        occupy(cache, {0: 8, 1: 8, 2: 16, 3: 16})  # 8 free under leaf-0 and under leaf-1
        pods = [job_pod(f"train-{i}", {JOB: "train"}) for i in range(8)]
        for p in pods:
            cache.apply("pod", "ADDED", p)
        decide, rng, taken = Decisions(cache, FabricScoring()), random.Random(seed), set[str]()
        for k, p in enumerate(pods):
            passed = decide.filter(p, [n for n in sorted(cache.locations) if n not in taken]).passed
            scored = decide.answer_prioritize(p, passed)
            if k == 0:  # composed alone, the leaves tie at the top
                assert scored.terms is not None
                plain = [ja.compose(v.score, t, FabricScoring()) for v, t in
                         zip(scored.verdicts, scored.terms, strict=True)]  # fmt: skip
                tied = {leaf_of(cache, n) for n, s in zip(passed, plain, strict=True)
                        if s == max(plain)}  # fmt: skip
                assert tied == {"leaf-0", "leaf-1"}
            top = max(scored.scores)
            chosen = rng.choice([n for n, s in zip(passed, scored.scores, strict=True) if s == top])
            peers = cache.job_context(pods[-1] if k < 7 else pods[0])
            assert peers is not None and chosen in peers.peer_nodes  # assumed where it went
            taken.add(chosen)
        assert {leaf_of(cache, n) for n in taken} == {"leaf-0"}, seed


score_rows = st.lists(
    st.tuples(st.integers(0, 10), st.booleans(), st.floats(0, 1), st.integers(0, 31)),
    min_size=1,
    max_size=12,
)


@given(score_rows, st.randoms(use_true_random=False))
def test_one_fitting_node_alone_holds_the_top_score_whatever_the_order(
    rows: list[tuple[int, bool, float, int]], rnd: random.Random
) -> None:
    names = [f"n{i:02d}" for i in range(len(rows))]
    locations = {n: _tree_location(r[3]) for n, r in zip(names, rows, strict=True)}
    local, fits, terms = ([r[k] for r in rows] for k in range(3))
    weights = FabricScoring()
    got = ja.job_scores(names, local, fits, terms, locations, weights)
    plain = [ja.compose(s, t, weights) for s, t in zip(local, terms, strict=True)]
    top = max((p for p, f in zip(plain, fits, strict=True) if f), default=0)
    at_top = [n for n, g, f in zip(names, got, fits, strict=True) if f and g == top]
    assert len(at_top) == (1 if top > 0 else len(at_top))
    for g, p, f in zip(got, plain, fits, strict=True):
        assert g == p or (f and p == top and g == top - 1)
    order = rnd.sample(range(len(rows)), len(rows))
    shuffled = ja.job_scores(
        [names[i] for i in order],
        [local[i] for i in order],
        [fits[i] for i in order],
        [terms[i] for i in order],
        locations,
        weights,
    )
    assert dict(zip([names[i] for i in order], shuffled, strict=True)) == dict(
        zip(names, got, strict=True)
    )
    unweighted = FabricScoring(0, 1)  # the fabric term counts for nothing: ties stay ties
    assert ja.job_scores(names, local, fits, terms, locations, unweighted) == [
        ja.compose(s, t, unweighted) for s, t in zip(local, terms, strict=True)
    ]
