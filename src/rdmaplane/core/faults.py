"""RDMA fault classes and what to do about them: pure policy, no I/O, time passed in.

Per compute HCA port, each poll's symptoms (`rdmaplane.core.porthealth`, the one rule table) are
`fatal` (port not ACTIVE/LinkUp, HCA or netdev gone, the node's unified GID index no longer
holding an address, a fatal counter such as `link_downed` rising) or `degraded` (error counters
over the health thresholds). A hysteresis turns them into *faults*: fatal only after
`fatal_after_s` of persistence, cleared only after `clear_after_s` without symptoms, so a
flapping port raises one fault, never a storm. `pods_hurt` names the pods holding a faulty HCA
(a shared slot grants its whole pool, so every pod of the pool is hurt), and `decide` says what
to do with each pod and when: notice first, act (condition + eviction) only after the grace
period, within the rate limit, and nothing at all while the view is stale.

The agent feeds this module and carries out its decisions (`rdmaplane.services.agent.faults`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from rdmaplane.core import names
from rdmaplane.core.breaker import Answer, BudgetVerdict
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.porthealth import FaultClass, PortKey, Symptom

CONDITION = names.FAULT_CONDITION
TAINT_KEY = names.UNHEALTHY_TAINT


class Action(StrEnum):
    """`fault.action`: how far the agent goes for a fatal fault."""

    OBSERVE = "observe"  # log and count only: nothing is written to pods
    NOTIFY = "notify"  # notice, then the RDMAFault condition; the workload restarts itself
    EVICT = "evict"  # notice, then condition + eviction through the Eviction API


# ----------------------------------------------------------------- symptoms


@dataclass(frozen=True, slots=True)
class Symptoms:
    fatal: tuple[str, ...] = ()
    degraded: tuple[str, ...] = ()


def watched_ports(
    topo: NodeTopology,
    managed: Iterable[str],
    compute: Iterable[PortKey],
    before: Mapping[str, tuple[int, ...]],
) -> dict[str, tuple[int, ...]]:
    """The ports to judge, per managed HCA: its compute ports now, plus those it had before.
    A port that goes down drops out of the compute set, and a vanished HCA out of the topology:
    both must stay watched to be seen as faulty. While a watched port is down or gone, no port
    joins: the compute class is chosen among ports that are up, so with every fast port down a
    slower storage port would pass for compute (and hide that every compute HCA is dead)."""
    impaired = any(
        (hca := topo.hca(name)) is None or (port := hca.port(n)) is None or not port.is_up
        for name, numbers in before.items()
        for n in numbers
    )
    now: dict[str, set[int]] = {}
    for hca_name, number in compute:
        if not impaired or number in before.get(hca_name, ()):
            now.setdefault(hca_name, set()).add(number)
    out = {}
    for name in sorted(set(managed)):
        ports = now.get(name, set()) | set(before.get(name, ()))
        if not ports and topo.hca(name) is None and not impaired:
            ports = {1}  # gone before we ever saw a compute port of it
        if ports:
            out[name] = tuple(sorted(ports))
    return out


def classify(found: Mapping[PortKey, Sequence[Symptom]]) -> dict[PortKey, Symptoms]:
    """The fault classes' view of each port's symptoms: the fatal and the degraded ones' texts
    (the others are not faults)."""
    return {
        key: Symptoms(
            tuple(s.text for s in symptoms if s.fault == FaultClass.FATAL),
            tuple(s.text for s in symptoms if s.fault == FaultClass.DEGRADED),
        )
        for key, symptoms in found.items()
    }


# ----------------------------------------------------------------- hysteresis


@dataclass(frozen=True, slots=True)
class Fault:
    """A raised fault. `since` is on the caller's clock: when the symptoms began."""

    hca: str
    port: int
    cls: FaultClass
    reason: str
    since: float

    @property
    def key(self) -> PortKey:
        return (self.hca, self.port)


@dataclass(frozen=True, slots=True)
class FaultRules:
    fatal_after_s: float
    clear_after_s: float


@dataclass(frozen=True, slots=True)
class _FaultMemory:
    raised: Fault | None = None
    fatal_since: float | None = None  # start of the current run of fatal symptoms
    calm_since: float | None = None  # start of the current run without fatal symptoms
    clean_since: float | None = None  # start of the current run without any symptom


