"""Port health, judged once: observations → per-port counter deltas over a window → the rule
table → symptoms → the consumers. Pure (no I/O, time passed in).

Each poll folds every port's observation into its memory (`remember`): the counters' last values
and their increments within the longest window a rule looks at. A counter that goes down was
reset (driver reload, `perfquery -R`): it becomes the new baseline. A counter that could not be
read keeps its last good value as the baseline, so a burst that spans the gap (100, unreadable,
500) still counts +400. A port not observed in a poll is forgotten.

`judge` applies the rule table to ports. Each row reads one input of a port (its state, its
place in the topology, a counter's rise within the row's window) and, when it fires, gives a
`Symptom`: the row's reason, a message, and what it means to each consumer:

- `unhealthy`: the port cannot be handed out. The agent's HCA health (the device plugin's
  Unhealthy, `RDMAReady`, the NRT's allocatable, `rdmaplane_hca_healthy`) and the DRA driver's
  `NoSchedule` taint read it, the last two for every port whatever its link class;
- `fault`: fatal or degraded for the fault classes (`rdmaplane.core.faults`: their hysteresis, the
  pod notices and evictions, the DRA driver's fault taints), which read only the compute ports.

Evidence beyond a poll's reading comes in as inputs of `PortView`, each read by its own rows:
a counter's rise within each row's window (the health window, and an hour for the rates), link
falls per hour, the HCA's PCIe link (`rdmaplane.core.pcie`), mlx5's kernel log events
(`rdmaplane.core.kernellog`), whether the port is in service at all (a port no pool offers and that
was never up is not: an uncabled or disabled spare is never a fault), and a quarantine for
ports that keep failing (`rdmaplane.core.repeat`). The consumers stay as they are.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from rdmaplane.core import kernellog
from rdmaplane.core.gid import gid_problem
from rdmaplane.core.kernellog import KernelEvent
from rdmaplane.core.model import (
    Hca,
    LinkLayer,
    NodeTopology,
    PhysState,
    Port,
    PortObservation,
    PortState,
    link_up,
)
from rdmaplane.core.pcie import DOWNTRAINED, downtrained
from rdmaplane.core.usability import PORT_DOWN

PortKey = tuple[str, int]  # (hca, port)


class FaultClass(StrEnum):
    """How bad a symptom is for the fault classes (docs/faults.md)."""

    FATAL = "fatal"
    DEGRADED = "degraded"


# The rows' reasons (PORT_DOWN is the device plugin's word too: `rdmaplane.core.usability`).
ERRORS_RISING = "ErrorCountersRising"
HCA_GONE = "HcaGone"
PORT_GONE = "PortGone"
NO_NETDEV = "NoNetdev"
GID_INDEX_LOST = "GidIndexLost"
LINK_FLAPPING = "LinkFlapping"
QUARANTINED = "Quarantined"
GONE = (HCA_GONE, PORT_GONE)
HOUR_S = 3600.0  # the window of the rates (`health.hourlyThresholds`) and of link flaps


# ----------------------------------------------------------------- per-port memory


@dataclass(frozen=True, slots=True)
class Rises:
    """One counter's increments within the memory, oldest first: when each came and the running
    total after it (`base`: the total before the first kept), so a window's rise is a lookup,
    however many polls an hour holds."""

    times: tuple[float, ...] = ()
    totals: tuple[int, ...] = ()
    base: int = 0

    def since(self, start: float) -> int:
        """The increments after `start`."""
        i = bisect.bisect_right(self.times, start)
        if i == len(self.times):
            return 0
        return self.totals[-1] - (self.totals[i - 1] if i else self.base)

    def add(self, at: float, delta: int, keep_after: float) -> Rises:
        """With `delta` (0: none) at `at`, and without increments at or before `keep_after`."""
        drop = bisect.bisect_right(self.times, keep_after)
        base = self.totals[drop - 1] if drop else self.base
        times, totals = self.times[drop:], self.totals[drop:]
        if delta > 0:
            times += (at,)
            totals += ((totals[-1] if totals else base) + delta,)
        return Rises(times, totals, base)


@dataclass(frozen=True, slots=True)
class PortMemory:
    """One port as of `at` (the poll that last observed it): its counters' last good values,
    their increments, and the polls that found it down after it had been up (`falls`), all
    within the longest window a row reads; `up`: whether that poll found it up."""

    at: float
    last: Mapping[str, int]
    rises: Mapping[str, Rises] = field(default_factory=dict)
    falls: tuple[float, ...] = ()
    up: bool | None = None

    def risen(self, counter: str, window_s: float) -> int:
        """How much `counter` rose within the `window_s` seconds up to `at`."""
        rises = self.rises.get(counter)
        return rises.since(self.at - window_s) if rises is not None else 0

    def fell(self, window_s: float) -> int:
        """How often the port was found fallen within the `window_s` seconds up to `at`."""
        return sum(1 for t in self.falls if t > self.at - window_s)


def remember(
    memory: Mapping[PortKey, PortMemory],
    now: float,
    observations: Iterable[PortObservation],
    keep_s: float,
) -> dict[PortKey, PortMemory]:
    """Fold one poll into every observed port's memory, keeping what is younger than `keep_s`;
    ports not observed are forgotten."""
    return {
        (o.hca, o.port): _fold(memory.get((o.hca, o.port)), o, now, keep_s) for o in observations
    }


def _fold(memory: PortMemory | None, obs: PortObservation, now: float, keep_s: float) -> PortMemory:
    last = memory.last if memory else {}
    before = memory.rises if memory else {}
    keep_after = now - keep_s
    rises = {}
    for name in sorted({*before, *obs.counters}):
        value = obs.counters.get(name)
        delta = value - last[name] if value is not None and name in last else 0
        kept = before.get(name, Rises()).add(now, delta, keep_after)
        if kept.times:
            rises[name] = kept
    falls = tuple(t for t in (memory.falls if memory else ()) if t > keep_after)
    if memory is not None and memory.up and not obs.is_up:
        falls += (now,)
    return PortMemory(now, {**last, **obs.counters}, rises, falls, obs.is_up)


# ----------------------------------------------------------------- what the rules read


@dataclass(frozen=True, slots=True)
class PortView:
    """What the rules read of one port in one poll: its observation and memory (None: not
    observed), the node's topology and unified GID index, the time, whether the port is in
    service, its HCA's kernel log events and its quarantine (None or empty: not given, so the
    rows that read them do not apply)."""

    key: PortKey
    observation: PortObservation | None = None
    memory: PortMemory | None = None
    topology: NodeTopology | None = None
    gid_index: int | None = None
    now: float | None = None
    in_service: bool | None = None  # None: not known, so in service
    kernel: tuple[KernelEvent, ...] = ()  # the HCA's recognised kernel log lines
    quarantined: str | None = None  # why the port stays out of service, if it does

    @property
    def number(self) -> int:
        return self.key[1]

    @property
    def hca(self) -> Hca | None:
        return self.topology.hca(self.key[0]) if self.topology is not None else None

    @property
    def port(self) -> Port | None:
        hca = self.hca
        return hca.port(self.number) if hca is not None else None

    @property
    def link(self) -> tuple[PortState, PhysState] | None:
        """The port's state: this poll's reading, else the topology's; None: neither."""
        if self.observation is not None:
            return self.observation.state, self.observation.phys_state
        port = self.port
        return (port.state, port.phys_state) if port is not None else None

    @property
    def roce_port(self) -> Port | None:
        port = self.port
        return port if port is not None and port.link_layer == LinkLayer.ETHERNET else None


