"""TEMPORARY shim of the `gid` branch's selectors API (issue 3); removed when it lands on main."""

from __future__ import annotations

from dataclasses import dataclass

from rdmaplane.model import Hca, LinkLayer, NodeTopology, Port

_LINK = {
    "ether": LinkLayer.ETHERNET,
    "ethernet": LinkLayer.ETHERNET,
    "eth": LinkLayer.ETHERNET,
    "roce": LinkLayer.ETHERNET,
    "infiniband": LinkLayer.INFINIBAND,
    "ib": LinkLayer.INFINIBAND,
}


def _hex(v: str) -> str:
    return v.lower().removeprefix("0x")


@dataclass(frozen=True)
class Selectors:
    vendors: tuple[str, ...] = ()
    device_ids: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    if_names: tuple[str, ...] = ()
    link_types: tuple[str, ...] = ()
    hca_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for lt in self.link_types:
            if lt.lower() not in _LINK:
                raise ValueError(
                    f"selectors.linkTypes: {lt!r} is not one of {', '.join(sorted(_LINK))}"
                )

    def matches(self, hca: Hca, port: Port) -> bool:
        pci = hca.pci
        checks = [
            (self.vendors, {_hex(v) for v in self.vendors}, _hex(pci.vendor or "") if pci else ""),
            (
                self.device_ids,
                {_hex(v) for v in self.device_ids},
                _hex(pci.device or "") if pci else "",
            ),
            (self.drivers, set(self.drivers), pci.driver if pci else None),
            (self.if_names, set(self.if_names), port.netdev),
            (self.hca_names, set(self.hca_names), hca.name),
        ]
        if self.link_types and port.link_layer not in {
            _LINK.get(t.lower(), t) for t in self.link_types
        }:
            return False
        return all(not given or value in wanted for given, wanted, value in checks)


def compute_ports(topo: NodeTopology, selectors: Selectors | None) -> list[tuple[Hca, Port]]:
    return [
        (h, p) for h in topo.hcas for p in h.ports if selectors is None or selectors.matches(h, p)
    ]
