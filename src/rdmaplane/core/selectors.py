"""Which HCA ports of a node are "compute" ports: the ones NCCL should use.

Pure. Two ways to say it:

- no selectors (the default): the ports that are up (ACTIVE and LinkUp) in the fastest link
  class, a class being one link layer at one rate. A 25G storage card or a port that is down
  never joins 400G compute NICs. When two classes share the top rate, the one with more ports
  wins (a DGX A100's eight 200G InfiniBand ports, not its two 200G RoCE storage ports).
- `Selectors`, compatible with the shared RDMA device plugin's `selectors` (`vendors`,
  `deviceIDs`, `drivers`, `ifNames`, `linkTypes`) plus HCA-name patterns. Fields combine with
  AND, values within a field with OR, an empty field matches everything. Selectors choose by
  identity, not by state: a selected port that is down stays selected (its health is the device
  plugin's business), and `classify_ports` says so.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass

from rdmaplane.core.model import Hca, LinkLayer, NodeTopology, Port
from rdmaplane.core.settings import key_of, setting
from rdmaplane.core.untrusted import FieldError

_LINK_TYPES = {
    "ether": LinkLayer.ETHERNET,
    "ethernet": LinkLayer.ETHERNET,
    "eth": LinkLayer.ETHERNET,
    "roce": LinkLayer.ETHERNET,
    "infiniband": LinkLayer.INFINIBAND,
    "ib": LinkLayer.INFINIBAND,
}


def natural_key(name: str) -> tuple[str | int, ...]:
    """Sort key that puts `mlx5_2` before `mlx5_10` (and `mlx5_9` before `mlx5_bond_0`)."""
    # odd places hold the digit runs the split matched (`isdigit` would take `²` for one)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(re.split(r"(\d+)", name)))


def port_key(pair: tuple[Hca, Port]) -> tuple[tuple[str | int, ...], int]:
    return natural_key(pair[0].name), pair[1].number


def _hex_id(value: str) -> str:
    """`0x15B3`, `15b3` → `15b3`: the plugin's config spells PCI ids without `0x`."""
    v = value.strip().lower()
    return v[2:] if v.startswith("0x") else v


@dataclass(frozen=True)
class Selectors:
    """Shared-RDMA-device-plugin selectors plus `hca_names` (fnmatch patterns, `mlx5_*`).

    `vendors`/`device_ids` are PCI ids with or without `0x` (`15b3`, `1021`); `drivers` the
    PCI driver (`mlx5_core`); `if_names` the port's netdev or a netdev of the HCA's PCI function
    (so both `bond0` and its slave `ens3f0np0` select `mlx5_bond_0`); `link_types` `ether` or
    `infiniband` (also `ethernet`, `eth`, `roce`, `ib`).
    """

    vendors: tuple[str, ...] = setting((), 'PCI vendor IDs, e.g. ["15b3"]')
    device_ids: tuple[str, ...] = setting(
        (), 'PCI device IDs, with or without 0x, e.g. ["1021"]', key="deviceIDs"
    )
    drivers: tuple[str, ...] = setting((), 'kernel drivers, e.g. ["mlx5_core"]')
    if_names: tuple[str, ...] = setting(
        (), "the port's netdev, or a netdev of the HCA's PCI function"
    )
    link_types: tuple[str, ...] = setting((), "ether, infiniband")
    hca_names: tuple[str, ...] = setting((), 'patterns like "mlx5_*"')

    def __post_init__(self) -> None:
        for lt in self.link_types:
            if lt.lower() not in _LINK_TYPES:
                raise FieldError(
                    "link_types", f"{lt!r} is not one of {', '.join(sorted(_LINK_TYPES))}"
                )

    def to_config(self) -> dict[str, list[str]]:
        """The selectors given, in the config's spelling (`{"deviceIDs": ["1021"]}`): what a
        log line names."""
        chosen = ((key_of(f), getattr(self, f.name)) for f in dataclasses.fields(self))
        return {key: list(values) for key, values in chosen if values}

    def mismatch(self, topo: NodeTopology, hca: Hca, port: Port) -> str | None:
        """None when the port matches, else which selector it fails and why."""
        pci = hca.pci
        checks: list[tuple[str, tuple[str, ...], list[str], Callable[[str, str], bool]]] = [
            ("hcaNames", self.hca_names, [hca.name], _pattern),
            ("vendors", self.vendors, [pci.vendor] if pci and pci.vendor else [], _same_id),
            ("deviceIDs", self.device_ids, [pci.device] if pci and pci.device else [], _same_id),
            ("drivers", self.drivers, [pci.driver] if pci and pci.driver else [], _same),
            ("ifNames", self.if_names, _netdev_names(topo, hca, port), _same),
            ("linkTypes", self.link_types, [port.link_layer.value], _same_link),
        ]
        for field, wanted, have, match in checks:
            if wanted and not any(match(w, h) for w in wanted for h in have):
                return f"{field} {', '.join(wanted)} does not match {', '.join(have) or 'unknown'}"
        return None


