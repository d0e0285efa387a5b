"""The health state machine: port states, counter increments in a sliding window, transitions."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.core.model import PhysState, PortObservation, PortState
from rdmaplane.core.porthealth import ERRORS_RISING, RuleTable, rule_table
from rdmaplane.core.usability import PORT_DOWN
from rdmaplane.services.agent.policy.health import HealthState, step

WINDOW_S = 60.0
THRESHOLDS = {"symbol_error": 10, "link_downed": 0}
RULES = rule_table(WINDOW_S, THRESHOLDS, {})
UP = (PortState.ACTIVE, PhysState.LINK_UP)
DOWN = (PortState.DOWN, PhysState.DISABLED)


def obs(hca: str = "mlx5_0", state: tuple[PortState, PhysState] = UP, **counters: int):
    return PortObservation(hca, 1, state[0], state[1], counters)


def run(*polls: tuple[float, list[PortObservation]], rules: RuleTable = RULES):
    state, all_transitions = HealthState(), []
    for now, observations in polls:
        state, transitions = step(state, now, observations, rules)
        all_transitions.append(transitions)
    return state, all_transitions


def test_healthy_start_is_no_transition():
    state, transitions = run((0, [obs(), obs("mlx5_1")]))
    assert transitions == [[]]
    assert all(h.healthy for h in state.hcas.values())
    assert sorted(state.hcas) == ["mlx5_0", "mlx5_1"]


def test_port_down_and_back():
    state, transitions = run((0, [obs()]), (5, [obs(state=DOWN)]), (10, [obs()]))
    down, up = transitions[1], transitions[2]
    assert [(t.hca, t.before.healthy, t.after.healthy) for t in down] == [("mlx5_0", True, False)]
    assert down[0].after.problems[0].reason == PORT_DOWN
    assert str(down[0].after.problems[0]) == "port 1 DOWN (DISABLED)"
    assert [(t.before.healthy, t.after.healthy) for t in up] == [(False, True)]
    assert state.hcas["mlx5_0"].healthy


def test_starting_unhealthy_is_a_transition():
    _, transitions = run((0, [obs(state=DOWN)]))
    assert [(t.hca, t.before, t.after.healthy) for t in transitions[0]] == [("mlx5_0", None, False)]


def test_errors_over_threshold_within_window_then_age_out():
    state, transitions = run(
        (0, [obs(symbol_error=100)]),
        (10, [obs(symbol_error=105)]),  # +5: under 10
        (20, [obs(symbol_error=111)]),  # +11 in the window: over
        (75, [obs(symbol_error=111)]),  # the +5 aged out, the +6 left is under 10
    )
    assert transitions[1] == []
    assert [t.after.healthy for t in transitions[2]] == [False]
    problem = transitions[2][0].after.problems[0]
    assert problem.reason == ERRORS_RISING
    assert "symbol_error +11 within 60 s (max 10)" in str(problem)
    assert [t.after.healthy for t in transitions[3]] == [True]
    assert state.hcas["mlx5_0"].healthy


def test_single_link_downed_is_a_flap():
    _, transitions = run((0, [obs(link_downed=3)]), (5, [obs(link_downed=4)]))
    assert [t.after.healthy for t in transitions[1]] == [False]


def test_counter_reset_is_a_new_baseline():
    _, transitions = run(
        (0, [obs(symbol_error=5000)]), (5, [obs(symbol_error=0)]), (10, [obs(symbol_error=3)])
    )
    assert transitions[1:] == [[], []]


def test_an_unreadable_counter_keeps_its_baseline():
    """100, then a failed read, then 500: the burst across the gap counts +400."""
    _, transitions = run((0, [obs(symbol_error=100)]), (5, [obs()]), (10, [obs(symbol_error=500)]))
    assert transitions[1] == []
    assert [str(t.after.problems[0]) for t in transitions[2]] == [
        "port 1 symbol_error +400 within 60 s (max 10)"
    ]


def test_unwatched_counters_do_not_matter():
    _, transitions = run((0, [obs(port_rcv_errors=0)]), (5, [obs(port_rcv_errors=10**6)]))
    assert transitions[1] == []


def test_vanished_hca_is_reported_and_forgotten():
    state, transitions = run((0, [obs(), obs("mlx5_1")]), (5, [obs()]))
    assert [(t.hca, t.after) for t in transitions[1]] == [("mlx5_1", None)]
    assert list(state.hcas) == ["mlx5_0"]


def test_one_bad_port_makes_the_hca_unhealthy():
    p1 = PortObservation("mlx5_0", 1, *UP)
    p2 = PortObservation("mlx5_0", 2, *DOWN)
    state, _ = run((0, [p1, p2]))
    assert [str(p) for p in state.hcas["mlx5_0"].problems] == ["port 2 DOWN (DISABLED)"]


# ---------------------------------------------------------------- property: brute force


def brute_force_unhealthy(history, window_s: float, thresholds: dict[str, int]) -> bool:
    """Restate the rule from the whole history: down now, or a watched counter rose by more
    than its threshold within the window (increases only; a drop resets the baseline; a poll
    where it could not be read is skipped, the reads around it are compared)."""
    now, last_state, _ = history[-1]
    if last_state != UP:
        return True
    for name, threshold in thresholds.items():
        readable = [(t, c[name]) for t, _, c in history if name in c]
        risen = 0
        for (_, before), (t, after) in itertools.pairwise(readable):
            if t > now - window_s and after > before:
                risen += after - before
        if risen > threshold:
            return True
    return False


polls = st.lists(
    st.tuples(
        st.floats(min_value=0.1, max_value=40),  # time step
        st.sampled_from([UP, UP, UP, DOWN]),
        st.integers(min_value=-3, max_value=8),  # symbol_error change (negative = reset to 0)
        st.integers(min_value=0, max_value=1),  # link_downed change
        st.sampled_from([True, True, True, False]),  # symbol_error readable this poll
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(polls)
def test_matches_brute_force(script):
    state, now, sym, ld = HealthState(), 0.0, 0, 0
    history = []
    healthy_before = None
    for dt, port_state, d_sym, d_ld, readable in script:
        now += dt
        sym = 0 if d_sym < 0 else sym + d_sym
        ld += d_ld
        counters = {"symbol_error": sym, "link_downed": ld} if readable else {"link_downed": ld}
        history.append((now, port_state, counters))
        state, transitions = step(state, now, [obs(state=port_state, **counters)], RULES)
        expected_unhealthy = brute_force_unhealthy(history, WINDOW_S, THRESHOLDS)
        assert state.hcas["mlx5_0"].healthy is not expected_unhealthy
        flipped = healthy_before is not None and healthy_before == expected_unhealthy
        first_bad = healthy_before is None and expected_unhealthy
        assert bool(transitions) == (flipped or first_bad)
        healthy_before = not expected_unhealthy
