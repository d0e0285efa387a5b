"""Cheap reads of the sysfs files that change between full discoveries.

A full `read_node` of an HGX node opens thousands of files (every GID table has 255 entries),
~25 ms on tmpfs; a poll every few seconds reads only ~120 (~1.5 ms):

- the listings of `class/infiniband`, `class/net` and `bus/pci/devices` (devices come and go);
- per port `state`, `phys_state` and `rate` (link flaps, speed changes);
- per port the GID entries known to be in use plus the two lowest free ones: the kernel puts a
  new GID (a v1/v2 pair per added address) into the lowest free slots, so an added address
  shows up there, and a removed one zeroes a known entry;
- per port the error counters the health monitor watches;
- per HCA its PCIe link's current speed and width (a link that retrains narrower);
- ib_core's `netns_mode` parameter (`rdma system set netns` flips it at run time).

`states` reads the ports' `state` and `phys_state` alone (two small files a port), for the
agent's fast check between polls: a change there calls the poll at once. A reading carries the
same bytes (`Reading.states`), so the check compares against the poll without reading them again.

Everything but the counters forms the fingerprint; a different fingerprint triggers a full
rediscovery; `settle` pairs a full read with its probe's first reading. (All counters of every
port, for `/metrics` at scrape time, are read by `rdmaplane.services.agent.metrics`.)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from rdmaplane.adapters.discovery.sysfs import NETNS_PARAMETER
from rdmaplane.core.model import NodeTopology, PhysState, PortObservation, PortState

LISTED = ("class/infiniband", "class/net", "bus/pci/devices")
GID_PROBE_FREE = 2

E = TypeVar("E", PortState, PhysState)


def read_small(path: str) -> bytes | None:
    """The content of a small sysfs file, or None when it cannot be read (gone, EINVAL…)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def leading_number(raw: bytes | None) -> int | None:
    """`4: ACTIVE` → 4; a plain counter value → itself; None when unreadable."""
    if raw is None:
        return None
    try:
        return int(raw.split(b":", 1)[0])
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Reading:
    fingerprint: tuple[object, ...]
    ports: tuple[PortObservation, ...]
    states: tuple[bytes | None, ...]  # every port's `state` and `phys_state`, as `Probe.states`


def counter_dirs(root: str, hca: str, port: int, single_port: bool) -> list[str]:
    """Where a port's counters live: `ports/N/counters` (PMA), `ports/N/hw_counters` (mlx5 per
    port) and, on single-port HCAs only, the device-wide `hw_counters` (which would be ambiguous
    on a dual-port card)."""
    base = os.path.realpath(f"{root}/class/infiniband/{hca}")  # one path walk, not one per file
    dirs = [f"{base}/ports/{port}/counters", f"{base}/ports/{port}/hw_counters"]
    if single_port:
        dirs.append(f"{base}/hw_counters")
    return dirs


def counter_files(root: str, hca: str, port: int, single_port: bool) -> dict[str, str]:
    """Counter name → file for one port; a per-port file wins over a device-wide one."""
    out: dict[str, str] = {}
    for d in counter_dirs(root, hca, port, single_port):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            out.setdefault(name, f"{d}/{name}")
    return out


def _free_indexes(used: set[int], table_len: int, count: int) -> list[int]:
    out = []
    for i in range(table_len):
        if i not in used:
            out.append(i)
            if len(out) == count:
                break
    return out


@dataclass(frozen=True, slots=True)
class _PortPlan:
    hca: str
    port: int
    state: str
    phys_state: str
    fingerprinted: tuple[str, ...]
    counters: tuple[tuple[str, str], ...]