def hca_gone(v: PortView) -> str | None:
    if v.topology is None or v.hca is not None:
        return None
    return f"{v.key[0]} is gone"


def port_gone(v: PortView) -> str | None:
    if v.hca is None or v.port is not None:
        return None
    return f"{v.key[0]} port {v.number} is gone"


def port_not_up(v: PortView) -> str | None:
    """Down, unless the port is not in service (no pool offers it and it was never up)."""
    link = v.link
    if link is None or link_up(*link) or v.in_service is False:
        return None
    return f"port {v.number} {link[0].name} ({link[1].name})"


def no_netdev(v: PortView) -> str | None:
    port = v.roce_port
    return f"port {v.number} has no netdev" if port is not None and port.netdev is None else None


def gid_index_lost(v: PortView) -> str | None:
    """The node's unified GID index, which pods got in NCCL_IB_GID_INDEX, no longer holds a
    usable RoCE address on the port."""
    port = v.roce_port
    if port is None or port.netdev is None or v.gid_index is None:
        return None
    problem = gid_problem(next((g for g in port.gids if g.index == v.gid_index), None))
    return None if problem is None else f"port {v.number} GID index {v.gid_index} {problem}"


def pcie_downtrained(v: PortView) -> str | None:
    hca = v.hca
    return downtrained(hca.pci.link) if hca is not None and hca.pci is not None else None


