"""The port health pipeline: per-port memory, the rule table, symptoms, and what each consumer
reads of them (HCA health, the reported faults, the fault classes)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane import faults
from rdmaplane.agent.health import HealthState, reported_by_hca, reported_by_port, step
from rdmaplane.discovery.samples import read_sample
from rdmaplane.model import PhysState, PortObservation, PortState
from rdmaplane.porthealth import (
    ERRORS_RISING,
    HCA_GONE,
    PORT_GONE,
    PORT_RULES,
    FaultClass,
    PortMemory,
    judge,
    remember,
    rule_table,
)
from rdmaplane.usability import PORT_DOWN

UP = (PortState.ACTIVE, PhysState.LINK_UP)
DOWN = (PortState.DOWN, PhysState.DISABLED)
COUNTERS = ("link_downed", "symbol_error", "port_rcv_errors")
KEY = ("mlx5_0", 1)


def obs(key=KEY, state=UP, **counters: int) -> PortObservation:
    return PortObservation(key[0], key[1], *state, counters)


# ----------------------------------------------------------------- memory


polls = st.lists(
    st.tuples(
        st.floats(min_value=0.1, max_value=50),  # time step
        st.fixed_dictionaries(
            {c: st.one_of(st.none(), st.integers(-2, 6)) for c in COUNTERS}
        ),  # per counter: unreadable (None), reset to 0 (< 0) or risen by that much
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(polls, st.floats(min_value=1, max_value=200))
def test_memory_counts_what_the_readings_rose_by_within_any_window(script, keep_s):
    """Against the rule restated over the whole history: within a window up to `keep_s`, each
    counter rose by the sum of the rises between consecutive readable polls (a drop is a reset,
    an unreadable poll is skipped)."""
    memory, now, values, history = {}, 0.0, dict.fromkeys(COUNTERS, 0), []
    for gap, changes in script:
        now += gap
        read = {}
        for name, change in changes.items():
            if change is not None:
                values[name] = 0 if change < 0 else values[name] + change
                read[name] = values[name]
        history.append((now, read))
        memory = remember(memory, now, [obs(**read)], keep_s)
        for name, window in itertools.product(COUNTERS, (keep_s, keep_s / 3)):
            readings = [(t, c[name]) for t, c in history if name in c]
            expected = sum(
                after - before
                for (_, before), (t, after) in itertools.pairwise(readings)
                if t > now - window and after > before
            )
            assert memory[KEY].risen(name, window) == expected


def test_a_port_not_observed_is_forgotten():
    memory = remember({}, 0.0, [obs(symbol_error=1), obs(("mlx5_1", 1))], 60.0)
    assert set(remember(memory, 5.0, [obs(symbol_error=9)], 60.0)) == {KEY}


# ----------------------------------------------------------------- the rule table

limits = st.dictionaries(st.sampled_from(COUNTERS), st.integers(0, 5), max_size=3)


@settings(max_examples=300, deadline=None)
@given(limits, limits, st.fixed_dictionaries({c: st.integers(0, 8) for c in COUNTERS}))
def test_counter_rows_say_what_the_limits_say(thresholds, fatal, risen):
    """Over `thresholds[c]`: unhealthy (and degraded unless c has a fatal limit); over `fatal[c]`:
    fatal. Every symptom in the one wording, none twice."""
    rules = rule_table(300.0, thresholds, fatal)
    increments = tuple((0.0, c, n) for c, n in risen.items() if n)
    (found,) = judge(
        [KEY], rules, observations={KEY: obs()}, memory={KEY: PortMemory(0.0, {}, increments)}
    ).values()
    assert all(s.reason == ERRORS_RISING for s in found)
    assert len({s.text for s in found}) == len(found)

    def said(limits):
        return {
            f"port 1 {c} +{risen[c]} within 300 s (max {n})"
            for c, n in limits.items()
            if risen[c] > n
        }

    assert {s.text for s in found if s.unhealthy} == said(thresholds)
    assert {s.text for s in found if s.fault == FaultClass.FATAL} == said(fatal)
    degraded = {c: n for c, n in thresholds.items() if c not in fatal}
    assert {s.text for s in found if s.fault == FaultClass.DEGRADED} == said(degraded)
    assert rules.counters == sorted({*thresholds, *fatal})


def test_the_default_table():
    """The defaults, row by row: one row per counter (link_downed's two limits are one)."""
    rules = rule_table(
        300.0,
        {"link_downed": 0, "symbol_error": 100, "port_rcv_errors": 100},
        {"link_downed": 0},
    )
    counter_rows = [
        (r.check.counter, r.check.limit, r.unhealthy, r.fault)
        for r in rules.rows[len(PORT_RULES) :]
    ]
    assert counter_rows == [
        ("link_downed", 0, True, FaultClass.FATAL),
        ("port_rcv_errors", 100, True, FaultClass.DEGRADED),
        ("symbol_error", 100, True, FaultClass.DEGRADED),
    ]
    assert [r.fault for r in PORT_RULES] == [FaultClass.FATAL] * len(PORT_RULES)


@pytest.fixture(scope="module")
def hgx():
    return read_sample("hgx-h100-roce")


def test_a_gone_hca_or_port_is_all_that_is_said(hgx):
    rules = rule_table(300.0, {"symbol_error": 0}, {})
    keys = [("mlx5_99", 1), ("mlx5_0", 7), ("mlx5_0", 1)]
    memory = {k: PortMemory(0.0, {}, ((0.0, "symbol_error", 5),)) for k in keys}
    found = judge(keys, rules, observations={}, memory=memory, topology=hgx, gid_index=3)
    assert [(s.reason, s.text) for s in found[("mlx5_99", 1)]] == [(HCA_GONE, "mlx5_99 is gone")]
    assert [s.reason for s in found[("mlx5_0", 7)]] == [PORT_GONE]
    # Not observed this poll: the topology's state stands in.
    assert [s.text for s in found[("mlx5_0", 1)]] == ["port 1 symbol_error +5 within 300 s (max 0)"]


def test_without_a_topology_only_what_was_observed_is_judged():
    rules = rule_table(300.0, {}, {})
    found = judge([KEY], rules, observations={KEY: obs(state=DOWN)}, memory={})
    assert [(s.reason, s.text, s.unhealthy, s.fault) for s in found[KEY]] == [
        (PORT_DOWN, "port 1 DOWN (DISABLED)", True, FaultClass.FATAL)
    ]


# ----------------------------------------------------------------- the consumers

ports = [("mlx5_0", 1), ("mlx5_0", 2), ("mlx5_1", 1)]
poll = st.fixed_dictionaries(
    {
        key: st.tuples(st.sampled_from([UP, UP, DOWN]), st.integers(0, 3), st.integers(0, 1))
        for key in ports
    }
)


@settings(max_examples=150, deadline=None)
@given(st.lists(poll, min_size=1, max_size=12))
def test_the_consumers_read_one_judgement(script):
    """HCA health, the reported faults and the fault classes all follow from the same
    symptoms: an HCA is healthy iff none of its ports has an unhealthy symptom; the device
    plugin's fault for an HCA is its ports' reported ones; the fault classes' fatal and degraded
    texts are those symptoms' texts."""
    rules = rule_table(60.0, {"symbol_error": 2, "link_downed": 0}, {"link_downed": 0})
    state, totals = HealthState(), dict.fromkeys(ports, (0, 0))
    for now, reading in enumerate(script):
        observations = []
        for key, (link, d_sym, d_ld) in reading.items():
            sym, ld = totals[key]
            totals[key] = (sym + d_sym, ld + d_ld)
            observations.append(obs(key, link, symbol_error=sym + d_sym, link_downed=ld + d_ld))
        state, _ = step(state, 10.0 * now, observations, rules)
        by_port = reported_by_port(state)
        for hca in ("mlx5_0", "mlx5_1"):
            own = [state.symptoms[k] for k in ports if k[0] == hca]
            assert state.hcas[hca].healthy is not any(s.unhealthy for found in own for s in found)
            said = [by_port[k] for k in ports if k[0] == hca and k in by_port]
            assert reported_by_hca(state).get(hca) == ("; ".join(said) if said else None)
        for key, found in state.symptoms.items():
            assert PORT_DOWN not in by_port.get(key, "")
            classes = faults.classify({key: found})[key]
            assert classes.fatal == tuple(s.text for s in found if s.fault == FaultClass.FATAL)
            assert set(classes.degraded) <= {s.text for s in found if s.unhealthy}


def test_reported_faults_leave_out_the_port_state():
    rules = rule_table(60.0, {"symbol_error": 0}, {})
    state, _ = step(HealthState(), 0.0, [obs(state=DOWN, symbol_error=0)], rules)
    state, _ = step(state, 1.0, [obs(state=DOWN, symbol_error=4)], rules)
    assert [s.reason for s in state.hcas["mlx5_0"].problems] == [PORT_DOWN, ERRORS_RISING]
    assert reported_by_port(state) == {KEY: "port 1 symbol_error +4 within 60 s (max 0)"}
    assert reported_by_hca(state) == {"mlx5_0": "port 1 symbol_error +4 within 60 s (max 0)"}


def test_a_port_the_topology_says_is_down_is_fatal_when_not_observed(hgx):
    hca = hgx.hca("mlx5_0")
    down = dataclasses.replace(hca.ports[0], state=PortState.DOWN, phys_state=PhysState.DISABLED)
    topo = dataclasses.replace(
        hgx, hcas=tuple(dataclasses.replace(h, ports=(down,)) if h is hca else h for h in hgx.hcas)
    )
    found = judge([KEY], rule_table(60.0, {}, {}), observations={}, memory={}, topology=topo)
    assert faults.classify(found)[KEY].fatal == ("port 1 DOWN (DISABLED)",)
