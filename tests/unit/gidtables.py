"""Hand-written GID tables for the GID/NCCL tests, built the way the sysfs reader builds them."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from rdmaplane.core.model import (
    Gid,
    GidType,
    Hca,
    LinkLayer,
    NodeTopology,
    PciDevice,
    PhysState,
    Port,
    PortState,
)

TYPES = {1: GidType.ROCE_V1, 2: GidType.ROCE_V2}
EINVAL = "types: Invalid argument; ndevs: Invalid argument"


def raw(address: str) -> str:
    """Full-form GID of an IPv6 address, or of an IPv4 address as the kernel maps it."""
    ip = ipaddress.ip_address(address)
    if ip.version == 4:
        ip = ipaddress.IPv6Address(f"::ffff:{ip}")
    return ip.exploded


def lladdr(n: int = 1) -> str:
    return f"fe80::ba3f:d2ff:fe10:{n:x}"


@dataclass(frozen=True)
class E:
    """One table entry: index, address, RoCE version (None: attributes unreadable), netdev."""

    index: int
    address: str
    version: int | None = 2
    netdev: str | None = "eth0"

    def gid(self) -> Gid:
        if self.version is None:
            return Gid(self.index, raw(self.address), None, None, EINVAL)
        return Gid(self.index, raw(self.address), TYPES[self.version], self.netdev)


def pair(first: int, address: str, netdev: str = "eth0") -> list[E]:
    """The v1/v2 pair the kernel adds for each address."""
    return [E(first, address, 1, netdev), E(first + 1, address, 2, netdev)]


def port(
    entries: list[E],
    *,
    number: int = 1,
    link: LinkLayer = LinkLayer.ETHERNET,
    up: bool = True,
    rate: float = 400.0,
    netdev: str | None = "eth0",
) -> Port:
    return Port(
        number=number,
        state=PortState.ACTIVE if up else PortState.DOWN,
        phys_state=PhysState.LINK_UP if up else PhysState.DISABLED,
        link_layer=link,
        rate_gbps=rate,
        netdev=netdev,
        gids=tuple(e.gid() for e in sorted(entries, key=lambda e: e.index)),
        gid_table_len=max([e.index for e in entries], default=0) + 1,
    )


def hca(name: str, *ports: Port) -> Hca:
    """A NIC (a PCI function of its own, as a hardware HCA has: software ones are no compute
    ports) at a bus number of its name."""
    bus = sum(name.encode()) % 256
    return Hca(name=name, pci=PciDevice(f"0000:{bus:02x}:00.0", f"pci0000:{bus:02x}"), ports=ports)


def standard(n: int = 1, ip: str = "10.99.91.39", netdev: str = "eth0") -> list[E]:
    """0/1 link-local v1/v2, 2/3 IPv4 v1/v2: the usual ConnectX table."""
    return pair(0, lladdr(n), netdev) + pair(2, ip, netdev)


def node(*hcas: Hca, hostname: str = "n1") -> NodeTopology:
    return NodeTopology(hostname=hostname, hcas=hcas)
