"""Repeat offenders (`rdmaplane.core.repeat`): episodes counted within the window, the quarantine
that outlives the faults, the operator's clear, and the Node's annotation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.core import repeat as R

RULES = R.RepeatRules(count=3, window_s=86400.0)
KEY = ("mlx5_3", 1)
HOUR = 3600.0


def faults(times, down_s=60.0, rules=RULES):
    """The history after a port failed at each of `times` (fatal for `down_s`, then clear)."""
    history: dict = {}
    for t in times:
        history = R.reconcile(history, {KEY}, set(), t, rules)
        history = R.reconcile(history, set(), set(), t + down_s, rules)
    return history


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 3 * 86400, allow_nan=False), max_size=8).map(sorted))
def test_quarantined_once_count_faults_began_within_the_window(times):
    """Quarantined as soon as `count` episodes began within one window, and it stays so (the
    faults aging out do not release it: only the operator does)."""
    times = [t for i, t in enumerate(times) if i == 0 or t - times[i - 1] > 120]  # apart
    history = faults(times)
    expected = any(
        sum(1 for u in times if t - RULES.window_s < u <= t) >= RULES.count for t in times
    )
    assert (KEY in R.quarantined(history, RULES)) == expected
    if expected:
        later = R.reconcile(history, set(), set(), times[-1] + 10 * RULES.window_s, RULES)
        assert KEY in R.quarantined(later, RULES)


def test_an_episode_a_hair_inside_the_window_counts():
    """Found by hypothesis: an episode at 1e-38 s is inside the window that ends 86,400 s
    later, though 86400 - 1e-38 rounds to 86400.0."""
    assert KEY in R.quarantined(faults([1e-38, 121.0, 86400.0]), RULES)


def test_two_faults_are_not_three():
    history = faults([0.0, HOUR])
    assert R.quarantined(history, RULES) == {}
    history = faults([0.0, HOUR, 2 * HOUR])
    (why,) = R.quarantined(history, RULES).values()
    assert why == (
        "port 1 had 3 fatal faults (quarantined after 3 within 24 h): out of service until the "
        "Node is annotated rdmaplane.io/fault-clear=mlx5_3/1"
    )


def test_a_fault_seen_again_after_a_restart_is_the_same_episode():
    """A restarted agent reads the history with the episode open; the same fault, raised
    again by the new agent, is not a second one; while it is pending, it does not close."""
    history = R.reconcile({}, {KEY}, set(), 0.0, RULES)
    restarted = R.from_document(R.to_document(history))
    pending = R.reconcile(restarted, set(), {KEY}, 10.0, RULES)
    assert pending[KEY].ongoing
    again = R.reconcile(pending, {KEY}, set(), 15.0, RULES)
    assert len(again[KEY].episodes) == 1


@pytest.mark.parametrize(
    ("value", "left"),
    [
        ("mlx5_3/1", {("mlx5_3", 2), ("mlx5_4", 1)}),
        ("mlx5_3", {("mlx5_4", 1)}),
        ("all", set()),
        ("mlx5_4/1, mlx5_3/2", {("mlx5_3", 1)}),
        ("mlx5_9", {("mlx5_3", 1), ("mlx5_3", 2), ("mlx5_4", 1)}),
    ],
)
def test_the_operators_clear_names_ports_hcas_or_all(value, left):
    port = R.PortHistory(((0.0, 10.0),) * 3, quarantined_at=10.0)
    history = {("mlx5_3", 1): port, ("mlx5_3", 2): port, ("mlx5_4", 1): port}
    assert set(R.clear(history, value)) == left


def test_a_cleared_port_counts_again_from_nothing():
    history = R.clear(faults([0.0, HOUR, 2 * HOUR]), "mlx5_3/1")
    assert history == {}
    assert R.quarantined(faults([3 * HOUR, 4 * HOUR]), RULES) == {}


def test_closed_episodes_older_than_the_window_are_forgotten():
    history = faults([0.0])
    later = R.reconcile(history, set(), set(), RULES.window_s + 100.0, RULES)
    assert later == {}


@given(
    st.lists(
        st.tuples(st.integers(0, 10**9), st.one_of(st.none(), st.integers(0, 10**9))), max_size=4
    ),
    st.one_of(st.none(), st.integers(0, 10**9)),
)
def test_the_node_annotation_round_trips(episodes, at):
    history = {
        KEY: R.PortHistory(
            tuple((float(s), None if u is None else float(u)) for s, u in episodes),
            None if at is None else float(at),
        )
    }
    assert R.from_document(R.to_document(history)) == history


def test_a_history_of_another_version_is_not_read():
    with pytest.raises(ValueError, match="history version"):
        R.from_document({"v": 0})
