"""Which switch port each NIC plugs into, from lldpd (`lldpcli -f json show neighbors`).

lldpd prints two JSON encodings, and both are read: `-f json` collapses one-element lists and
keys objects by name (`"interface": {"ens1np0": {...}}`, or a list of such objects when there
are several; `"chassis": {"leaf-a": {...}}` keyed by the system name, or the bare chassis when
the switch sends none), while `-f json0` keeps every list and wraps scalars
(`"name": [{"value": "leaf-a"}]`). The switch is named by its system name, else its chassis id;
its port by the port id when that is an interface name (`ifname`, `local`), else by the port
description, else the id.

Running lldpcli is the only I/O here; a missing lldpcli, a failing one or output that is not
lldpd's gives no neighbours and a one-line reason, never an exception.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rdmaplane.core.fabric import Link
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.selectors import compute_ports


@dataclass(frozen=True, slots=True)
class Neighbor:
    interface: str  # the local netdev
    switch: str  # system name, else chassis id
    switch_port: str
    chassis_id: str = ""


def read_neighbors(
    command: Sequence[str], timeout: float = 10.0
) -> tuple[dict[str, Neighbor], str | None]:
    """Run lldpcli as `command` says (the agent's `fabric.lldpCommand`); (neighbours by local
    interface, why there are none or None)."""
    if not command or shutil.which(command[0]) is None:
        return {}, f"{command[0] if command else 'lldpcli'} not found"
    try:
        done = subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {}, f"{' '.join(command)}: {exc}"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return {}, f"{' '.join(command)}: {why}"
    try:
        return parse_neighbors(json.loads(done.stdout)), None
    except ValueError as exc:
        return {}, f"{' '.join(command)}: not lldpd's JSON: {exc}"


def parse_neighbors(doc: Any) -> dict[str, Neighbor]:
    """Neighbours by local interface from either JSON encoding (first neighbour per port)."""
    found: dict[str, Neighbor] = {}
    for name, body in _interfaces(doc):
        neighbor = _neighbor(name, body)
        if neighbor is not None:
            found.setdefault(name, neighbor)
    return found


def _interfaces(doc: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
    lldp = doc.get("lldp") if isinstance(doc, Mapping) else None
    for block in _list(lldp):
        if not isinstance(block, Mapping):
            continue
        for entry in _list(block.get("interface")):
            if not isinstance(entry, Mapping):
                continue
            if isinstance(entry.get("name"), str):  # json0: {"name": "eth0", ...}
                yield entry["name"], entry
            else:  # json: {"eth0": {...}} (one key per entry, or several when collapsed)
                for name, body in entry.items():
                    if isinstance(body, Mapping):
                        yield str(name), body


def _neighbor(interface: str, body: Mapping[str, Any]) -> Neighbor | None:
    chassis = _one(body.get("chassis"))
    if not isinstance(chassis, Mapping):
        return None
    sysname = _text(chassis.get("name"))
    if not sysname and "id" not in chassis and len(chassis) == 1:
        sysname, chassis = next(iter(chassis.items()))  # json: keyed by the system name
        chassis = _one(chassis) if isinstance(_one(chassis), Mapping) else {}
    chassis_id = _text(_one(chassis.get("id")))
    switch = sysname or chassis_id
    if not switch:
        return None
    port = _one(body.get("port"))
    port = port if isinstance(port, Mapping) else {}
    port_id = _one(port.get("id"))
    id_value = _text(port_id)
    id_type = _text(port_id.get("type")) if isinstance(port_id, Mapping) else ""
    descr = _text(port.get("descr"))
    switch_port = id_value if id_type in ("ifname", "local") and id_value else descr or id_value
    return Neighbor(interface, switch, switch_port, chassis_id)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value] if value is not None else []


def _one(value: Any) -> Any:
    return value[0] if isinstance(value, list) and value else value


def _text(value: Any) -> str:
    value = _one(value)
    if isinstance(value, Mapping):
        value = value.get("value")
        value = _one(value)
    return value if isinstance(value, str) else ""


def links_from_neighbors(
    node: str, topo: NodeTopology, neighbors: Mapping[str, Neighbor]
) -> list[Link]:
    """One link per compute HCA port whose netdev (or the bond it is enslaved to) has an LLDP
    neighbour: the HCA plugs into that switch port."""
    links = []
    for hca, port in compute_ports(topo):
        for netdev in _netdevs(port.netdev, hca.parent_netdev):
            seen = neighbors.get(netdev)
            if seen is not None:
                links.append(Link(node, seen.switch, hca.name, port.number, seen.switch_port))
                break
    return links


def _netdevs(*names: str | None) -> Iterable[str]:
    return [n for n in names if n]
