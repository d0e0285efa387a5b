"""The `rdmaplane.io/node-topology/v1` document: the model as JSON, and back.

Written by `rdmaplane inspect -o json`, read by `rdmaplane gid audit` and anything else that
takes node files. `relations` is derived, so it is written for readers and ignored on input.
Pure: dicts in, dicts out; a bad document raises `DocumentError` naming the field.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rdmaplane.model import (
    MAX_NUMA_NODES,
    MAX_RATE_GBPS,
    SCHEMA,
    Gid,
    GidType,
    Gpu,
    Hca,
    LinkLayer,
    Netdev,
    NetdevKind,
    NetnsMode,
    NodeTopology,
    NumaNode,
    PciDevice,
    PhysState,
    Port,
    PortState,
    ReadWarning,
    format_cpulist,
    parse_cpulist,
)
from rdmaplane.selectors import natural_key
from rdmaplane.topology import relations
from rdmaplane.untrusted import DocumentError, printable


def to_document(topo: NodeTopology) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "hostname": topo.hostname,
        "source": topo.source,
        "netns_mode": topo.netns_mode.value,
        "numa_nodes": [
            {"id": n.id, "cpus": format_cpulist(n.cpus), "distances": list(n.distances)}
            for n in topo.numa_nodes
        ],
        "gpus": [_gpu(g) for g in topo.gpus],
        "hcas": [_hca(h) for h in topo.hcas],
        "netdevs": [_netdev(n) for n in topo.netdevs],
        "relations": relations(topo),
        "warnings": [{"path": w.path, "message": w.message} for w in topo.warnings],
    }


def _pci(p: PciDevice) -> dict[str, Any]:
    return {
        "address": p.address,
        "root": p.root,
        "bridges": list(p.bridges),
        "vendor": p.vendor,
        "device": p.device,
        "class": p.class_code,
        "numa": p.numa,
        "driver": p.driver,
        "local_cpus": p.local_cpus,
    }


def _gpu(g: Gpu) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "index": g.index,
        "pci": g.pci.address,
        "numa": g.pci.numa,
        "pcie_root": g.pci.root,
        "uuid": g.uuid,
        "name": g.name,
        "pci_device": _pci(g.pci),
    }
    if g.nvlinks is not None:
        doc["nvlinks"] = dict(g.nvlinks)
    return doc


def _hca(h: Hca) -> dict[str, Any]:
    return {
        "name": h.name,
        "pci": h.pci.address if h.pci else None,
        "numa": h.numa,
        "pcie_root": h.pcie_root,
        "pci_device": _pci(h.pci) if h.pci else None,
        "data_direct": _pci(h.data_direct) if h.data_direct else None,
        "node_type": h.node_type,
        "node_guid": h.node_guid,
        "sys_image_guid": h.sys_image_guid,
        "fw_ver": h.fw_ver,
        "hca_type": h.hca_type,
        "board_id": h.board_id,
        "uverbs": h.uverbs,
        "parent_netdev": h.parent_netdev,
        "ports": [_port(p) for p in h.ports],
    }


def _port(p: Port) -> dict[str, Any]:
    return {
        "port": p.number,
        "state": p.state.name,
        "phys_state": p.phys_state.name,
        "link_layer": p.link_layer.value,
        "rate_gbps": p.rate_gbps,
        "rate": p.rate,
        "lid": p.lid,
        "sm_lid": p.sm_lid,
        "netdev": p.netdev,
        "gid_table_len": p.gid_table_len,
        "umad": p.umad,
        "issm": p.issm,
        "gids": [
            {
                "index": g.index,
                "gid": g.raw,
                "type": g.type.value if g.type else None,
                "netdev": g.netdev,
                "ip": g.ip,
                "attrs_error": g.attrs_error,
            }
            for g in p.gids
        ],
    }


def _netdev(n: Netdev) -> dict[str, Any]:
    return {
        "name": n.name,
        "kind": n.kind.value,
        "pci": n.pci,
        "mac": n.mac,
        "mtu": n.mtu,
        "operstate": n.operstate,
        "speed_mbps": n.speed_mbps,
        "master": n.master,
        "lower": list(n.lower),
        "dev_port": n.dev_port,
    }


# ---------------------------------------------------------------- reading back


def from_document(doc: Any, *, where: str = "document") -> NodeTopology:
    """The model from a v1 document; DocumentError names the first bad field."""
    r = _Fields(where)
    d = r.obj(doc, "")
    schema = d.get("schema")
    if schema != SCHEMA:
        raise DocumentError(f"{where}: schema is {schema!r}, expected {SCHEMA!r}")
    numa_nodes = tuple(
        NumaNode(
            id=numa,
            cpus=_parse_cpus(r, n, f"numa_nodes[{i}]"),
            distances=tuple(r.int_list(n, "distances", f"numa_nodes[{i}]")),
        )
        for i, n in enumerate(r.objs(d, "numa_nodes", ""))
        if (numa := r.numa(n, "id", f"numa_nodes[{i}]", required=True)) is not None
    )
    return _with_warnings(r, d, numa_nodes)


def _with_warnings(r: _Fields, d: dict[str, Any], numa_nodes: tuple[NumaNode, ...]) -> NodeTopology:
    topo = _topology(r, d, numa_nodes)
    return replace(topo, warnings=(*topo.warnings, *r.warnings)) if r.warnings else topo


def _topology(r: _Fields, d: dict[str, Any], numa_nodes: tuple[NumaNode, ...]) -> NodeTopology:
    where = r.where
    return NodeTopology(
        hostname=r.opt_str(d, "hostname", ""),
        numa_nodes=numa_nodes,
        gpus=tuple(_read_gpu(r, g, f"gpus[{i}]") for i, g in enumerate(r.objs(d, "gpus", ""))),
        hcas=tuple(
            sorted(
                (_read_hca(r, h, f"hcas[{i}]") for i, h in enumerate(r.objs(d, "hcas", ""))),
                key=lambda h: natural_key(h.name),
            )
        ),
        netdevs=tuple(
            _read_netdev(r, n, f"netdevs[{i}]") for i, n in enumerate(r.objs(d, "netdevs", ""))
        ),
        warnings=tuple(
            ReadWarning(r.text(w, "path", f"warnings[{i}]"), r.text(w, "message", f"warnings[{i}]"))
            for i, w in enumerate(r.objs(d, "warnings", ""))
        ),
        source=r.opt_str(d, "source", "") or where,
        netns_mode=NetnsMode(
            r.choice(d, "netns_mode", "", [m.value for m in NetnsMode])
            if "netns_mode" in d
            else NetnsMode.UNKNOWN  # documents written before the mode was part of the model
        ),
    )


def _parse_cpus(r: _Fields, n: dict[str, Any], at: str) -> tuple[int, ...]:
    text = r.opt_str(n, "cpus", at) or ""
    try:
        return parse_cpulist(text)
    except ValueError:
        raise DocumentError(f"{r.where}: {at}.cpus: not a CPU list: {text!r}") from None


def _read_pci(r: _Fields, p: dict[str, Any], at: str) -> PciDevice:
    return PciDevice(
        address=r.text(p, "address", at),
        root=r.text(p, "root", at),
        bridges=tuple(r.str_list(p, "bridges", at)),
        vendor=r.opt_str(p, "vendor", at),
        device=r.opt_str(p, "device", at),
        class_code=r.opt_str(p, "class", at),
        numa=r.numa(p, "numa", at),
        driver=r.opt_str(p, "driver", at),
        local_cpus=r.opt_str(p, "local_cpus", at),
    )


def _read_gpu(r: _Fields, g: dict[str, Any], at: str) -> Gpu:
    return Gpu(
        index=r.integer(g, "index", at),
        pci=_read_pci(r, r.obj(g.get("pci_device"), f"{at}.pci_device"), f"{at}.pci_device"),
        uuid=r.opt_str(g, "uuid", at),
        name=r.opt_str(g, "name", at),
        nvlinks=_read_nvlinks(r, g, at),
    )


def _read_nvlinks(r: _Fields, g: dict[str, Any], at: str) -> tuple[tuple[str, int], ...] | None:
    links = g.get("nvlinks")
    if links is None:
        return None
    if not isinstance(links, dict):
        raise r.fail(at, "nvlinks", "expected an object of peer PCI address to link count")
    return tuple(sorted((str(k), r.integer(links, k, f"{at}.nvlinks")) for k in links))


def _read_hca(r: _Fields, h: dict[str, Any], at: str) -> Hca:
    pci, dma = h.get("pci_device"), h.get("data_direct")
    return Hca(
        name=r.text(h, "name", at),
        pci=_read_pci(r, r.obj(pci, f"{at}.pci_device"), f"{at}.pci_device") if pci else None,
        ports=tuple(
            _read_port(r, p, f"{at}.ports[{i}]") for i, p in enumerate(r.objs(h, "ports", at))
        ),
        node_type=r.opt_str(h, "node_type", at),
        node_guid=r.opt_str(h, "node_guid", at),
        sys_image_guid=r.opt_str(h, "sys_image_guid", at),
        fw_ver=r.opt_str(h, "fw_ver", at),
        hca_type=r.opt_str(h, "hca_type", at),
        board_id=r.opt_str(h, "board_id", at),
        uverbs=r.opt_str(h, "uverbs", at),
        parent_netdev=r.opt_str(h, "parent_netdev", at),
        data_direct=(
            _read_pci(r, r.obj(dma, f"{at}.data_direct"), f"{at}.data_direct") if dma else None
        ),
    )


def _read_port(r: _Fields, p: dict[str, Any], at: str) -> Port:
    return Port(
        number=r.integer(p, "port", at),
        state=r.enum(PortState, p, "state", at),
        phys_state=r.enum(PhysState, p, "phys_state", at),
        link_layer=LinkLayer(r.choice(p, "link_layer", at, [x.value for x in LinkLayer])),
        rate_gbps=r.rate(p, "rate_gbps", at),
        rate=r.opt_str(p, "rate", at),
        lid=r.opt_int(p, "lid", at),
        sm_lid=r.opt_int(p, "sm_lid", at),
        netdev=r.opt_str(p, "netdev", at),
        gids=tuple(_read_gid(r, g, f"{at}.gids[{i}]") for i, g in enumerate(r.objs(p, "gids", at))),
        gid_table_len=r.opt_int(p, "gid_table_len", at) or 0,
        umad=r.opt_str(p, "umad", at),
        issm=r.opt_str(p, "issm", at),
    )


def _read_gid(r: _Fields, g: dict[str, Any], at: str) -> Gid:
    kind = r.opt_str(g, "type", at)
    if kind is not None and kind not in GidType._value2member_map_:
        raise DocumentError(f"{r.where}: {at}.type: unknown GID type {kind!r}")
    gid = Gid(
        index=r.integer(g, "index", at),
        raw=r.text(g, "gid", at),
        type=GidType(kind) if kind is not None else None,
        netdev=r.opt_str(g, "netdev", at),
        attrs_error=r.opt_str(g, "attrs_error", at),
    )
    try:
        _ = gid.address
    except ValueError:
        raise DocumentError(f"{r.where}: {at}.gid: not a GID: {gid.raw!r}") from None
    return gid


def _read_netdev(r: _Fields, n: dict[str, Any], at: str) -> Netdev:
    return Netdev(
        name=r.text(n, "name", at),
        kind=NetdevKind(r.choice(n, "kind", at, [k.value for k in NetdevKind])),
        pci=r.opt_str(n, "pci", at),
        mac=r.opt_str(n, "mac", at),
        mtu=r.opt_int(n, "mtu", at),
        operstate=r.opt_str(n, "operstate", at),
        speed_mbps=r.opt_int(n, "speed_mbps", at),
        master=r.opt_str(n, "master", at),
        lower=tuple(r.str_list(n, "lower", at)),
        dev_port=r.opt_int(n, "dev_port", at),
    )


class _Fields:
    """Typed field access that raises DocumentError naming the path of the bad field."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.warnings: list[ReadWarning] = []  # absurd values, left out as the reader does

    def absurd(self, at: str, key: str, value: object, why: str) -> None:
        path = f"{at}.{key}" if at else key
        self.warnings.append(ReadWarning(self.where, f"{path}: {value!r} {why}; left out"))

    def numa(self, d: dict[str, Any], key: str, at: str, required: bool = False) -> int | None:
        """A NUMA node id (-1 or null: unknown); one no kernel numbers is a warning, None."""
        v = self.integer(d, key, at) if required else self.opt_int(d, key, at)
        if v is None or (v == -1 and not required):
            return None
        if not 0 <= v < MAX_NUMA_NODES:
            self.absurd(at, key, v, f"is no NUMA node (below {MAX_NUMA_NODES})")
            return None
        return v

    def rate(self, d: dict[str, Any], key: str, at: str) -> float | None:
        """A port's line rate in Gb/s; one no port runs at is a warning, None (unknown)."""
        v = self.opt_float(d, key, at)
        if v is not None and not 0 < v <= MAX_RATE_GBPS:
            self.absurd(at, key, v, f"is no line rate (above 0, at most {MAX_RATE_GBPS:g} Gb/s)")
            return None
        return v

    def fail(self, at: str, key: str, what: str) -> DocumentError:
        path = f"{at}.{key}" if at else key
        return DocumentError(f"{self.where}: {path}: {what}")

    def obj(self, v: Any, at: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise DocumentError(f"{self.where}: {at or 'top level'}: expected an object")
        return v

    def objs(self, d: dict[str, Any], key: str, at: str) -> list[dict[str, Any]]:
        v = d.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
            raise self.fail(at, key, "expected a list of objects")
        return v

    def text(self, d: dict[str, Any], key: str, at: str) -> str:
        v = d.get(key)
        if not isinstance(v, str):
            raise self.fail(at, key, "expected a string")
        return self._printable(v, at, key)

    def opt_str(self, d: dict[str, Any], key: str, at: str) -> str | None:
        v = d.get(key)
        if v is not None and not isinstance(v, str):
            raise self.fail(at, key, "expected a string or null")
        return v if v is None else self._printable(v, at, key)

    def _printable(self, v: str, at: str, key: str) -> str:
        """Node documents travel between people: no string in one may carry what a terminal
        would act on (escape sequences, line breaks); no real value does."""
        if not v.isprintable():
            raise self.fail(at, key, f"control characters in {printable(v)[:60]!r}")
        return v

    def integer(self, d: dict[str, Any], key: str, at: str) -> int:
        v = d.get(key)
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.fail(at, key, "expected an integer")
        return v

    def opt_int(self, d: dict[str, Any], key: str, at: str) -> int | None:
        return None if d.get(key) is None else self.integer(d, key, at)

    def opt_float(self, d: dict[str, Any], key: str, at: str) -> float | None:
        v = d.get(key)
        if v is None:
            return None
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise self.fail(at, key, "expected a number")
        return float(v)

    def int_list(self, d: dict[str, Any], key: str, at: str) -> list[int]:
        v = d.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, int) for x in v):
            raise self.fail(at, key, "expected a list of integers")
        return v

    def str_list(self, d: dict[str, Any], key: str, at: str) -> list[str]:
        v = d.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.fail(at, key, "expected a list of strings")
        return v

    def choice(self, d: dict[str, Any], key: str, at: str, options: list[str]) -> str:
        v = self.text(d, key, at)
        if v not in options:
            raise self.fail(at, key, f"{v!r} is not one of {', '.join(options)}")
        return v

    def enum(self, kind: Any, d: dict[str, Any], key: str, at: str) -> Any:
        return kind[self.choice(d, key, at, [m.name for m in kind])]
