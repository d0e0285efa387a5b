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
- `fault`: fatal or degraded for the fault classes (`rdmaplane.faults`: their hysteresis, the
  pod notices and evictions, the DRA driver's fault taints), which read only the compute ports.

A new kind of evidence (an error rate over an hour, link flaps, a downtrained PCIe link, kernel
log events) is a new input of `PortView` and new rows; the consumers stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from rdmaplane.gid import gid_problem
from rdmaplane.model import (
    Hca,
    LinkLayer,
    NodeTopology,
    PhysState,
    Port,
    PortObservation,
    PortState,
)
from rdmaplane.usability import PORT_DOWN

PortKey = tuple[str, int]  # (hca, port)


class FaultClass(StrEnum):
    """How bad a symptom is for the fault classes (docs/faults.md)."""

    FATAL = "fatal"
    DEGRADED = "degraded"


# The rows' reasons (PORT_DOWN is the device plugin's word too: `rdmaplane.usability`).
ERRORS_RISING = "ErrorCountersRising"
HCA_GONE = "HcaGone"
PORT_GONE = "PortGone"
NO_NETDEV = "NoNetdev"
GID_INDEX_LOST = "GidIndexLost"
GONE = (HCA_GONE, PORT_GONE)


# ----------------------------------------------------------------- per-port memory


@dataclass(frozen=True, slots=True)
class PortMemory:
    """One port's counters: their last good values, and the increments (time, counter, delta
    > 0) within the window, as of `at` (the poll that last observed the port)."""

    at: float
    last: Mapping[str, int]
    increments: tuple[tuple[float, str, int], ...] = ()

    def risen(self, counter: str, window_s: float) -> int:
        """How much `counter` rose within the `window_s` seconds up to `at`."""
        start = self.at - window_s
        return sum(d for t, name, d in self.increments if name == counter and t > start)


def remember(
    memory: Mapping[PortKey, PortMemory],
    now: float,
    observations: Iterable[PortObservation],
    keep_s: float,
) -> dict[PortKey, PortMemory]:
    """Fold one poll into every observed port's memory, keeping increments for `keep_s`; ports
    not observed are forgotten."""
    return {
        (o.hca, o.port): _fold(memory.get((o.hca, o.port)), o, now, keep_s) for o in observations
    }


def _fold(memory: PortMemory | None, obs: PortObservation, now: float, keep_s: float) -> PortMemory:
    last = memory.last if memory else {}
    kept = tuple(i for i in (memory.increments if memory else ()) if i[0] > now - keep_s)
    new = tuple(
        (now, name, value - last[name])
        for name, value in sorted(obs.counters.items())
        if name in last and value > last[name]
    )
    return PortMemory(now, {**last, **obs.counters}, kept + new)


# ----------------------------------------------------------------- what the rules read


@dataclass(frozen=True, slots=True)
class PortView:
    """What the rules read of one port in one poll: its observation and memory (None: not
    observed), and the node's topology and unified GID index (None: not given, so the rows that
    read them do not apply)."""

    key: PortKey
    observation: PortObservation | None = None
    memory: PortMemory | None = None
    topology: NodeTopology | None = None
    gid_index: int | None = None

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
    link = v.link
    if link is None or link == (PortState.ACTIVE, PhysState.LINK_UP):
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


@dataclass(frozen=True, slots=True)
class CounterRise:
    """A counter that rose by more than `limit` within `window_s`."""

    counter: str
    limit: int
    window_s: float

    def __call__(self, v: PortView) -> str | None:
        risen = v.memory.risen(self.counter, self.window_s) if v.memory is not None else 0
        if risen <= self.limit:
            return None
        within = f"within {self.window_s:g} s (max {self.limit})"
        return f"port {v.number} {self.counter} +{risen} {within}"


# ----------------------------------------------------------------- the rule table


@dataclass(frozen=True, slots=True)
class Rule:
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
    rows: tuple[Rule, ...]
    keep_s: float  # how long a port's memory keeps increments: the longest window a row reads

    @property
    def counters(self) -> list[str]:
        """The counters the rows read (what a poll must read)."""
        return sorted({r.check.counter for r in self.rows if isinstance(r.check, CounterRise)})


FATAL, DEGRADED = FaultClass.FATAL, FaultClass.DEGRADED
# The rows every table starts with. A RoCE port without its netdev, or without the GID its pods
# use, is not called unhealthy here: the device plugin and the DRA driver find no NCCL plan for
# it themselves (`rdmaplane.usability`).
PORT_RULES = (
    Rule(HCA_GONE, hca_gone, unhealthy=True, fault=FATAL),
    Rule(PORT_GONE, port_gone, unhealthy=True, fault=FATAL),
    Rule(PORT_DOWN, port_not_up, unhealthy=True, fault=FATAL),
    Rule(NO_NETDEV, no_netdev, unhealthy=False, fault=FATAL),
    Rule(GID_INDEX_LOST, gid_index_lost, unhealthy=False, fault=FATAL),
)


def rule_table(
    window_s: float, thresholds: Mapping[str, int], fatal_thresholds: Mapping[str, int]
) -> RuleTable:
    """`PORT_RULES`, then one row per counter limit, by counter name. A rise over
    `thresholds[c]` is unhealthy and degraded; over `fatal_thresholds[c]` fatal (a counter
    with a fatal limit is never degraded). The same limit in both is one row, unhealthy and
    fatal."""
    rows = list(PORT_RULES)
    for name in sorted({*thresholds, *fatal_thresholds}):
        limit, fatal = thresholds.get(name), fatal_thresholds.get(name)
        if limit is not None:
            cls = FATAL if limit == fatal else DEGRADED if fatal is None else None
            rows.append(Rule(ERRORS_RISING, CounterRise(name, limit, window_s), True, cls))
        if fatal is not None and fatal != limit:
            rows.append(Rule(ERRORS_RISING, CounterRise(name, fatal, window_s), False, FATAL))
    return RuleTable(tuple(rows), window_s)


def judge(
    keys: Iterable[PortKey],
    rules: RuleTable,
    *,
    observations: Mapping[PortKey, PortObservation],
    memory: Mapping[PortKey, PortMemory],
    topology: NodeTopology | None = None,
    gid_index: int | None = None,
) -> dict[PortKey, tuple[Symptom, ...]]:
    """Each port's symptoms, in the table's order (none: an empty tuple). A port that is gone
    has no other symptom."""
    out = {}
    for key in keys:
        view = PortView(key, observations.get(key), memory.get(key), topology, gid_index)
        found = tuple(
            Symptom(rule.reason, text, rule.unhealthy, rule.fault)
            for rule in rules.rows
            if (text := rule.check(view)) is not None
        )
        out[key] = tuple(s for s in found if s.reason in GONE) or found
    return out