@dataclass(frozen=True, slots=True)
class FaultState:
    ports: Mapping[PortKey, _FaultMemory] = field(default_factory=dict)

    @property
    def faults(self) -> dict[PortKey, Fault]:
        return {k: m.raised for k, m in sorted(self.ports.items()) if m.raised is not None}

    @property
    def fatal(self) -> set[PortKey]:
        """The ports with a raised fatal fault."""
        return {k for k, f in self.faults.items() if f.cls == FaultClass.FATAL}

    @property
    def pending(self) -> set[PortKey]:
        """The ports with fatal symptoms not yet raised (persisting less than `fatalAfter`)."""
        return {
            k
            for k, m in self.ports.items()
            if m.fatal_since is not None and (m.raised is None or m.raised.cls != FaultClass.FATAL)
        }

    def due(self, rules: FaultRules) -> float | None:
        """When the earliest pending fatal symptoms will have persisted `fatalAfter` (a poll
        then raises the fault without waiting for the next interval); None when none is."""
        times = [
            m.fatal_since + rules.fatal_after_s
            for k, m in self.ports.items()
            if k in self.pending and m.fatal_since is not None
        ]
        return min(times, default=None)


@dataclass(frozen=True, slots=True)
class FaultChange:
    """A fault raised (`before` None), changed class, or cleared (`after` None)."""

    key: PortKey
    before: Fault | None
    after: Fault | None


def step(
    state: FaultState, now: float, found: Mapping[PortKey, Symptoms], rules: FaultRules
) -> tuple[FaultState, list[FaultChange]]:
    """Fold one poll's symptoms into the state. Ports no longer watched are forgotten (their
    HCA is no longer offered to pods), with a change if they had a fault."""
    ports: dict[PortKey, _FaultMemory] = {}
    changes = []
    for key in sorted(set(state.ports) | set(found)):
        before = state.ports.get(key, _FaultMemory())
        if key not in found:
            after = _FaultMemory()
        else:
            after = _advance(before, key, now, found[key], rules)
            ports[key] = after
        if before.raised != after.raised and _news(before.raised, after.raised):
            changes.append(FaultChange(key, before.raised, after.raised))
    return FaultState(ports), changes


def _news(before: Fault | None, after: Fault | None) -> bool:
    """A new reason within the same class is not news (it would re-notify every pod)."""
    if before is None or after is None:
        return True
    return before.cls != after.cls


def _advance(
    memory: _FaultMemory, key: PortKey, now: float, found: Symptoms, rules: FaultRules
) -> _FaultMemory:
    """Fatal after `fatal_after_s` of fatal symptoms; a fatal fault clears (or falls back to
    degraded) after `clear_after_s` without fatal symptoms; degraded is raised at once (its
    counters already span a window) and clears after `clear_after_s` without any symptom."""
    fatal_since = _run(memory.fatal_since, now, bool(found.fatal))
    calm_since = _run(memory.calm_since, now, not found.fatal)
    clean_since = _run(memory.clean_since, now, not found.fatal and not found.degraded)
    raised = memory.raised
    cls = raised.cls if raised is not None else None
    if fatal_since is not None and now - fatal_since >= rules.fatal_after_s:
        if cls != FaultClass.FATAL:
            raised = Fault(*key, FaultClass.FATAL, "; ".join(found.fatal), fatal_since)
    elif cls == FaultClass.FATAL:
        if calm_since is not None and now - calm_since >= rules.clear_after_s:
            # Degraded symptoms seen within clear_after_s keep a degraded fault: it clears by
            # its own rule, never straight from fatal while errors were still counting.
            clean = clean_since is not None and now - clean_since >= rules.clear_after_s
            why = "; ".join(found.degraded) or "error counters over the warn threshold lately"
            raised = None if clean else Fault(*key, FaultClass.DEGRADED, why, now)
    elif cls is None and found.degraded:
        raised = Fault(*key, FaultClass.DEGRADED, "; ".join(found.degraded), now)
    elif (
        cls == FaultClass.DEGRADED
        and clean_since is not None
        and now - clean_since >= rules.clear_after_s
    ):
        raised = None
    return _FaultMemory(raised, fatal_since, calm_since, clean_since)


def _run(since: float | None, now: float, holds: bool) -> float | None:
    """The start of a run of polls where `holds` is true; None while it is false."""
    if not holds:
        return None
    return since if since is not None else now


# ----------------------------------------------------------------- node-wide


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