class Probe:
    """The poll-time reader for one discovered topology (build a new one after rediscovery)."""

    def __init__(self, root: str, topo: NodeTopology, watched: Iterable[str]) -> None:
        self.root = root
        wanted = set(watched)
        plans = []
        for hca in topo.hcas:
            for port in hca.ports:
                # Resolved once: the `class/infiniband/<hca>` link and the PCI path below it
                # cost a path walk per open; a vanished HCA shows in the listing anyway.
                base = os.path.realpath(f"{root}/class/infiniband/{hca.name}/ports/{port.number}")
                used = {g.index for g in port.gids}
                gids = sorted(used) + _free_indexes(used, port.gid_table_len, GID_PROBE_FREE)
                files = counter_files(root, hca.name, port.number, len(hca.ports) == 1)
                plans.append(
                    _PortPlan(
                        hca=hca.name,
                        port=port.number,
                        state=f"{base}/state",
                        phys_state=f"{base}/phys_state",
                        fingerprinted=(f"{base}/rate", *(f"{base}/gids/{i}" for i in gids)),
                        counters=tuple(sorted((n, p) for n, p in files.items() if n in wanted)),
                    )
                )
        self._plans = tuple(plans)
        self._links = tuple(
            f"{root}/bus/pci/devices/{hca.pci.address}/current_link_{what}"
            for hca in topo.hcas
            if hca.pci is not None and hca.pci.link is not None
            for what in ("speed", "width")
        )

    def states(self) -> tuple[bytes | None, ...]:
        """Every port's `state` and `phys_state`, as read now."""
        return tuple(read_small(p) for plan in self._plans for p in (plan.state, plan.phys_state))

    def read(self) -> Reading:
        fingerprint: list[object] = []
        for rel in LISTED:
            try:
                fingerprint.append(tuple(sorted(os.listdir(f"{self.root}/{rel}"))))
            except OSError:
                fingerprint.append(None)
        fingerprint.append(read_small(f"{self.root}/{NETNS_PARAMETER}"))
        fingerprint += [read_small(p) for p in self._links]
        ports, states = [], []
        for plan in self._plans:
            state_raw, phys_raw = read_small(plan.state), read_small(plan.phys_state)
            states += [state_raw, phys_raw]
            fingerprint += [state_raw, phys_raw, *(read_small(p) for p in plan.fingerprinted)]
            counters = {}
            for name, path in plan.counters:
                value = leading_number(read_small(path))
                if value is not None:
                    counters[name] = value
            ports.append(
                PortObservation(
                    hca=plan.hca,
                    port=plan.port,
                    state=_enum(PortState, leading_number(state_raw), PortState.NOP),
                    phys_state=_enum(PhysState, leading_number(phys_raw), PhysState.NOP),
                    counters=counters,
                )
            )
        return Reading(tuple(fingerprint), tuple(ports), tuple(states))


@dataclass(frozen=True, slots=True)
class Settled:
    """A full read, its probe, and the probe's first reading, taken between two full reads that
    agree; `fingerprint` is None when they never agreed (the next poll then reads again)."""

    topo: NodeTopology
    probe: Probe
    reading: Reading
    fingerprint: tuple[object, ...] | None


async def settle(
    read_node: Callable[[], Awaitable[NodeTopology]],
    make_probe: Callable[[NodeTopology], Probe],
    tries: int = 3,
    first: NodeTopology | None = None,
) -> Settled:
    """Read the node, then the probe's baseline, then the node again, until two full reads agree.

    A baseline taken after a full read could see a change the full read missed (a port that
    went down in between); it would then match every later poll, and the stale topology would
    stand until the next periodic read. A second full read that equals the first proves nothing
    the probe watches changed before the baseline. `first` is a full read the caller already
    has (it is checked like any other)."""
    topo = first if first is not None else await read_node()
    for _ in range(tries):
        probe = make_probe(topo)
        reading = await asyncio.to_thread(probe.read)
        again = await read_node()
        if again == topo:
            return Settled(topo, probe, reading, reading.fingerprint)
        topo = again
    return Settled(topo, probe, reading, None)


def _enum(kind: type[E], value: int | None, default: E) -> E:
    if value is None or value not in kind._value2member_map_:
        return default
    return kind(value)