def quarantined(v: PortView) -> str | None:
    return v.quarantined


@dataclass(frozen=True, slots=True)
class CounterRise:
    """A counter that rose by more than `limit` within `window_s`."""

    counter: str
    limit: int
    window_s: float

    @property
    def reads(self) -> tuple[str, ...]:
        return (self.counter,)

    def __call__(self, v: PortView) -> str | None:
        risen = v.memory.risen(self.counter, self.window_s) if v.memory is not None else 0
        if risen <= self.limit:
            return None
        within = f"within {self.window_s:g} s (max {self.limit})"
        return f"port {v.number} {self.counter} +{risen} {within}"


@dataclass(frozen=True, slots=True)
class LinkFlaps:
    """More than `limit` falls within an hour: `link_downed` counts every one the hardware saw,
    the polls those they caught (a port whose counter does not move flaps all the same)."""

    limit: int

    @property
    def reads(self) -> tuple[str, ...]:
        return ("link_downed",)

    def __call__(self, v: PortView) -> str | None:
        if v.memory is None:
            return None
        flaps = max(v.memory.risen("link_downed", HOUR_S), v.memory.fell(HOUR_S))
        if flaps <= self.limit:
            return None
        return f"port {v.number} went down {flaps} times within {HOUR_S:g} s (max {self.limit})"


@dataclass(frozen=True, slots=True)
class KernelSaid:
    """The HCA's driver logged a line of `reason` (`rdmaplane.core.kernellog`) within `window_s`:
    the newest is quoted."""

    reason: str
    window_s: float

    def __call__(self, v: PortView) -> str | None:
        if v.now is None:
            return None
        said = [e for e in v.kernel if e.reason == self.reason and v.now - e.at < self.window_s]
        if not said:
            return None
        newest = max(said, key=lambda e: e.at)
        more = f" (and {len(said) - 1} more within {self.window_s:g} s)" if len(said) > 1 else ""
        return newest.quoted + more


# ----------------------------------------------------------------- the rule table


@dataclass(frozen=True, slots=True)
class HealthRule:
    """One row: `check` gives the symptom's message when it fires."""

    reason: str
    check: Callable[[PortView], str | None]
    unhealthy: bool
    fault: FaultClass | None


@dataclass(frozen=True, slots=True)
class Symptom:
    reason: str
    text: str  # for people, e.g. "port 1 DOWN (DISABLED)"
    unhealthy: bool = True
    fault: FaultClass | None = None

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class RuleTable:
    rows: tuple[HealthRule, ...]
    keep_s: float  # how long a port's memory keeps increments: the longest window a row reads

    @property
    def counters(self) -> list[str]:
        """The counters the rows read (what a poll must read)."""
        return sorted({c for r in self.rows for c in getattr(r.check, "reads", ())})


FATAL, DEGRADED = FaultClass.FATAL, FaultClass.DEGRADED
# The rows every table starts with. A RoCE port without its netdev, or without the GID its pods
# use, is not called unhealthy here: the device plugin and the DRA driver find no NCCL plan for
# it themselves (`rdmaplane.core.usability`).
PORT_RULES = (
    HealthRule(HCA_GONE, hca_gone, unhealthy=True, fault=FATAL),
    HealthRule(PORT_GONE, port_gone, unhealthy=True, fault=FATAL),
    HealthRule(PORT_DOWN, port_not_up, unhealthy=True, fault=FATAL),
    HealthRule(NO_NETDEV, no_netdev, unhealthy=False, fault=FATAL),
    HealthRule(GID_INDEX_LOST, gid_index_lost, unhealthy=False, fault=FATAL),
)


