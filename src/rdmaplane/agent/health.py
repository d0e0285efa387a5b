"""The health monitor's state machine: port observations in, HCA health and transitions out.

Pure (no I/O, time passed in). An HCA is unhealthy while any of its ports is not ACTIVE/LinkUp,
or while a watched error counter rose by more than its threshold within the sliding window.
It recovers by itself once the port is up and the increments have aged out of the window.
A counter that goes down was reset (driver reload, `perfquery -R`): it becomes the new baseline.
A counter that could not be read keeps its last good value as the baseline, so a burst that
spans the gap (100, unreadable, 500) still counts +400.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rdmaplane.model import PortObservation
from rdmaplane.usability import PORT_DOWN


@dataclass(frozen=True, slots=True)
class Rules:
    window_s: float
    thresholds: Mapping[str, int]


ERRORS_RISING = "ErrorCountersRising"


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # PORT_DOWN or ERRORS_RISING
    text: str  # human-readable, e.g. "port 1 DOWN (DISABLED)"

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class HcaHealth:
    hca: str
    problems: tuple[Problem, ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.problems


@dataclass(frozen=True, slots=True)
class Transition:
    """An HCA whose health flipped; `before` None = newly seen, `after` None = gone."""

    hca: str
    before: HcaHealth | None
    after: HcaHealth | None


@dataclass(frozen=True, slots=True)
class _PortMemory:
    last: Mapping[str, int]
    increments: tuple[tuple[float, str, int], ...]  # (time, counter, delta > 0) in the window


@dataclass(frozen=True, slots=True)
class HealthState:
    ports: Mapping[tuple[str, int], _PortMemory] = field(default_factory=dict)
    hcas: Mapping[str, HcaHealth] = field(default_factory=dict)


def risen(state: HealthState) -> dict[tuple[str, int], dict[str, int]]:
    """Per port, each counter's increments within the window (what the fault classes judge)."""
    out: dict[tuple[str, int], dict[str, int]] = {}
    for key, memory in state.ports.items():
        sums: dict[str, int] = {}
        for _, counter, delta in memory.increments:
            sums[counter] = sums.get(counter, 0) + delta
        out[key] = sums
    return out


def step(
    state: HealthState, now: float, observations: Iterable[PortObservation], rules: Rules
) -> tuple[HealthState, list[Transition]]:
    """Fold one poll into the state; the transitions are the HCAs whose healthiness changed."""
    ports: dict[tuple[str, int], _PortMemory] = {}
    problems: dict[str, list[Problem]] = {}
    for obs in sorted(observations, key=lambda o: (o.hca, o.port)):
        memory = _remember(state.ports.get((obs.hca, obs.port)), obs, now, rules.window_s)
        ports[(obs.hca, obs.port)] = memory
        problems.setdefault(obs.hca, []).extend(_port_problems(obs, memory, rules))
    hcas = {name: HcaHealth(name, tuple(found)) for name, found in problems.items()}
    transitions = [
        Transition(name, state.hcas.get(name), hcas.get(name))
        for name in sorted(set(state.hcas) | set(hcas))
        if _flipped(state.hcas.get(name), hcas.get(name))
    ]
    return HealthState(ports, hcas), transitions


def _flipped(before: HcaHealth | None, after: HcaHealth | None) -> bool:
    if before is None or after is None:
        # Appearing healthy is the normal start, not news; appearing broken or vanishing is.
        return (after is not None and not after.healthy) or (before is not None and after is None)
    return before.healthy != after.healthy


def _remember(
    memory: _PortMemory | None, obs: PortObservation, now: float, window_s: float
) -> _PortMemory:
    kept = tuple(i for i in (memory.increments if memory else ()) if i[0] > now - window_s)
    new = []
    for name, value in sorted(obs.counters.items()):
        before = memory.last.get(name) if memory else None
        if before is not None and value > before:
            new.append((now, name, value - before))
    last = {**memory.last, **obs.counters} if memory else dict(obs.counters)
    return _PortMemory(last=last, increments=kept + tuple(new))


def _port_problems(obs: PortObservation, memory: _PortMemory, rules: Rules) -> list[Problem]:
    found = []
    if not obs.is_up:
        text = f"port {obs.port} {obs.state.name} ({obs.phys_state.name})"
        found.append(Problem(PORT_DOWN, text))
    for name, threshold in sorted(rules.thresholds.items()):
        risen = sum(delta for _, counter, delta in memory.increments if counter == name)
        if risen > threshold:
            text = f"port {obs.port} {name} +{risen} within {rules.window_s:g} s (max {threshold})"
            found.append(Problem(ERRORS_RISING, text))
    return found