def _pattern(wanted: str, have: str) -> bool:
    return fnmatch.fnmatchcase(have, wanted)


def _same_id(wanted: str, have: str) -> bool:
    return _hex_id(wanted) == _hex_id(have)


def _same(wanted: str, have: str) -> bool:
    return wanted == have


def _same_link(wanted: str, have: str) -> bool:
    return _LINK_TYPES[wanted.lower()].value == have


def _netdev_names(topo: NodeTopology, hca: Hca, port: Port) -> list[str]:
    names = [port.netdev] if port.netdev else []
    if hca.pci is not None:
        names += sorted(n.name for n in topo.netdevs if n.pci == hca.pci.address)
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class PortVerdict:
    """Whether a port is a compute port, and why (or why not)."""

    hca: Hca
    port: Port
    compute: bool
    reason: str


def link_class(port: Port) -> str:
    """`400G Ethernet`, `200G InfiniBand`: the class a port competes in."""
    return _describe(_class_of(port))


def classify_ports(topo: NodeTopology, selectors: Selectors | None = None) -> list[PortVerdict]:
    """Every port of the node, in natural HCA order, with its verdict."""
    pairs = sorted(((h, p) for h in topo.hcas for p in h.ports), key=port_key)
    if selectors is not None:
        return [_by_selectors(topo, selectors, h, p) for h, p in pairs]
    up = [(h, p) for h, p in pairs if p.is_up and h.pci is not None]
    best = _fastest_class(up)
    verdicts = []
    for h, p in pairs:
        if h.pci is None:
            verdicts.append(PortVerdict(h, p, False, _SOFTWARE))
        elif not p.is_up:
            state = f"{p.state.name}/{p.phys_state.name}"
            verdicts.append(PortVerdict(h, p, False, f"excluded: port is {state}, not up"))
        elif _class_of(p) != best:
            reason = f"excluded: {link_class(p)} is not the compute class ({_describe(best)})"
            verdicts.append(PortVerdict(h, p, False, reason))
        else:
            verdicts.append(PortVerdict(h, p, True, f"compute: up, {link_class(p)}"))
    return verdicts


def compute_ports(topo: NodeTopology, selectors: Selectors | None = None) -> list[tuple[Hca, Port]]:
    """The compute ports, ordered by HCA name (naturally: `mlx5_2` before `mlx5_10`), then port."""
    return [(v.hca, v.port) for v in classify_ports(topo, selectors) if v.compute]


_SOFTWARE = (
    "excluded: a software RDMA device (no PCI function: no GPUDirect RDMA, no NUMA or PCIe "
    "place); offered only where a pool's hcaNames names it"
)


def _by_selectors(topo: NodeTopology, selectors: Selectors, hca: Hca, port: Port) -> PortVerdict:
    if hca.pci is None and not selectors.hca_names:
        return PortVerdict(hca, port, False, _SOFTWARE)
    why = selectors.mismatch(topo, hca, port)
    if why is not None:
        return PortVerdict(hca, port, False, f"excluded: {why}")
    state = "" if port.is_up else f" (but port is {port.state.name}/{port.phys_state.name})"
    return PortVerdict(hca, port, True, f"compute: matches the selectors{state}")


_Class = tuple[LinkLayer, float]


def _class_of(port: Port) -> _Class:
    return port.link_layer, port.rate_gbps if port.rate_gbps is not None else -1.0


def _describe(cls: _Class | None) -> str:
    if cls is None:
        return "none"
    layer, rate = cls
    return f"{rate:g}G {layer.value}" if rate >= 0 else f"unknown-rate {layer.value}"


def _fastest_class(pairs: list[tuple[Hca, Port]]) -> _Class | None:
    """Highest rate; on a tie the class with more ports; then InfiniBand before Ethernet so the
    answer never depends on input order."""
    counts: dict[_Class, int] = {}
    for _, p in pairs:
        counts[_class_of(p)] = counts.get(_class_of(p), 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda c: (c[1], counts[c], c[0] == LinkLayer.INFINIBAND, c[0].value))
