"""The blast-radius breaker: one budget for every node agent's fault actions. Pure: the budget
as read from the API server, a census of the fleet and the time in; the answer, the new budget
and what opened or closed out. `rdmaplane.services.agent.breaker` reads and writes it (a Lease,
updated
with optimistic concurrency: of two agents that read the same version, one write wins and the
other reads again).

An agent asks before it acts (an eviction, a NoExecute taint): a *token* lets its node act
for a minute, and at most `max_nodes_per_minute` nodes hold one at once, cluster-wide. No token
is given while a *scope* is storming: more than `max_faulty_share` of its nodes (and at least
`min_faulty_nodes`) faulty, each counted for `window_s` after its fault began. The scopes are
the cluster and the agent's fabric domain (its switch at the configured tier). A dead leaf, a
bad firmware push or a bad threshold rolled out everywhere is a storm; evicting every pod it
hurts would find the replacements no healthy room. Once the faults are older than the window
the storm is over: the breaker closes, and the agents still holding pods take tokens again at
the budget's pace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

MINUTE_S = 60.0
CLUSTER = "cluster"  # the scope of the whole fleet; a domain's scope is `<label>=<switch>`


@dataclass(frozen=True, slots=True)
class BreakerRules:
    max_nodes_per_minute: int
    max_faulty_share: float
    min_faulty_nodes: int
    window_s: float


@dataclass(frozen=True, slots=True)
class ScopeCount:
    """One scope as an agent counted it: its nodes, when each faulty one's fault began, and
    when it was counted (wall-clock seconds; None: as the agent asks)."""

    scope: str
    nodes: int
    faulty_since: tuple[float, ...] = ()
    counted_at: float | None = None

    def faulty(self, now: float, window_s: float) -> int:
        return sum(1 for t in self.faulty_since if now - t < window_s)


@dataclass(frozen=True, slots=True)
class Opened:
    scope: str
    since: float
    reason: str


@dataclass(frozen=True, slots=True)
class Budget:
    """What the Lease holds: the tokens given within the last minute (node, when) and the
    scopes found storming."""

    tokens: tuple[tuple[str, float], ...] = ()
    open: tuple[Opened, ...] = ()


class BudgetVerdict(StrEnum):
    GRANTED = "granted"
    REFUSED = "refused"  # the budget is spent, or a scope storms
    UNKNOWN = "unknown"  # the budget could not be read or written: act on nothing


@dataclass(frozen=True, slots=True)
class Answer:
    verdict: BudgetVerdict
    why: str = ""
    until: float | None = None  # a token's end
    storming: bool = False  # refused because a scope storms (not for the spent budget)
    fresh: bool = False  # a token given now: it counts only once the budget is written


@dataclass(frozen=True, slots=True)
class Change:
    """A scope that opened (`opened`) or closed in this answer, to say once to the cluster."""

    scope: str
    opened: bool
    reason: str


def storm(count: ScopeCount, now: float, rules: BreakerRules) -> str | None:
    """Why the scope storms now, or None."""
    faulty = count.faulty(now, rules.window_s)
    if faulty < rules.min_faulty_nodes or faulty <= rules.max_faulty_share * count.nodes:
        return None
    limit = f"max {rules.max_faulty_share:.0%}"
    return (
        f"{faulty} of {count.nodes} nodes {where(count.scope)} faulty within "
        f"{rules.window_s:g} s ({limit})"
    )


def where(scope: str) -> str:
    return "in the cluster" if scope == CLUSTER else f"under {scope}"


def take(
    budget: Budget, node: str, now: float, census: Sequence[ScopeCount], rules: BreakerRules
) -> tuple[Budget, Answer, list[Change]]:
    """Ask for `node`'s token. The scopes in `census` are judged again (their open state in
    the budget follows; a census counted before a scope opened cannot close it: at a storm's
    onset the agents' counts differ by the labels published in between, and the breaker
    would flap); a node still holding a token keeps it; otherwise one is given if no scope of
    the census storms and fewer than `max_nodes_per_minute` tokens are out."""
    tokens = tuple((n, t) for n, t in budget.tokens if now - t < MINUTE_S)
    opened = {o.scope: o for o in budget.open}
    changes = []
    for count in census:
        why = storm(count, now, rules)
        if why is not None and count.scope not in opened:
            opened[count.scope] = Opened(count.scope, now, why)
            changes.append(Change(count.scope, True, why))
        elif why is not None:
            opened[count.scope] = replace(opened[count.scope], reason=why)
        elif count.scope in opened and opened[count.scope].since <= _counted(count, now):
            del opened[count.scope]
            changes.append(Change(count.scope, False, f"storm over {where(count.scope)}"))
    after = Budget(tokens, tuple(opened[s] for s in sorted(opened)))
    mine = [t for n, t in tokens if n == node]
    storming = [opened[c.scope].reason for c in census if c.scope in opened]
    if storming:
        return (
            after,
            Answer(BudgetVerdict.REFUSED, f"breaker open: {storming[0]}", storming=True),
            changes,
        )
    if mine:
        return after, Answer(BudgetVerdict.GRANTED, "token held", max(mine) + MINUTE_S), changes
    if len(tokens) >= rules.max_nodes_per_minute:
        why = f"budget spent: {len(tokens)} nodes acted within the last minute"
        return (
            after,
            Answer(BudgetVerdict.REFUSED, f"{why} (max {rules.max_nodes_per_minute})"),
            changes,
        )
    granted = replace(after, tokens=(*tokens, (node, now)))
    return (
        granted,
        Answer(BudgetVerdict.GRANTED, "token given", now + MINUTE_S, fresh=True),
        changes,
    )


def _counted(count: ScopeCount, now: float) -> float:
    return count.counted_at if count.counted_at is not None else now


def open_for(budget: Budget, scopes: Sequence[str]) -> Opened | None:
    """The first of `scopes` the budget has open (what a notice says), or None."""
    opened = {o.scope: o for o in budget.open}
    return next((opened[s] for s in scopes if s in opened), None)


# ----------------------------------------------------------------- the Lease's annotation


def to_document(budget: Budget) -> dict[str, Any]:
    return {
        "v": 1,
        "tokens": [{"node": n, "at": round(t, 3)} for n, t in budget.tokens],
        "open": [
            {"scope": o.scope, "since": round(o.since, 3), "reason": o.reason} for o in budget.open
        ],
    }


def from_document(doc: Mapping[str, Any]) -> Budget:
    """The budget a Lease holds; raises ValueError for one this version cannot read (a reader
    must not act on a budget it could not read)."""
    if doc.get("v") != 1:
        raise ValueError(f"budget version {doc.get('v')!r}, not 1")
    tokens = tuple((str(t["node"]), float(t["at"])) for t in doc.get("tokens") or ())
    opened = tuple(
        Opened(str(o["scope"]), float(o["since"]), str(o["reason"])) for o in doc.get("open") or ()
    )
    return Budget(tokens, opened)
