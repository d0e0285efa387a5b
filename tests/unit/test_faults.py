"""Fault classes: symptoms from a poll, hysteresis, whom a fault hurts, and the decisions."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.adapters.discovery.samples import read_sample
from rdmaplane.core import breaker as B
from rdmaplane.core import faults as F
from rdmaplane.core.model import PhysState, PortObservation, PortState
from rdmaplane.core.porthealth import FaultClass, judge, rule_table
from tests.health_memory import risen_memory

RULES = F.FaultRules(fatal_after_s=5.0, clear_after_s=60.0)
WINDOW_S = 300.0
SYMPTOM_RULES = rule_table(
    WINDOW_S,
    thresholds={"symbol_error": 100, "link_downed": 0},
    fatal_thresholds={"link_downed": 0},
)
FATAL = F.Symptoms(fatal=("port 1 DOWN (DISABLED)",))
DEGRADED = F.Symptoms(degraded=("port 1 symbol_error +200 within 300 s (max 100)",))
CLEAN = F.Symptoms()
KEY = ("mlx5_0", 1)


@pytest.fixture(scope="module")
def hgx():
    return read_sample("hgx-h100-roce")


def run(polls, rules=RULES):
    """Feed (time, symptoms) polls for KEY; all changes, and the final state."""
    state, changes = F.FaultState(), []
    for now, found in polls:
        state, new = F.step(state, now, {KEY: found}, rules)
        changes += [(now, c) for c in new]
    return state, changes


# ----------------------------------------------------------------- symptoms


def symptoms(topo, watched, observations, risen, gid_index):
    """The fault classes' view of the watched ports, their counters having risen by `risen`
    (port → counter → increments) within the window."""
    memory = {key: risen_memory(counts, key) for key, counts in risen.items()}
    found = judge(
        [(hca, n) for hca, numbers in watched.items() for n in numbers],
        SYMPTOM_RULES,
        observations={(o.hca, o.port): o for o in observations},
        memory=memory,
        topology=topo,
        gid_index=gid_index,
    )
    return F.classify(found)


def obs(hca, up=True, port=1):
    state = (PortState.ACTIVE, PhysState.LINK_UP) if up else (PortState.DOWN, PhysState.DISABLED)
    return PortObservation(hca, port, *state)


def compute(topo):
    return [(h.name, p.number) for h in topo.hcas for p in h.ports if h.name.startswith("mlx5_")]


def test_healthy_node_has_no_symptoms(hgx):
    watched = F.watched_ports(hgx, ["mlx5_0", "mlx5_1"], [("mlx5_0", 1), ("mlx5_1", 1)], {})
    found = symptoms(hgx, watched, [obs("mlx5_0"), obs("mlx5_1")], {}, 3)
    assert found == {("mlx5_0", 1): CLEAN, ("mlx5_1", 1): CLEAN}


def test_port_down_gone_and_counters(hgx):
    watched = {"mlx5_0": (1,), "mlx5_1": (1,), "mlx5_9": (1,), "mlx5_2": (1, 2)}
    risen = {("mlx5_1", 1): {"link_downed": 1, "symbol_error": 150}}
    found = symptoms(hgx, watched, [obs("mlx5_0", up=False), obs("mlx5_1")], risen, 3)
    assert found[("mlx5_0", 1)].fatal == ("port 1 DOWN (DISABLED)",)
    assert found[("mlx5_1", 1)] == F.Symptoms(
        fatal=("port 1 link_downed +1 within 300 s (max 0)",),
        degraded=("port 1 symbol_error +150 within 300 s (max 100)",),
    )
    assert found[("mlx5_9", 1)].fatal == ("mlx5_9 is gone",)
    assert found[("mlx5_2", 2)].fatal == ("mlx5_2 port 2 is gone",)


def test_gid_index_and_netdev_loss(hgx):
    hca = hgx.hca("mlx5_0")
    port = hca.ports[0]
    no_gids = dataclasses.replace(port, gids=tuple(g for g in port.gids if g.index != 3))
    no_netdev = dataclasses.replace(port, netdev=None)
    for changed, expected in [
        (no_gids, "port 1 GID index 3 is empty"),
        (no_netdev, "port 1 has no netdev"),
    ]:
        topo = dataclasses.replace(
            hgx,
            hcas=tuple(
                dataclasses.replace(h, ports=(changed,)) if h is hca else h for h in hgx.hcas
            ),
        )
        found = symptoms(topo, {"mlx5_0": (1,)}, [obs("mlx5_0")], {}, 3)
        assert found[KEY].fatal == (expected,)
    # Without a uniform index to keep, the GID table is not judged.
    assert symptoms(hgx, {"mlx5_0": (1,)}, [obs("mlx5_0")], {}, None)[KEY] == CLEAN


def test_watched_ports_remember_what_went_down_or_away(hgx):
    first = F.watched_ports(hgx, ["mlx5_0", "mlx5_1"], [("mlx5_0", 1), ("mlx5_1", 1)], {})
    # mlx5_1 went down: no longer a compute port, still watched.
    later = F.watched_ports(hgx, ["mlx5_0", "mlx5_1"], [("mlx5_0", 1)], first)
    assert later == {"mlx5_0": (1,), "mlx5_1": (1,)}
    # An HCA the plugin no longer offers is no longer watched; one never seen gets port 1.
    assert F.watched_ports(hgx, ["mlx5_0", "mlx5_77"], [("mlx5_0", 1)], first) == {
        "mlx5_0": (1,),
        "mlx5_77": (1,),
    }


# ----------------------------------------------------------------- hysteresis


def test_fatal_only_after_persistence_and_since_is_the_start():
    state, changes = run([(0, CLEAN), (1, FATAL), (4, FATAL), (6, FATAL), (7, FATAL)])
    assert [(t, c.before, c.after.cls, c.after.since) for t, c in changes] == [
        (6, None, FaultClass.FATAL, 1)
    ]
    assert state.faults[KEY].reason == "port 1 DOWN (DISABLED)"


def test_short_blip_raises_nothing():
    _, changes = run([(0, FATAL), (3, CLEAN), (4, FATAL), (8, CLEAN)])
    assert changes == []


def test_fatal_clears_only_after_clear_after_of_health():
    polls = [(0, FATAL), (5, FATAL), (10, CLEAN), (40, CLEAN), (50, FATAL), (60, CLEAN)]
    polls += [(100, CLEAN), (119, CLEAN), (120, CLEAN)]
    state, changes = run(polls)
    assert [(t, c.after is None) for t, c in changes] == [(5, False), (120, True)]
    assert state.faults == {}


def test_degraded_at_once_escalates_and_falls_back():
    polls = [(0, DEGRADED), (5, FATAL), (10, FATAL), (20, DEGRADED), (80, DEGRADED), (200, CLEAN)]
    polls += [(259, CLEAN), (260, CLEAN)]
    _, changes = run(polls)
    classes = [(t, c.after.cls if c.after else None) for t, c in changes]
    assert classes == [
        (0, FaultClass.DEGRADED),
        (10, FaultClass.FATAL),
        (80, FaultClass.DEGRADED),
        (260, None),
    ]


def test_fatal_falls_back_to_degraded_while_errors_counted_lately():
    """Fatal, then error counters for a while, then clean: when the fatal fault's calm period
    ends on a clean poll, the recent errors keep a degraded fault, which clears by its own rule
    (found by hypothesis)."""
    polls = [(0, FATAL), (5, FATAL), (10, DEGRADED), (40, DEGRADED), (70, CLEAN), (131, CLEAN)]
    _, changes = run(polls)
    assert [(now, c.after.cls if c.after else None) for now, c in changes] == [
        (5, FaultClass.FATAL),
        (70, FaultClass.DEGRADED),
        (131, None),
    ]


def test_a_port_no_longer_watched_is_forgotten():
    state, _ = run([(0, FATAL), (5, FATAL)])
    state, changes = F.step(state, 6, {}, RULES)
    assert [(c.before.cls, c.after) for c in changes] == [(FaultClass.FATAL, None)]
    assert state.ports == {}


@given(
    st.lists(st.tuples(st.floats(0.5, 4.0), st.sampled_from(["down", "up"])), max_size=80),
)
def test_flapping_port_raises_one_fault_never_a_storm(flaps):
    """Polls every few seconds of a port flapping at any rhythm, with `link_downed` rising at
    each fall (as the hardware counts it, visible for the health window): one fault at most, and
    once raised it stays raised until clear_after of quiet."""
    now, state, raised, falls = 0.0, F.FaultState(), 0, []
    for gap, what in flaps:
        now += gap
        if what == "down":
            falls.append(now)
        recent = [t for t in falls if now - t < WINDOW_S]
        found = FATAL if what == "down" or recent else CLEAN
        state, changes = F.step(state, now, {KEY: found}, RULES)
        raised += sum(1 for c in changes if c.after is not None)
        assert not [c for c in changes if c.after is None], "cleared while still flapping"
    assert raised <= 1


@given(st.lists(st.tuples(st.floats(0.1, 30.0), st.sampled_from([FATAL, DEGRADED, CLEAN]))))
def test_hysteresis_invariants(polls):
    """Whatever the symptoms: a fatal fault is only raised after fatal_after_s of fatal symptoms
    and a fault is only cleared after clear_after_s without its symptoms."""
    now, state = 0.0, F.FaultState()
    history = []
    for gap, found in polls:
        now += gap
        history.append((now, found))
        state, changes = F.step(state, now, {KEY: found}, RULES)
        for change in changes:
            if change.after is not None and change.after.cls == FaultClass.FATAL:
                since = change.after.since
                assert now - since >= RULES.fatal_after_s
                assert all(s.fatal for t, s in history if t >= since)
            if change.after is None:
                quiet = [s for t, s in history if t > now - RULES.clear_after_s]
                assert not any(s.fatal or s.degraded for s in quiet)


# ----------------------------------------------------------------- node-wide


def fault(hca, cls=FaultClass.FATAL, port=1):
    return F.Fault(hca, port, cls, "port 1 DOWN (DISABLED)", 0.0)


def test_taint_only_when_every_compute_hca_is_fatal():
    hcas = ["mlx5_0", "mlx5_1"]
    one = {("mlx5_0", 1): fault("mlx5_0")}
    both = {**one, ("mlx5_1", 1): fault("mlx5_1")}
    assert F.node_taint(one, hcas, "NoExecute") is None
    assert F.node_taint(both, hcas, "NoExecute") == F.Taint(
        "rdmaplane.io/rdma-unhealthy", "2-hcas", "NoExecute"
    )
    assert F.node_taint(both, hcas, None) is None
    assert F.node_taint({}, [], "NoExecute") is None
    mixed = {**one, ("mlx5_1", 1): fault("mlx5_1", FaultClass.DEGRADED)}
    assert F.node_taint(mixed, hcas, "NoExecute") is None
    assert F.node_taint(mixed, hcas, "NoExecute", "NoSchedule").effect == "NoSchedule"


# ----------------------------------------------------------------- whom it hurts


def test_exclusive_device_hurts_its_holder_shared_slot_hurts_the_pool():
    faults = {("mlx5_1", 1): fault("mlx5_1")}
    devices = {
        ("rdmaplane.io/hca", "0000:18:00.0"): ("mlx5_0",),
        ("rdmaplane.io/hca", "0000:19:00.0"): ("mlx5_1",),
        ("rdmaplane.io/hca-shared", "pool-0"): ("mlx5_0", "mlx5_1"),
        ("rdmaplane.io/hca-shared", "pool-1"): ("mlx5_0", "mlx5_1"),
    }
    pods = {
        "a/one": {"rdmaplane.io/hca": ["0000:18:00.0"]},
        "a/two": {"rdmaplane.io/hca": ["0000:19:00.0"], "nvidia.com/gpu": ["GPU-1"]},
        "b/shared": {"rdmaplane.io/hca-shared": ["pool-1"]},
        "b/unknown": {"rdmaplane.io/hca": ["0000:ff:00.0"]},
    }
    hurt = F.pods_hurt(faults, devices, pods)
    assert set(hurt) == {"a/two", "b/shared"}
    assert hurt["a/two"] == (faults[("mlx5_1", 1)],)


def test_fatal_faults_come_first():
    faults = {("mlx5_0", 1): fault("mlx5_0", FaultClass.DEGRADED), ("mlx5_1", 1): fault("mlx5_1")}
    devices = {("r", "x"): ("mlx5_0", "mlx5_1")}
    hurt = F.pods_hurt(faults, devices, {"a/p": {"r": ["x"]}})
    assert [f.hca for f in hurt["a/p"]] == ["mlx5_1", "mlx5_0"]


# ----------------------------------------------------------------- decisions

EVICT = F.DecisionRules(F.Action.EVICT, grace_s=30.0, max_evictions_per_minute=2)


def carry_out(ledger, decisions, now):
    """What the actor records after doing each decision successfully."""
    for d in decisions:
        if d.verb in (F.Verb.NOTIFY, F.Verb.OBSERVE):
            ledger = ledger.noticed(d.pod, d.faults, now)
        elif d.verb == F.Verb.CLEAR:
            ledger = ledger.cleared(d.pod)
        elif d.verb == F.Verb.ACT:
            ledger = ledger.acted(d.pod, now, d.evict)
    return ledger


def test_notice_then_act_after_grace_once():
    hurt = {"a/p": (fault("mlx5_0"),)}
    ledger, seen = F.Ledger(), []
    for now in (0, 10, 29, 30, 35, 60):
        decisions = F.decide(now, hurt, ledger, EVICT)
        seen += [(now, d.verb, d.evict) for d in decisions]
        ledger = carry_out(ledger, decisions, now)
    assert seen == [(0, F.Verb.NOTIFY, False), (30, F.Verb.ACT, True)]


def test_degraded_is_noticed_never_acted_on():
    hurt = {"a/p": (fault("mlx5_0", FaultClass.DEGRADED),)}
    ledger = F.Ledger()
    verbs = []
    for now in (0, 100, 1000):
        decisions = F.decide(now, hurt, ledger, EVICT)
        verbs += [d.verb for d in decisions]
        ledger = carry_out(ledger, decisions, now)
    assert verbs == [F.Verb.NOTIFY]


def test_action_observe_and_notify():
    hurt = {"a/p": (fault("mlx5_0"),)}
    for action, expected in [
        (F.Action.OBSERVE, [F.Verb.OBSERVE]),
        (F.Action.NOTIFY, [F.Verb.NOTIFY, F.Verb.ACT]),
    ]:
        rules = dataclasses.replace(EVICT, action=action)
        ledger, verbs = F.Ledger(), []
        for now in (0, 40, 80):
            decisions = F.decide(now, hurt, ledger, rules)
            assert not any(d.evict for d in decisions)
            verbs += [d.verb for d in decisions]
            ledger = carry_out(ledger, decisions, now)
        assert verbs == expected


def test_stale_view_holds_everything():
    hurt = {"a/p": (fault("mlx5_0"),)}
    decisions = F.decide(0, hurt, F.Ledger(), EVICT, stale="API server unreachable")
    assert [(d.verb, d.why) for d in decisions] == [
        (F.Verb.HOLD, "stale view: API server unreachable")
    ]
    ledger = F.Ledger().noticed("a/p", hurt["a/p"], 0)
    assert F.decide(100, hurt, ledger, EVICT, stale="PodResources 70 s old")[0].verb == F.Verb.HOLD
    assert F.decide(100, hurt, ledger, EVICT)[0].verb == F.Verb.ACT


def test_rate_limit_per_minute():
    hurt = {f"a/p{i}": (fault("mlx5_0"),) for i in range(5)}
    ledger = F.Ledger()
    for pod, faults in hurt.items():
        ledger = ledger.noticed(pod, faults, 0)
    decisions = F.decide(40, hurt, ledger, EVICT)
    assert [d.verb for d in decisions] == [F.Verb.ACT] * 2 + [F.Verb.HOLD] * 3
    ledger = carry_out(ledger, decisions, 40)
    assert [d.verb for d in F.decide(99, hurt, ledger, EVICT)] == [F.Verb.HOLD] * 3
    ledger = ledger.forget_gone(hurt, 100.5)
    assert [d.verb for d in F.decide(100.5, hurt, ledger, EVICT)] == [F.Verb.ACT] * 2 + [
        F.Verb.HOLD
    ]


def test_failed_action_is_retried_later():
    hurt = {"a/p": (fault("mlx5_0"),)}
    ledger = F.Ledger().noticed("a/p", hurt["a/p"], 0).failed("a/p", 31)
    assert F.decide(35, hurt, ledger, EVICT) == []
    assert F.decide(41, hurt, ledger, EVICT)[0].verb == F.Verb.ACT


def test_cleared_fault_clears_the_notice_and_a_new_fault_renotifies():
    ledger = F.Ledger().noticed("a/p", (fault("mlx5_0", FaultClass.DEGRADED),), 0)
    assert [d.verb for d in F.decide(5, {}, ledger, EVICT)] == [F.Verb.CLEAR]
    decisions = F.decide(5, {"a/p": (fault("mlx5_0"),)}, ledger, EVICT)
    assert [d.verb for d in decisions] == [F.Verb.NOTIFY]


@given(
    st.lists(
        st.tuples(
            st.floats(0.5, 20.0),
            st.sets(st.sampled_from(["a/p0", "a/p1", "a/p2", "a/p3"])),
            st.booleans(),
        ),
        max_size=40,
    )
)
def test_decisions_never_exceed_the_rate_or_act_before_grace(rounds):
    """Any sequence of hurt pods and stale views: never more evictions in a minute than allowed,
    never an action before the grace period after the notice, none on a stale view, and a pod
    acted on at most once per notice (a pod of the same name after a clear is a new pod)."""
    now, ledger = 0.0, F.Ledger()
    evictions: list[float] = []
    noticed: dict[str, float] = {}
    acted: set[str] = set()
    for gap, pods, stale in rounds:
        now += gap
        hurt = {p: (fault("mlx5_0"),) for p in pods}
        decisions = F.decide(now, hurt, ledger, EVICT, stale="x" if stale else None)
        if stale:
            assert all(d.verb == F.Verb.HOLD for d in decisions)
        for d in decisions:
            if d.verb == F.Verb.NOTIFY:
                noticed.setdefault(d.pod, now)
            elif d.verb == F.Verb.CLEAR:
                noticed.pop(d.pod, None)
                acted.discard(d.pod)
            elif d.verb == F.Verb.ACT:
                assert now - noticed[d.pod] >= EVICT.grace_s
                assert d.pod not in acted
                acted.add(d.pod)
                evictions.append(now)
        assert sum(1 for t in evictions if now - t < 60.0) <= EVICT.max_evictions_per_minute
        ledger = carry_out(ledger, decisions, now).forget_gone(set(hurt) | set(ledger.pods), now)


def test_no_port_joins_while_a_watched_one_is_down(hgx):
    """With every 400G port down, the storage NIC's slower port becomes the fastest class that
    is up: it must not join the watch (it would hide that every compute HCA is dead)."""
    compute = [("mlx5_0", 1), ("mlx5_1", 1)]
    first = F.watched_ports(hgx, ["mlx5_0", "mlx5_1", "mlx5_bond_0"], compute, {})
    hca = hgx.hca("mlx5_0")
    down = dataclasses.replace(hca.ports[0], state=PortState.DOWN, phys_state=PhysState.DISABLED)
    topo = dataclasses.replace(
        hgx,
        hcas=tuple(dataclasses.replace(h, ports=(down,)) if h is hca else h for h in hgx.hcas),
    )
    later = F.watched_ports(topo, ["mlx5_0", "mlx5_1", "mlx5_bond_0"], [("mlx5_bond_0", 1)], first)
    assert later == first == {"mlx5_0": (1,), "mlx5_1": (1,)}
    # Once every watched port is up again, a new compute port joins.
    again = F.watched_ports(
        hgx, ["mlx5_0", "mlx5_1", "mlx5_bond_0"], [*compute, ("mlx5_bond_0", 1)], later
    )
    assert again == {**first, "mlx5_bond_0": (1,)}


# ----------------------------------------------------------------- the blast-radius breaker


def through_breaker(ledger, decisions, now):
    """As `carry_out`, the breaker's reason kept with the notice (what the actor records)."""
    for d in decisions:
        if d.verb == F.Verb.NOTIFY:
            ledger = ledger.noticed(d.pod, d.faults, now, d.held)
        elif d.verb == F.Verb.ACT:
            ledger = ledger.acted(d.pod, now, d.evict)
    return ledger


