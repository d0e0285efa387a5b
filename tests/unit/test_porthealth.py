"""The port health pipeline: per-port memory, the rule table, symptoms, and what each consumer
reads of them (HCA health, the reported faults, the fault classes)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.adapters.discovery.samples import read_sample
from rdmaplane.core import faults, kernellog
from rdmaplane.core.model import PhysState, PortObservation, PortState
from rdmaplane.core.pcie import DOWNTRAINED
from rdmaplane.core.porthealth import (
    ERRORS_RISING,
    HCA_GONE,
    LINK_FLAPPING,
    PORT_GONE,
    PORT_RULES,
    QUARANTINED,
    CounterRise,
    FaultClass,
    judge,
    remember,
    rule_table,
)
from rdmaplane.core.usability import PORT_DOWN
from rdmaplane.services.agent.policy.health import (
    HealthState,
    reported_by_hca,
    reported_by_port,
    step,
)
from tests.health_memory import risen_memory

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
    (found,) = judge(
        [KEY], rules, observations={KEY: obs()}, memory={KEY: risen_memory(risen)}
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
    """The defaults, row by row: one row per counter and window (link_downed's two limits are
    one, and so are symbol_error's hourly ones), then the flaps, the quarantine, the kernel's
    events and the PCIe link; the memory keeps the hour the longest rows read."""
    rules = rule_table(
        300.0,
        {"link_downed": 0, "symbol_error": 100, "port_rcv_errors": 100},
        {"link_downed": 0},
        hourly={"symbol_error": 120, "link_error_recovery": 300},
        hourly_fatal={"symbol_error": 120},
        flaps_per_hour=2,
    )
    counter_rows = [
        (c.counter, c.window_s, c.limit, r.unhealthy, r.fault)
        for r in rules.rows
        if isinstance(c := r.check, CounterRise)
    ]
    assert counter_rows == [
        ("link_downed", 300.0, 0, True, FaultClass.FATAL),
        ("port_rcv_errors", 300.0, 100, True, FaultClass.DEGRADED),
        ("symbol_error", 300.0, 100, True, FaultClass.DEGRADED),
        ("link_error_recovery", 3600.0, 300, True, FaultClass.DEGRADED),
        ("symbol_error", 3600.0, 120, True, FaultClass.FATAL),
    ]
    others = [(r.reason, r.unhealthy, r.fault) for r in rules.rows if r.reason != ERRORS_RISING]
    assert others == [(r.reason, r.unhealthy, r.fault) for r in PORT_RULES] + [
        (LINK_FLAPPING, True, FaultClass.FATAL),
        (QUARANTINED, True, None),
        (kernellog.FIRMWARE_FATAL, True, FaultClass.FATAL),
        (kernellog.HEALTH_COMPROMISED, True, FaultClass.FATAL),
        (kernellog.COMMAND_TIMEOUT, True, FaultClass.FATAL),
        (kernellog.PCIE_SLOT_POWER, False, FaultClass.DEGRADED),
        (DOWNTRAINED, False, FaultClass.DEGRADED),
    ]
    assert [r.fault for r in PORT_RULES] == [FaultClass.FATAL] * len(PORT_RULES)
    assert rules.keep_s == 3600.0 and rule_table(300.0, {}, {}).keep_s == 300.0
    assert rules.counters == [
        "link_downed",
        "link_error_recovery",
        "port_rcv_errors",
        "symbol_error",
    ]


@pytest.fixture(scope="module")
def hgx():
    return read_sample("hgx-h100-roce")


def test_a_gone_hca_or_port_is_all_that_is_said(hgx):
    rules = rule_table(300.0, {"symbol_error": 0}, {})
    keys = [("mlx5_99", 1), ("mlx5_0", 7), ("mlx5_0", 1)]
    memory = {k: risen_memory({"symbol_error": 5}, k) for k in keys}
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


# ----------------------------------------------------------------- grey failures (issue 27)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 60), st.integers(0, 10))
def test_a_trickle_under_the_windows_limit_is_judged_per_hour(per_poll, polls_per_5min):
    """symbol_error rising by `per_poll` every 5 minutes never crosses the window's 100; the
    hour's sum is judged against the hourly limit (over 120: fatal, as NVSentinel has it)."""
    rules = rule_table(
        300.0,
        {"symbol_error": 100},
        {},
        hourly={"symbol_error": 120},
        hourly_fatal={"symbol_error": 120},
    )
    memory, total, t = {}, 0, 0.0
    for _ in range(12):
        memory = remember(memory, t, [obs(symbol_error=total)], rules.keep_s)
        t += 300.0
        total += per_poll * (1 + polls_per_5min % 2)
    memory = remember(memory, t, [obs(symbol_error=total)], rules.keep_s)
    risen_hour = memory[KEY].risen("symbol_error", 3600.0)
    (found,) = judge(
        [KEY], rules, observations={KEY: obs(symbol_error=total)}, memory=memory
    ).values()
    fatal = [s for s in found if s.fault == FaultClass.FATAL]
    assert bool(fatal) == (risen_hour > 120)
    if fatal:
        assert fatal[0].text == f"port 1 symbol_error +{risen_hour} within 3600 s (max 120)"


def test_a_port_that_keeps_falling_is_flapping():
    """Down three times within the hour (each seen by a poll) is more than flapsPerHour 2,
    whether link_downed moved or not; the flaps age out of the hour."""
    rules = rule_table(300.0, {}, {}, flaps_per_hour=2)
    memory, t = {}, 0.0
    for state in [UP, DOWN, UP, DOWN, UP, DOWN, UP]:
        memory = remember(memory, t, [obs(state=state)], rules.keep_s)
        t += 60.0
    (found,) = judge([KEY], rules, observations={KEY: obs()}, memory=memory).values()
    assert [(s.reason, s.text, s.fault) for s in found] == [
        (LINK_FLAPPING, "port 1 went down 3 times within 3600 s (max 2)", FaultClass.FATAL)
    ]
    later = remember(memory, t + 3600.0, [obs()], rules.keep_s)
    assert judge([KEY], rules, observations={KEY: obs()}, memory=later)[KEY] == ()


def test_a_port_not_in_service_is_never_down():
    """An uncabled or disabled spare no pool offers and that never came up: no symptom; a port
    that was up once, or a pool offers, is down when it is."""
    rules = rule_table(300.0, {}, {})
    down = {KEY: obs(state=DOWN)}
    assert judge([KEY], rules, observations=down, memory={}, in_service=set())[KEY] == ()
    (symptom,) = judge([KEY], rules, observations=down, memory={}, in_service={KEY})[KEY]
    assert symptom.reason == PORT_DOWN
    spare, _ = step(HealthState(), 0.0, [obs(state=DOWN)], rules, offered=set())
    assert spare.symptoms[KEY] == ()
    up, _ = step(spare, 1.0, [obs()], rules, offered=set())
    fell, _ = step(up, 2.0, [obs(state=DOWN)], rules, offered=set())
    assert [s.reason for s in fell.symptoms[KEY]] == [PORT_DOWN]


def test_the_kernels_word_reaches_the_port_of_its_hca(hgx):
    """An mlx5 line naming the HCA's PCI function: fatal, quoted, on each of its ports; it
    counts for the health window; other HCAs hear nothing of it."""
    rules = rule_table(300.0, {}, {})
    pci = hgx.hca("mlx5_0").pci.address
    said = "device's health compromised - reached miss count"
    line = f"mlx5_core {pci}: poll_health:812:(pid 0): {said}"
    event = kernellog.recognise(line, at=100.0)
    keys = [("mlx5_0", 1), ("mlx5_1", 1)]
    found = judge(
        keys,
        rules,
        observations={k: obs(k) for k in keys},
        memory={},
        topology=hgx,
        now=150.0,
        kernel=[event],
    )
    assert [(s.reason, s.text, s.fault) for s in found[("mlx5_0", 1)]] == [
        (kernellog.HEALTH_COMPROMISED, f'kernel: "{line}"', FaultClass.FATAL)
    ]
    assert found[("mlx5_1", 1)] == ()
    aged = judge(
        keys,
        rules,
        observations={k: obs(k) for k in keys},
        memory={},
        topology=hgx,
        now=401.0,
        kernel=[event],
    )
    assert aged[("mlx5_0", 1)] == ()


def test_a_downtrained_nic_is_degraded_and_a_quarantined_port_unhealthy():
    degraded = read_sample("degraded")
    rules = rule_table(300.0, {}, {})
    key = ("mlx5_0", 1)
    found = judge(
        [key],
        rules,
        observations={key: obs(key)},
        memory={},
        topology=degraded,
        quarantined={key: "why"},
    )
    assert [(s.reason, s.text, s.unhealthy, s.fault) for s in found[key]] == [
        (QUARANTINED, "why", True, None),
        (DOWNTRAINED, "PCIe link 16 GT/s x8, capable of 16 GT/s x16", False, FaultClass.DEGRADED),
    ]