# The kernel's word (`rdmaplane.core.kernellog`): the firmware stopped or stopped answering is
# fatal; too little slot power only slows the card.
KERNEL_CLASSES = {
    kernellog.FIRMWARE_FATAL: (True, FATAL),
    kernellog.HEALTH_COMPROMISED: (True, FATAL),
    kernellog.COMMAND_TIMEOUT: (True, FATAL),
    kernellog.PCIE_SLOT_POWER: (False, DEGRADED),
}


def rule_table(
    window_s: float,
    thresholds: Mapping[str, int],
    fatal_thresholds: Mapping[str, int],
    *,
    hourly: Mapping[str, int] | None = None,
    hourly_fatal: Mapping[str, int] | None = None,
    flaps_per_hour: int | None = None,
) -> RuleTable:
    """`PORT_RULES`; one row per counter limit, by counter name, for the health window and
    then for the hour (`hourly`, `hourly_fatal`: the rates); link flaps per hour; a
    quarantine; the kernel's events; a downtrained PCIe link.

    Per window, a rise over `thresholds[c]` is unhealthy and degraded, over
    `fatal_thresholds[c]` fatal (a counter with a fatal limit is never degraded); the same limit
    in both is one row, unhealthy and fatal. More falls in an hour than `flaps_per_hour` is
    unhealthy and fatal. A quarantined port is unhealthy, no fault (its pods are not evicted
    for it). Kernel events count for the health window."""
    rows = list(PORT_RULES)
    rows += _counter_rows(window_s, thresholds, fatal_thresholds)
    rows += _counter_rows(HOUR_S, hourly or {}, hourly_fatal or {})
    if flaps_per_hour is not None:
        rows.append(HealthRule(LINK_FLAPPING, LinkFlaps(flaps_per_hour), True, FATAL))
    rows.append(HealthRule(QUARANTINED, quarantined, unhealthy=True, fault=None))
    for reason, (unhealthy, cls) in KERNEL_CLASSES.items():
        rows.append(HealthRule(reason, KernelSaid(reason, window_s), unhealthy, cls))
    rows.append(HealthRule(DOWNTRAINED, pcie_downtrained, unhealthy=False, fault=DEGRADED))
    longest = HOUR_S if hourly or hourly_fatal or flaps_per_hour is not None else 0.0
    return RuleTable(tuple(rows), max(window_s, longest))


def _counter_rows(
    window_s: float, thresholds: Mapping[str, int], fatal_thresholds: Mapping[str, int]
) -> list[HealthRule]:
    rows = []
    for name in sorted({*thresholds, *fatal_thresholds}):
        limit, fatal = thresholds.get(name), fatal_thresholds.get(name)
        if limit is not None:
            cls = FATAL if limit == fatal else DEGRADED if fatal is None else None
            rows.append(HealthRule(ERRORS_RISING, CounterRise(name, limit, window_s), True, cls))
        if fatal is not None and fatal != limit:
            rows.append(HealthRule(ERRORS_RISING, CounterRise(name, fatal, window_s), False, FATAL))
    return rows


def judge(
    keys: Iterable[PortKey],
    rules: RuleTable,
    *,
    observations: Mapping[PortKey, PortObservation],
    memory: Mapping[PortKey, PortMemory],
    topology: NodeTopology | None = None,
    gid_index: int | None = None,
    now: float | None = None,
    in_service: Collection[PortKey] | None = None,
    kernel: Sequence[KernelEvent] = (),
    quarantined: Mapping[PortKey, str] | None = None,
) -> dict[PortKey, tuple[Symptom, ...]]:
    """Each port's symptoms, in the table's order (none: an empty tuple). A port that is gone
    has no other symptom. `in_service` None: every port is."""
    by_pci: dict[str, list[KernelEvent]] = {}
    for event in kernel:
        by_pci.setdefault(event.pci, []).append(event)
    out = {}
    for key in keys:
        hca = topology.hca(key[0]) if topology is not None else None
        view = PortView(
            key,
            observations.get(key),
            memory.get(key),
            topology,
            gid_index,
            now,
            None if in_service is None else key in in_service,
            tuple(by_pci.get(hca.pci.address, ())) if hca is not None and hca.pci else (),
            (quarantined or {}).get(key),
        )
        found = tuple(
            Symptom(rule.reason, text, rule.unhealthy, rule.fault)
            for rule in rules.rows
            if (text := rule.check(view)) is not None
        )
        out[key] = tuple(s for s in found if s.reason in GONE) or found
    return out