STORM = B.Answer(B.BudgetVerdict.REFUSED, "breaker open: a storm", storming=True)
SPENT = B.Answer(B.BudgetVerdict.REFUSED, "budget spent")
GRANTED = B.Answer(B.BudgetVerdict.GRANTED, "token held", 1e9)
UNKNOWN = B.Answer(B.BudgetVerdict.UNKNOWN, "the fault budget could not be read: HTTP 503")


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6),
    st.lists(st.sampled_from([STORM, SPENT, UNKNOWN, GRANTED, None]), min_size=1, max_size=30),
)
def test_nothing_acts_without_a_token_and_every_pod_is_acted_on_once(pods, answers):
    """Whatever the budget answers round after round, a pod is acted on only in a round with a
    token, at most once; a pod held by a storm is told so once; once tokens come, every pod
    still hurt is acted on (nothing forgotten while it was held)."""
    hurt = {f"ns/p{i}": (fault(f"mlx5_{i}"),) for i in range(pods)}
    rules = F.DecisionRules(F.Action.EVICT, grace_s=0.0, max_evictions_per_minute=100)
    ledger, acted, held_notices = F.Ledger(), [], []
    for now, answer in enumerate([*answers, GRANTED, GRANTED]):
        wanted = F.decide(float(now), hurt, ledger, rules)
        decisions = F.gate(wanted, hurt, ledger, answer)
        granted = answer is not None and answer.verdict == B.BudgetVerdict.GRANTED
        for d in decisions:
            if d.verb == F.Verb.ACT:
                assert granted, "an act without a token"
                acted.append(d.pod)
            if d.verb == F.Verb.NOTIFY and d.held:
                held_notices.append(d.pod)
        ledger = through_breaker(ledger, decisions, float(now))
    assert sorted(acted) == sorted(hurt), "each hurt pod acted on exactly once"
    assert len(held_notices) == len(set(held_notices)), "told of the storm once"


def test_a_storm_holds_the_act_and_tells_the_pod_why():
    hurt = {"ns/p": (fault("mlx5_0"),)}
    act = F.Decision(F.Verb.ACT, "ns/p", hurt["ns/p"], "port 1 DOWN")
    hold, notify = F.gate([act], hurt, F.Ledger(), STORM)
    assert (hold.verb, hold.why) == (F.Verb.HOLD, "breaker open: a storm")
    assert (notify.verb, notify.held) == (F.Verb.NOTIFY, "breaker open: a storm")
    (spent,) = F.gate([act], hurt, F.Ledger(), SPENT)  # a spent budget: wait, no notice
    assert (spent.verb, spent.why) == (F.Verb.HOLD, "budget spent")
    (unknown,) = F.gate([act], hurt, F.Ledger(), None)
    assert unknown.verb == F.Verb.HOLD