def node_taint(
    faults: Mapping[PortKey, Fault],
    hcas: Iterable[str],
    effect: str | None,
    degraded_effect: str | None = None,
) -> Taint | None:
    """`rdmaplane.io/rdma-unhealthy=<n>-hcas` when every compute HCA has a fatal port (with
    `effect`), or, if `degraded_effect` is set, when every one has some fault. None otherwise
    (or when there are no compute HCAs: nothing RDMA to be unhealthy about)."""
    names = sorted(set(hcas))
    if not names:
        return None
    worst = {n: _worst(f.cls for f in faults.values() if f.hca == n) for n in names}
    if effect is not None and all(c == FaultClass.FATAL for c in worst.values()):
        return Taint(TAINT_KEY, f"{len(names)}-hcas", effect)
    if degraded_effect is not None and all(c is not None for c in worst.values()):
        return Taint(TAINT_KEY, f"{len(names)}-hcas", degraded_effect)
    return None


def _worst(classes: Iterable[FaultClass]) -> FaultClass | None:
    found = set(classes)
    if FaultClass.FATAL in found:
        return FaultClass.FATAL
    return FaultClass.DEGRADED if found else None


# ----------------------------------------------------------------- whom it hurts


def pods_hurt(
    faults: Mapping[PortKey, Fault],
    device_hcas: Mapping[tuple[str, str], Sequence[str]],
    pods: Mapping[str, Mapping[str, Iterable[str]]],
) -> dict[str, tuple[Fault, ...]]:
    """Per pod (`namespace/name`), the faults of the HCAs it holds, fatal first.

    `device_hcas[(resource, device_id)]` are the HCAs a device grants: one for an exclusive
    device, the whole pool for a shared slot (so every pod of a pool is hurt by any of its
    HCAs); `pods[pod][resource]` the device IDs the pod holds (PodResources)."""
    by_hca: dict[str, list[Fault]] = {}
    for fault in faults.values():
        by_hca.setdefault(fault.hca, []).append(fault)
    out = {}
    for pod, held in sorted(pods.items()):
        names = {
            h
            for resource, ids in held.items()
            for i in ids
            for h in device_hcas.get((resource, i), ())
        }
        found = [f for n in sorted(names) for f in by_hca.get(n, ())]
        if found:
            out[pod] = tuple(sorted(found, key=lambda f: (f.cls != FaultClass.FATAL, f.key)))
    return out


# ----------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class DecisionRules:
    action: Action
    grace_s: float
    max_evictions_per_minute: int
    retry_s: float = 10.0  # a failed action is tried again after this long


class Verb(StrEnum):
    NOTIFY = "notify"  # annotate the pod and post an Event (the fault notice)
    CLEAR = "clear"  # the pod's faults are gone: remove the notice
    ACT = "act"  # the RDMAFault condition, then the eviction when the action is `evict`
    OBSERVE = "observe"  # `observe`: what would have happened, logged and counted only
    HOLD = "hold"  # something should happen but must not now (stale view, rate limit, grace)


