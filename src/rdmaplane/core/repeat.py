"""Repeat offenders: ports that keep failing stay out of service until an operator says
otherwise. Pure: the history (kept in the API server, on the Node, so it outlives the agent)
and the fault state in, the history and the quarantined ports out.

Each fatal fault of a port is an *episode*, from when it was raised until it cleared (or fell
back to degraded). A port with `count` episodes begun within `window_s` is quarantined: the
health rules call it unhealthy (the device plugin and the DRA driver stop handing it out) and
the node may be tainted NoSchedule, until the operator annotates the Node
`rdmaplane.io/fault-clear=<hca>/<port>` (or `<hca>`, or `all`), which forgets the port's
episodes too. A fault seen again after an agent restart (its episode still open in the
history) is the same episode, not a new one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from rdmaplane.core import names
from rdmaplane.core.apitime import api_time, parse_api_time
from rdmaplane.core.porthealth import PortKey

HISTORY_ANNOTATION = names.FAULT_HISTORY_ANNOTATION
CLEAR_ANNOTATION = names.FAULT_CLEAR_ANNOTATION
QUARANTINE_TAINT_KEY = names.QUARANTINE_TAINT


@dataclass(frozen=True, slots=True)
class RepeatRules:
    count: int
    window_s: float


@dataclass(frozen=True, slots=True)
class PortHistory:
    """A port's episodes (since, until; until None while it lasts), oldest first, and when it
    was quarantined (wall-clock seconds)."""

    episodes: tuple[tuple[float, float | None], ...] = ()
    quarantined_at: float | None = None

    @property
    def ongoing(self) -> bool:
        return bool(self.episodes) and self.episodes[-1][1] is None


History = Mapping[PortKey, PortHistory]


def reconcile(
    history: History,
    fatal: Collection[PortKey],
    pending: Collection[PortKey],
    now: float,
    rules: RepeatRules,
) -> dict[PortKey, PortHistory]:
    """The history after a poll: an episode opens for each port with a raised fatal fault and
    no ongoing episode; an ongoing episode closes once its port is neither fatal nor about to
    be (`pending`: fatal symptoms not yet persisting `fatalAfter`, as after a restart); a port
    with `count` episodes within the window is quarantined. Closed episodes older than the
    window are forgotten, and so is a port with nothing left."""
    out = {}
    for key in sorted({*history, *fatal}):
        port = history.get(key, PortHistory())
        episodes = list(port.episodes)
        if key in fatal and not port.ongoing:
            episodes.append((now, None))
        elif port.ongoing and key not in fatal and key not in pending:
            episodes[-1] = (episodes[-1][0], now)
        start = now - rules.window_s  # one subtraction: `now - since` rounds tiny times away
        kept = tuple(e for e in episodes if e[1] is None or e[0] > start)
        recent = sum(1 for since, _ in kept if since > start)
        at = port.quarantined_at
        if at is None and recent >= rules.count:
            at = now
        if kept or at is not None:
            out[key] = PortHistory(kept, at)
    return out


def quarantined(history: History, rules: RepeatRules) -> dict[PortKey, str]:
    """The quarantined ports, each with why (the symptom's text)."""
    return {
        key: (
            f"port {key[1]} had {len(port.episodes)} fatal faults (quarantined after "
            f"{rules.count} within {_span(rules.window_s)}): out of service until the Node is "
            f"annotated {CLEAR_ANNOTATION}={key[0]}/{key[1]}"
        )
        for key, port in sorted(history.items())
        if port.quarantined_at is not None
    }


def clear(history: History, value: str) -> dict[PortKey, PortHistory]:
    """The history without the ports the operator's annotation names (`mlx5_3/1`, `mlx5_3`,
    `all`; several separated by commas). Their faults are forgotten with the quarantine: the
    count starts again."""
    names = {v.strip() for v in value.split(",") if v.strip()}
    return {
        key: port
        for key, port in history.items()
        if not ({"all", key[0], f"{key[0]}/{key[1]}"} & names)
    }


def _span(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:g} h" if hours >= 1 else f"{seconds:g} s"


# ----------------------------------------------------------------- the Node's annotation


def to_document(history: History) -> dict[str, Any]:
    ports: dict[str, Any] = {}
    for (hca, number), port in sorted(history.items()):
        doc: dict[str, Any] = {
            "faults": [
                [api_time(s), api_time(u) if u is not None else None] for s, u in port.episodes
            ]
        }
        if port.quarantined_at is not None:
            doc["quarantined"] = api_time(port.quarantined_at)
        ports[f"{hca}/{number}"] = doc
    return {"v": 1, "ports": ports}


def from_document(doc: Mapping[str, Any]) -> dict[PortKey, PortHistory]:
    """Raises ValueError (or KeyError, TypeError) for a document this version cannot read."""
    if doc.get("v") != 1:
        raise ValueError(f"history version {doc.get('v')!r}, not 1")
    out = {}
    for name, port in (doc.get("ports") or {}).items():
        hca, _, number = str(name).rpartition("/")
        episodes = tuple(
            (parse_api_time(since), parse_api_time(until) if until is not None else None)
            for since, until in port.get("faults") or ()
        )
        at = port.get("quarantined")
        out[(hca, int(number))] = PortHistory(
            episodes, parse_api_time(at) if at is not None else None
        )
    return out
