"""The fleet audit: firmware versions and PCIe links across nodes, and the ones that stand out.
Pure: node topologies (snapshots, documents, samples) or the NodeResourceTopology attributes
the agents publish in; the outliers out.

Firmware is compared among HCAs of one kind (`hca_type` and `board_id`: one card model): the
version most of them run is the fleet's, every other one an outlier (a card missed by a
firmware push, or the one it broke). A PCIe link is an outlier when it trained short of what
its device and slot allow (`rdmaplane.core.pcie`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rdmaplane.core.model import NodeTopology
from rdmaplane.core.nrt import ATTR_HCA_FIRMWARE, ATTR_PCIE_DOWNTRAINED
from rdmaplane.core.pcie import node_downtrained
from rdmaplane.core.selectors import natural_key


@dataclass(frozen=True, slots=True)
class Firmware:
    device: str  # the HCA
    kind: str  # "MT4129 MT_0000000838"
    version: str


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the audit reads of one node."""

    node: str
    firmware: tuple[Firmware, ...] = ()
    downtrained: tuple[tuple[str, str], ...] = ()  # (device, why)


@dataclass(frozen=True, slots=True)
class Outlier:
    node: str
    device: str
    what: str  # "firmware" | "pcie"
    why: str


@dataclass(frozen=True, slots=True)
class Audit:
    nodes: tuple[NodeFacts, ...]
    fleet_firmware: Mapping[str, str]  # kind → the version most HCAs of it run
    outliers: tuple[Outlier, ...]


def facts_of(node: str, topo: NodeTopology) -> NodeFacts:
    firmware = tuple(
        Firmware(h.name, _kind(h.hca_type, h.board_id), h.fw_ver)
        for h in sorted(topo.hcas, key=lambda h: natural_key(h.name))
        if h.fw_ver
    )
    downtrained = tuple((d.device, d.why) for d in node_downtrained(topo))
    return NodeFacts(node, firmware, downtrained)


def _kind(hca_type: str | None, board_id: str | None) -> str:
    return " ".join(p for p in (hca_type, board_id) if p) or "unknown"


# ----------------------------------------------------------------- the NRT's attributes


def attributes(topo: NodeTopology) -> dict[str, str]:
    """The NRT attributes the agent publishes for the audit (the downtrained links only when
    there are some)."""
    facts = facts_of("", topo)
    out = {
        ATTR_HCA_FIRMWARE: "; ".join(f"{f.device}={f.version} ({f.kind})" for f in facts.firmware)
    }
    if facts.downtrained:
        out[ATTR_PCIE_DOWNTRAINED] = "; ".join(f"{d}: {why}" for d, why in facts.downtrained)
    return out


def facts_from_attributes(node: str, attrs: Mapping[str, str]) -> NodeFacts:
    """`attributes` read back; raises ValueError naming the attribute that does not parse."""
    firmware = []
    for entry in _entries(attrs.get(ATTR_HCA_FIRMWARE, "")):
        device, sep, rest = entry.partition("=")
        version, _, kind = rest.partition(" (")
        if not sep or not kind.endswith(")") or not device or not version:
            raise ValueError(f"{ATTR_HCA_FIRMWARE}: {entry!r} is not 'HCA=VERSION (KIND)'")
        firmware.append(Firmware(device, kind[:-1], version))
    downtrained = []
    for entry in _entries(attrs.get(ATTR_PCIE_DOWNTRAINED, "")):
        device, sep, why = entry.partition(": ")
        if not sep or not device:
            raise ValueError(f"{ATTR_PCIE_DOWNTRAINED}: {entry!r} is not 'DEVICE: WHY'")
        downtrained.append((device, why))
    return NodeFacts(node, tuple(firmware), tuple(downtrained))


def _entries(value: str) -> list[str]:
    return [e.strip() for e in value.split(";") if e.strip()]


# ----------------------------------------------------------------- the audit


def audit(nodes: Sequence[NodeFacts]) -> Audit:
    by_kind: dict[str, Counter[str]] = {}
    for n in nodes:
        for f in n.firmware:
            by_kind.setdefault(f.kind, Counter())[f.version] += 1
    fleet = {kind: _majority(counts) for kind, counts in sorted(by_kind.items())}
    outliers = [
        Outlier(
            n.node, f.device, "firmware", f"{f.version}, the fleet runs {fleet[f.kind]} ({f.kind})"
        )
        for n in nodes
        for f in n.firmware
        if f.version != fleet[f.kind]
    ]
    outliers += [Outlier(n.node, d, "pcie", why) for n in nodes for d, why in n.downtrained]
    return Audit(tuple(nodes), fleet, tuple(_sorted(outliers)))


def _majority(counts: Counter[str]) -> str:
    """The most common version; on a tie the highest (a push half done is behind, not ahead)."""
    top = max(counts.values())
    return max((v for v, n in counts.items() if n == top), key=_version_key)


def _version_key(version: str) -> tuple[tuple[int, object], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in version.split("."))


def _sorted(outliers: Iterable[Outlier]) -> list[Outlier]:
    return sorted(outliers, key=lambda o: (natural_key(o.node), o.what, natural_key(o.device)))
