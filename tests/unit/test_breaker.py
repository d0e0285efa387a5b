"""The blast-radius breaker's pure core (`rdmaplane.core.breaker`): the budget's pace, the storms
that open it, its closing by itself, and the Lease's document."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.core import breaker as B

RULES = B.BreakerRules(
    max_nodes_per_minute=3, max_faulty_share=0.1, min_faulty_nodes=3, window_s=600.0
)
CALM = [B.ScopeCount(B.CLUSTER, 200)]


def leaf(faulty: int, since: float = 0.0, nodes: int = 25) -> B.ScopeCount:
    return B.ScopeCount("leaf=l1", nodes, (since,) * faulty)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 20), st.floats(0, 30, allow_nan=False)), min_size=1, max_size=60
    )
)
def test_never_more_tokens_within_a_minute_than_the_budget(asks):
    """Nodes asking in any order and pace: within any 60 s, at most max_nodes_per_minute nodes
    are given a token, and a node that holds one is never refused for the spent budget."""
    budget, now, given_at = B.Budget(), 0.0, []
    for node, gap in asks:
        now += gap
        budget, answer, _ = B.take(budget, f"n{node}", now, CALM, RULES)
        if answer.fresh:
            given_at.append(now)
        held = [t for n, t in budget.tokens if n == f"n{node}"]
        assert (answer.verdict == B.BudgetVerdict.GRANTED) == bool(held)
    for t in given_at:
        assert sum(1 for u in given_at if t <= u < t + B.MINUTE_S) <= RULES.max_nodes_per_minute


def test_the_last_token_goes_to_one_node():
    budget = B.Budget(tokens=(("a", 0.0), ("b", 1.0)))
    after_c, c, _ = B.take(budget, "c", 2.0, CALM, RULES)
    after_d, d, _ = B.take(after_c, "d", 2.0, CALM, RULES)
    assert c.verdict == B.BudgetVerdict.GRANTED and c.fresh and c.until == 62.0
    assert d.verdict == B.BudgetVerdict.REFUSED and not d.storming
    assert "budget spent: 3 nodes acted within the last minute (max 3)" in d.why
    _, d_later, _ = B.take(after_d, "d", 60.5, CALM, RULES)  # a's token is older than a minute
    assert d_later.verdict == B.BudgetVerdict.GRANTED


@pytest.mark.parametrize(
    ("faulty", "nodes", "storms"),
    [(2, 10, False), (3, 25, True), (2, 25, False), (3, 40, False), (5, 40, True)],
)
def test_a_storm_is_more_than_the_share_and_at_least_the_minimum(faulty, nodes, storms):
    """min_faulty_nodes 3 and 10 %: two faulty of ten is a node problem, not a storm."""
    assert (B.storm(leaf(faulty, nodes=nodes), 10.0, RULES) is not None) == storms


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 25), st.floats(0, 1200, allow_nan=False))
def test_the_breaker_opens_and_closes_by_itself(faulty, later):
    """A leaf whose ports all die opens the breaker (once: one change), refuses every node
    under it while the faults are younger than the window, and closes by itself afterwards."""
    budget, answer, changes = B.take(B.Budget(), "n1", 0.0, [*CALM, leaf(faulty)], RULES)
    storms = faulty >= 3
    assert answer.storming == storms and (answer.verdict == B.BudgetVerdict.REFUSED) == storms
    assert [c.opened for c in changes] == ([True] if storms else [])
    if storms:
        assert (
            answer.why
            == "breaker open: "
            + f"{faulty} of 25 nodes under leaf=l1 faulty within 600 s (max 10%)"
        )
    again, answer, changes = B.take(budget, "n2", later, [*CALM, leaf(faulty)], RULES)
    still = storms and later < RULES.window_s
    assert answer.storming == still
    assert [c.opened for c in changes] == ([False] if storms and not still else [])
    assert bool(again.open) == still


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 5, allow_nan=False), min_size=25, max_size=25),
    st.lists(
        st.tuples(st.floats(0, 10, allow_nan=False), st.floats(0, 2, allow_nan=False)),
        min_size=1,
        max_size=40,
    ),
)
def test_a_census_counted_before_the_breaker_opened_does_not_close_it(faults, asks):
    """A leaf's nodes fault one after another (their labels appear one by one); agents ask
    in turn, each with a census counted a little before it asks. Once a scope opened, no
    census counted before that closes it: the breaker does not flap at a storm's onset."""
    budget, was_open = B.Budget(), False
    for at, lag in sorted(asks):
        counted = at - lag
        since = tuple(t for t in faults if t <= counted)
        census = [B.ScopeCount("leaf=l1", 25, since, counted)]
        budget, _, changes = B.take(budget, "n1", at, census, RULES)
        assert not (was_open and any(not c.opened for c in changes))
        was_open = bool(budget.open)


def test_a_token_held_does_not_act_through_a_storm():
    budget, first, _ = B.take(B.Budget(), "n1", 0.0, CALM, RULES)
    assert first.verdict == B.BudgetVerdict.GRANTED
    _, second, _ = B.take(budget, "n1", 10.0, [*CALM, leaf(5, since=5.0)], RULES)
    assert second.verdict == B.BudgetVerdict.REFUSED and second.storming


def test_open_for_names_the_first_open_scope():
    budget, _, _ = B.take(B.Budget(), "n1", 0.0, [*CALM, leaf(5)], RULES)
    assert B.open_for(budget, [B.CLUSTER, "leaf=l1"]).scope == "leaf=l1"
    assert B.open_for(budget, [B.CLUSTER, "leaf=l2"]) is None


@given(
    st.lists(st.tuples(st.text(min_size=1, max_size=8), st.integers(0, 10**9)), max_size=5),
    st.lists(st.tuples(st.text(min_size=1, max_size=8), st.integers(0, 10**9)), max_size=3),
)
def test_the_lease_document_round_trips(tokens, opened):
    budget = B.Budget(
        tuple((n, float(t)) for n, t in tokens),
        tuple(B.Opened(s, float(t), f"why {s}") for s, t in opened),
    )
    assert B.from_document(B.to_document(budget)) == budget


def test_a_budget_of_another_version_is_not_read():
    with pytest.raises(ValueError, match="budget version 2, not 1"):
        B.from_document({"v": 2, "tokens": []})
