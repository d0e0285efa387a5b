"""The agent's health monitor: port observations in, HCA health, transitions and the faults to
report out. Pure (no I/O, time passed in).

Each poll folds the observations into the ports' memory and judges every observed port by the
rule table (`rdmaplane.core.porthealth`). An HCA is unhealthy while any of its ports has an
unhealthy symptom (not ACTIVE/LinkUp, an error counter over its limit within the window, a
fatal kernel log event, a quarantine); it recovers by itself once the port is up and the
increments have aged out of the window. A port is in service once it has been up, or while a
pool offers it: an uncabled or disabled spare is never down in the rules' eyes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rdmaplane.core.kernellog import KernelEvent
from rdmaplane.core.model import NodeTopology, PortObservation
from rdmaplane.core.porthealth import PortKey, PortMemory, RuleTable, Symptom, judge, remember
from rdmaplane.core.usability import PORT_DOWN


@dataclass(frozen=True, slots=True)
class HcaHealth:
    hca: str
    problems: tuple[Symptom, ...] = ()  # its ports' unhealthy symptoms

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
class HealthState:
    ports: Mapping[PortKey, PortMemory] = field(default_factory=dict)
    symptoms: Mapping[PortKey, tuple[Symptom, ...]] = field(default_factory=dict)  # observed
    hcas: Mapping[str, HcaHealth] = field(default_factory=dict)
    been_up: frozenset[PortKey] = frozenset()  # ports seen up since the agent started
    in_service: frozenset[PortKey] | None = None  # None: every port (no pools given)


def step(
    state: HealthState,
    now: float,
    observations: Iterable[PortObservation],
    rules: RuleTable,
    *,
    topology: NodeTopology | None = None,
    offered: Collection[PortKey] | None = None,
    kernel: Sequence[KernelEvent] = (),
    quarantined: Mapping[PortKey, str] | None = None,
) -> tuple[HealthState, list[Transition]]:
    """Fold one poll into the state; the transitions are the HCAs whose healthiness changed.
    `offered`: the ports the pools offer (None: not known, every port is in service)."""
    seen = {(o.hca, o.port): o for o in sorted(observations, key=lambda o: (o.hca, o.port))}
    ports = remember(state.ports, now, seen.values(), rules.keep_s)
    been_up = state.been_up | {k for k, o in seen.items() if o.is_up}
    in_service = None if offered is None else been_up | frozenset(offered)
    symptoms = judge(
        seen,
        rules,
        observations=seen,
        memory=ports,
        topology=topology,
        now=now,
        in_service=in_service,
        kernel=kernel,
        quarantined=quarantined,
    )
    problems: dict[str, list[Symptom]] = {}
    for (hca, _), found in symptoms.items():
        problems.setdefault(hca, []).extend(s for s in found if s.unhealthy)
    hcas = {name: HcaHealth(name, tuple(found)) for name, found in problems.items()}
    transitions = [
        Transition(name, state.hcas.get(name), hcas.get(name))
        for name in sorted(set(state.hcas) | set(hcas))
        if _flipped(state.hcas.get(name), hcas.get(name))
    ]
    return HealthState(ports, symptoms, hcas, been_up, in_service), transitions


def _flipped(before: HcaHealth | None, after: HcaHealth | None) -> bool:
    if before is None or after is None:
        # Appearing healthy is the normal start, not news; appearing broken or vanishing is.
        return (after is not None and not after.healthy) or (before is not None and after is None)
    return before.healthy != after.healthy


def reported_by_port(state: HealthState) -> dict[PortKey, str]:
    """The ports the device plugin and the DRA driver must refuse for what only the agent sees
    (rising error counters), with why: their unhealthy symptoms but the port state, which both
    judge themselves (`rdmaplane.core.usability`)."""
    out = {}
    for key, found in state.symptoms.items():
        said = [s.text for s in found if s.unhealthy and s.reason != PORT_DOWN]
        if said:
            out[key] = "; ".join(said)
    return out


def reported_by_hca(state: HealthState) -> dict[str, str]:
    """`reported_by_port` per HCA (the device plugin's devices are HCAs)."""
    out: dict[str, list[str]] = {}
    for (hca, _), why in sorted(reported_by_port(state).items()):
        out.setdefault(hca, []).append(why)
    return {hca: "; ".join(said) for hca, said in out.items()}
