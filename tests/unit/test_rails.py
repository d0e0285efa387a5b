"""Rails: which rails a pod's devices are predicted on, and a job's pods on matching rails
(unit 1 of a rail-optimised fabric: NIC k of every node on rail k's leaf)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.core import nrt
from rdmaplane.core.settings.scheduler import FabricScoring
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.policy import fit, nodestate, podrequest
from rdmaplane.services.scheduler.policy import jobaware as ja
from rdmaplane.services.scheduler.policy import rails as rl
from tests.fabrics import rail_optimised
from tests.layouts import hgx_uplinks, layout
from tests.scheduler_helpers import pod
from tests.unit.test_jobaware import cluster, place

JOB = "batch.kubernetes.io/job-name"
RAILS = [f"su0-rail{r}" for r in range(8)]


def test_root_rails_come_from_the_hca_zones_below_each_pcie_root() -> None:
    topology = layout("hgx", "n", uplinks=hgx_uplinks(RAILS))
    roots = rl.root_rails(topology.uplinks())
    assert roots == {u.pcie_root: (u.rail,) for u in hgx_uplinks(RAILS)}
    assert rl.root_rails(layout("hgx", "n").uplinks()) == {}  # no HCA zones: no rails


def test_a_half_node_pod_gets_the_rails_of_the_roots_it_is_placed_on() -> None:
    topology = layout("hgx", "n", uplinks=hgx_uplinks(RAILS))
    roots = rl.root_rails(topology.uplinks())
    state = nodestate.node_state(topology)
    request = podrequest.PodRequest.of({nrt.GPU: 4, nrt.HCA: 4})
    first = fit.evaluate(state, request)
    assert rl.pod_rails(state, first.placements, roots) == {0, 1, 2, 3}
    assert first.state_after is not None
    second = fit.evaluate(first.state_after, request)
    assert rl.pod_rails(first.state_after, second.placements, roots) == {4, 5, 6, 7}
    gpus_only = fit.evaluate(state, podrequest.PodRequest.of({nrt.GPU: 2}))
    assert rl.pod_rails(state, gpus_only.placements, roots) == {0, 1}


rail_sets = st.frozensets(st.integers(0, 7), max_size=8)


@given(rail_sets, rail_sets)
def test_rails_match_is_symmetric_and_a_whole_node_matches_every_pod(
    a: rl.Rails, b: rl.Rails
) -> None:
    assert rl.rails_match(a, b) == rl.rails_match(b, a)
    assert rl.rails_match(a, frozenset(range(8))) == bool(a)
    assert rl.rails_match(a, a) == bool(a)
    assert not rl.rails_match(a, rl.NONE)


@given(rail_sets, st.lists(rail_sets, max_size=6))
def test_match_share_counts_only_peers_with_known_rails(c: rl.Rails, peers: list[rl.Rails]) -> None:
    share = rl.match_share(c, peers)
    known = [p for p in peers if p]
    assert (share is None) == (not known)
    if share is not None:
        assert share == sum(rl.rails_match(c, p) for p in known) / len(known)


def _pod(name: str, job: str, gpus: int, node: str = "") -> dict[str, Any]:
    obj = pod(name, gpus, gpus, node=node, ns="jobs")
    obj["metadata"]["labels"] = {JOB: job}
    return obj


def _half_used(cache: ClusterCache) -> list[str]:
    """Every node of unit 0 but two gets an unrelated 4-GPU pod on rails 0-3."""
    names = sorted(cache.locations)[:8]
    for n in names[2:]:
        cache.apply("pod", "ADDED", _pod(f"other-{n}", f"other-{n}", 4, node=n))
    return names


def test_a_jobs_pods_land_where_the_kubelet_gives_them_the_same_rails() -> None:
    cache = cluster(rail_optimised(units=1), labelled=False)
    _half_used(cache)
    pods = [_pod(f"j-{i}", "j", 4) for i in range(2)]
    for p in pods:
        cache.apply("pod", "ADDED", p)
    placed = [place(cache, p) for p in pods]
    context = cache.job_context(_pod("j-2", "j", 4))
    assert context is not None, placed
    assert context.peer_rails == (frozenset({0, 1, 2, 3}),) * 2, (placed, context)


def test_without_rails_the_same_second_pod_packs_onto_other_rails() -> None:
    """The rail term is what keeps the job on one rail set: scored as before it, the second pod
    packs onto a half-used node (rails 4-7) while the first sits on rails 0-3."""
    cache = cluster(rail_optimised(units=1), labelled=False)
    empty = _half_used(cache)[:2]
    peer = _pod("j-0", "j", 4, node=empty[0])
    cache.apply("pod", "ADDED", peer)
    second = _pod("j-1", "j", 4)
    cache.apply("pod", "ADDED", second)
    context = cache.job_context(second)
    assert context is not None and context.peer_rails == (frozenset({0, 1, 2, 3}),)
    names = sorted(cache.locations)
    request = podrequest.pod_request(second)
    verdicts = cache.verdicts(names, request)
    locations = cache.locations
    slots = lambda i, cap: 1  # noqa: E731
    with_rails = ja.fabric_terms(
        names, slots, locations, context, lambda i: cache.rails_at(names[i], verdicts[i])
    )
    without = ja.fabric_terms(names, slots, locations, context)
    assert with_rails is not None and without is not None
    scores = [
        ja.compose(v.score, t, FabricScoring()) for v, t in zip(verdicts, with_rails, strict=True)
    ]
    plain = [
        ja.compose(v.score, t, FabricScoring()) for v, t in zip(verdicts, without, strict=True)
    ]
    best = names[max(range(len(names)), key=lambda i: (verdicts[i].fits, scores[i], -i))]
    packed = names[max(range(len(names)), key=lambda i: (verdicts[i].fits, plain[i], -i))]
    assert best == empty[1]  # the one node where the kubelet gives it rails 0-3
    assert packed != empty[1]
    assert not rl.rails_match(cache.rails_at(packed, verdicts[names.index(packed)]), {0, 1, 2, 3})


def test_a_jobs_first_pod_takes_rails_enough_other_nodes_still_offer() -> None:
    """Nodes 0-1 half used (they offer rails 4-7), 2-4 empty (0-3), 5-7 full. A 3-pod job's
    first pod on rails 4-7 would leave its third pod no node on them; on 0-3 all three match."""
    cache = cluster(rail_optimised(units=1), labelled=False)
    names = sorted(cache.locations)[:8]
    for n in names[:2]:
        cache.apply("pod", "ADDED", _pod(f"half-{n}", f"half-{n}", 4, node=n))
    for n in names[5:]:
        cache.apply("pod", "ADDED", _pod(f"full-{n}", f"full-{n}", 8, node=n))
    pods = [_pod(f"j-{i}", "j", 4) for i in range(3)]
    for p in pods:
        cache.apply("pod", "ADDED", p)
    request = podrequest.pod_request(pods[0])
    assert {cache.rails_at(n, cache.verdict(n, request)) for n in names[:2]} == {
        frozenset(range(4, 8))
    }
    placed = [place(cache, p) for p in pods]
    assert set(placed) <= set(names[2:5]), placed
    context = cache.job_context(_pod("j-3", "j", 4))
    assert context is not None and set(context.peer_rails) == {frozenset(range(4))}


@given(
    st.lists(st.tuples(st.sampled_from(["a", "b", None]), rail_sets), max_size=10),
    st.integers(0, 5),
)
def test_rail_room_counts_the_other_nodes_under_the_switch_on_matching_rails(
    candidates: list[tuple[str | None, rl.Rails]], others: int
) -> None:
    room = rl.rail_room(candidates, others)
    for (switch, rails), got in zip(candidates, room, strict=True):
        if not rails or not others:
            assert got is None
            continue
        matching = [
            j for j, (s, r) in enumerate(candidates) if s == switch and rl.rails_match(rails, r)
        ]
        assert got == min(1.0, (len(matching) - 1) / others)