@dataclass(frozen=True, slots=True)
class Decision:
    verb: Verb
    pod: str
    faults: tuple[Fault, ...] = ()
    why: str = ""
    evict: bool = False
    held: str = ""  # a notice's: why the breaker holds the action (`gate`)


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What was done to a pod: the notice it holds (the faults' identities, and the breaker's
    reason when it said one) and when the first notice of a fatal fault went out (the grace
    period runs from there)."""

    notice: tuple[tuple[str, int, str], ...] = ()
    fatal_noticed_at: float | None = None
    acted_at: float | None = None
    failed_at: float | None = None
    held: str = ""


@dataclass(frozen=True, slots=True)
class Ledger:
    pods: Mapping[str, PodRecord] = field(default_factory=dict)
    evictions: tuple[float, ...] = ()  # when evictions were made (the last minute's matter)

    def noticed(self, pod: str, faults: Sequence[Fault], now: float, held: str = "") -> Ledger:
        record = self.pods.get(pod, PodRecord())
        fatal = any(f.cls == FaultClass.FATAL for f in faults)
        at = record.fatal_noticed_at if record.fatal_noticed_at is not None else now
        record = replace(
            record, notice=notice_key(faults), fatal_noticed_at=at if fatal else None, held=held
        )
        return replace(self, pods={**self.pods, pod: record})

    def cleared(self, pod: str) -> Ledger:
        return replace(self, pods={k: v for k, v in self.pods.items() if k != pod})

    def acted(self, pod: str, now: float, evicted: bool) -> Ledger:
        record = replace(self.pods.get(pod, PodRecord()), acted_at=now, failed_at=None)
        evictions = (*self.evictions, now) if evicted else self.evictions
        return replace(self, pods={**self.pods, pod: record}, evictions=evictions)

    def failed(self, pod: str, now: float) -> Ledger:
        record = replace(self.pods.get(pod, PodRecord()), failed_at=now)
        return replace(self, pods={**self.pods, pod: record})

    def forget_gone(self, present: Iterable[str], now: float) -> Ledger:
        """Drop pods that no longer hold devices, and evictions older than a minute."""
        keep = set(present)
        return Ledger(
            {k: v for k, v in self.pods.items() if k in keep},
            tuple(t for t in self.evictions if now - t < 60.0),
        )


def notice_key(faults: Iterable[Fault]) -> tuple[tuple[str, int, str], ...]:
    return tuple(sorted((f.hca, f.port, f.cls.value) for f in faults))


def decide(
    now: float,
    hurt: Mapping[str, tuple[Fault, ...]],
    ledger: Ledger,
    rules: DecisionRules,
    stale: str | None = None,
) -> list[Decision]:
    """What to do with each pod now. `stale` says why the view cannot be trusted (API server
    unreachable, PodResources too old): then every pod that needs something is held."""
    out: list[Decision] = []
    evictions = sum(1 for t in ledger.evictions if now - t < 60.0)
    for pod in sorted(set(hurt) | set(ledger.pods)):
        faults = hurt.get(pod, ())
        record = ledger.pods.get(pod, PodRecord())
        wanted = _wanted(now, pod, faults, record, rules)
        if wanted is None:
            continue
        if stale is not None:
            out.append(Decision(Verb.HOLD, pod, faults, f"stale view: {stale}"))
        elif wanted.verb == Verb.ACT and wanted.evict:
            if evictions >= rules.max_evictions_per_minute:
                why = f"rate limit: {rules.max_evictions_per_minute} evictions per minute reached"
                out.append(Decision(Verb.HOLD, pod, faults, why))
            else:
                evictions += 1
                out.append(wanted)
        else:
            out.append(wanted)
    return out


def _wanted(
    now: float, pod: str, faults: tuple[Fault, ...], record: PodRecord, rules: DecisionRules
) -> Decision | None:
    if not faults:
        return Decision(Verb.CLEAR, pod, why="faults cleared") if record.notice else None
    if notice_key(faults) != record.notice:
        verb = Verb.OBSERVE if rules.action == Action.OBSERVE else Verb.NOTIFY
        return Decision(verb, pod, faults, faults[0].reason)
    fatal = tuple(f for f in faults if f.cls == FaultClass.FATAL)
    if not fatal or rules.action == Action.OBSERVE or record.acted_at is not None:
        return None
    if record.failed_at is not None and now - record.failed_at < rules.retry_s:
        return None
    noticed = record.fatal_noticed_at if record.fatal_noticed_at is not None else now
    if now - noticed < rules.grace_s:
        return None
    return Decision(Verb.ACT, pod, fatal, fatal[0].reason, evict=rules.action == Action.EVICT)


def gate(
    decisions: Sequence[Decision],
    hurt: Mapping[str, tuple[Fault, ...]],
    ledger: Ledger,
    answer: Answer | None,
) -> list[Decision]:
    """The decisions the blast-radius breaker (`rdmaplane.core.breaker`) lets through, `answer`
    being its word for this node (None: nothing was asked, nothing needs asking). An act
    without a token waits (`HOLD`, with the breaker's reason); a notice while a storm holds
    the node says so (`held`), and a pod noticed before the storm is told once."""
    storming = answer is not None and answer.storming
    granted = answer is not None and answer.verdict == BudgetVerdict.GRANTED
    out = []
    for d in decisions:
        if d.verb == Verb.NOTIFY and storming:
            out.append(replace(d, held=answer.why if answer else ""))
        elif d.verb == Verb.ACT and not granted:
            why = answer.why if answer is not None else "the fault budget was not asked"
            out.append(Decision(Verb.HOLD, d.pod, d.faults, why))
            if storming and not ledger.pods.get(d.pod, PodRecord()).held:
                faults = hurt.get(d.pod, d.faults)
                out.append(Decision(Verb.NOTIFY, d.pod, faults, faults[0].reason, held=why))
        else:
            out.append(d)
    return out
