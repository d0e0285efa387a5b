"""The `rdmaplane.io/node-topology/v1` document: the model as JSON, and back.

Written by `rdmaplane inspect -o json`, read by `rdmaplane gid audit` and anything else that
takes node files. The document's shape is declared once, as structs that mirror the model
field for field (`_Doc`, the key renamed where the document's differs: `port` for a port's
`number`, `gid` for a GID's `raw`, `pci_device` for a PCI function): both directions copy by
those names, the model layer (`rdmaplane.core.decoding`) checks what is read. `relations` and the
addresses beside each `pci_device` are derived, so they are written for readers and ignored on
input. Pure: dicts in, dicts out; a bad document raises `DocumentError` naming the field.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

import msgspec

from rdmaplane.core.decoding import DecodeError, convert
from rdmaplane.core.model import (
    MAX_NUMA_NODES,
    MAX_PCIE_GTS,
    MAX_PCIE_WIDTH,
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
    PcieLink,
    PhysState,
    Port,
    PortState,
    ReadWarning,
    format_cpulist,
    parse_cpulist,
)
from rdmaplane.core.selectors import natural_key
from rdmaplane.core.topology import relations
from rdmaplane.core.untrusted import DocumentError, printable, what_it_is

M = TypeVar("M")


class NvLinks(dict[str, int]):
    """NVLinks to each peer GPU, by the peer's PCI address."""

    expected = "an object of peer PCI address to link count"

    @classmethod
    def from_wire(cls, value: Any) -> NvLinks:
        if not isinstance(value, dict):
            raise ValueError(f"expected {cls.expected}")
        for peer, links in value.items():
            if not isinstance(links, int) or isinstance(links, bool):
                raise ValueError(f".{peer}: expected an integer")
        return cls(value)


class _Doc(msgspec.Struct):
    """A struct mirroring a model dataclass by field name (fields in the document's order).

    Node documents travel between people: no string in one may carry what a terminal would act
    on (escape sequences, line breaks); no real value does."""

    def __post_init__(self) -> None:
        for name, key in zip(self.__struct_fields__, self.__struct_encode_fields__, strict=True):
            value = getattr(self, name)
            if isinstance(value, str) and not value.isprintable():
                raise ValueError(f".{key}: control characters in {printable(value)[:60]!r}")


class _NumaDoc(_Doc):
    id: int
    cpus: str | None = None  # the kernel's CPU list, `0-3,8`
    distances: tuple[int, ...] = ()


class _LinkDoc(_Doc):
    speed_gts: float
    width: int
    max_speed_gts: float
    max_width: int
    slot_speed_gts: float | None = None  # the port above it: the slot's maximum
    slot_width: int | None = None


class _PciDoc(_Doc, rename={"class_code": "class"}):
    address: str
    root: str
    bridges: tuple[str, ...] = ()
    vendor: str | None = None
    device: str | None = None
    class_code: str | None = None
    numa: int | None = None
    driver: str | None = None
    local_cpus: str | None = None
    link: _LinkDoc | None = None


class _GpuDoc(_Doc, kw_only=True, rename={"address": "pci", "pci": "pci_device"}):
    index: int
    address: str | None = None  # derived, as are numa and pcie_root: pci's
    numa: int | None = None
    pcie_root: str | None = None
    uuid: str | None = None
    name: str | None = None
    pci: _PciDoc
    nvlinks: NvLinks | None = None


class _GidDoc(_Doc, rename={"raw": "gid"}):
    index: int
    raw: str
    type: GidType | None = None
    netdev: str | None = None
    ip: str | None = None  # derived from raw
    attrs_error: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            _ = Gid(self.index, self.raw).address
        except ValueError:
            raise ValueError(f".gid: not a GID: {self.raw!r}") from None


class _PortDoc(_Doc, rename={"number": "port"}):
    number: int
    state: str  # PortState's name
    phys_state: str  # PhysState's name
    link_layer: LinkLayer
    rate_gbps: float | None = None
    rate: str | None = None
    lid: int | None = None
    sm_lid: int | None = None
    netdev: str | None = None
    gid_table_len: int | None = None
    umad: str | None = None
    issm: str | None = None
    gids: tuple[_GidDoc, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, enum in (("state", PortState), ("phys_state", PhysState)):
            value = getattr(self, key)
            if value not in enum.__members__:
                choices = ", ".join(enum.__members__)
                raise ValueError(f".{key}: {value!r} is not one of {choices}")


class _HcaDoc(_Doc, rename={"address": "pci", "pci": "pci_device"}):
    name: str
    address: str | None = None  # derived, as are numa and pcie_root: pci's
    numa: int | None = None
    pcie_root: str | None = None
    pci: _PciDoc | None = None
    data_direct: _PciDoc | None = None  # ConnectX-8's Data Direct function
    node_type: str | None = None
    node_guid: str | None = None
    sys_image_guid: str | None = None
    fw_ver: str | None = None
    hca_type: str | None = None
    board_id: str | None = None
    uverbs: str | None = None
    parent_netdev: str | None = None
    ports: tuple[_PortDoc, ...] = ()


class _NetdevDoc(_Doc):
    name: str
    kind: NetdevKind
    pci: str | None = None
    mac: str | None = None
    mtu: int | None = None
    operstate: str | None = None
    speed_mbps: int | None = None
    master: str | None = None
    lower: tuple[str, ...] = ()
    dev_port: int | None = None


class _WarningDoc(_Doc):
    path: str
    message: str


class _Document(_Doc):
    schema: str
    hostname: str | None = None
    source: str | None = None
    netns_mode: NetnsMode = NetnsMode.UNKNOWN  # documents written before the mode was known
    numa_nodes: tuple[_NumaDoc, ...] = ()
    gpus: tuple[_GpuDoc, ...] = ()
    hcas: tuple[_HcaDoc, ...] = ()
    netdevs: tuple[_NetdevDoc, ...] = ()
    relations: dict[str, Any] = {}  # derived, not read
    warnings: tuple[_WarningDoc, ...] = ()


class _Head(msgspec.Struct):
    schema: Any = None


_SHARED: dict[tuple[type, type], tuple[str, ...]] = {}


def _shared(model: type, doc: type) -> tuple[str, ...]:
    """The fields a model dataclass and its document struct share (worked out once)."""
    found = _SHARED.get((model, doc))
    if found is None:
        names = getattr(doc, "__struct_fields__", ())
        found = _SHARED[model, doc] = tuple(f.name for f in fields(model) if f.name in names)
    return found


def _doc(obj: Any, kind: type[Any], **given: Any) -> Any:
    """`kind` (a `_Doc`) from a model object, field by field, `given` where they differ."""
    return kind(**{n: getattr(obj, n) for n in _shared(type(obj), kind)} | given)


def _model(doc: _Doc, kind: type[M], **given: Any) -> M:
    """The model dataclass `kind` from its document struct, field by field."""
    return kind(**{n: getattr(doc, n) for n in _shared(kind, type(doc))} | given)


# ---------------------------------------------------------------- writing


def to_document(topo: NodeTopology) -> dict[str, Any]:
    doc = _doc(
        topo,
        _Document,
        schema=SCHEMA,
        numa_nodes=[_doc(n, _NumaDoc, cpus=format_cpulist(n.cpus)) for n in topo.numa_nodes],
        gpus=[_gpu_doc(g) for g in topo.gpus],
        hcas=[_hca_doc(h) for h in topo.hcas],
        netdevs=[_doc(n, _NetdevDoc) for n in topo.netdevs],
        relations=relations(topo),
        warnings=[_doc(w, _WarningDoc) for w in topo.warnings],
    )
    out: dict[str, Any] = msgspec.to_builtins(
        doc,
    )
    for gpu in out["gpus"]:
        if gpu["nvlinks"] is None:  # known only from NVML: absent, not "none"
            del gpu["nvlinks"]
    return out


def _gpu_doc(g: Gpu) -> _GpuDoc:
    pci = _pci_doc(g.pci)
    links = dict(g.nvlinks) if g.nvlinks is not None else None
    where = {"address": g.pci.address, "numa": g.pci.numa, "pcie_root": g.pci.root}
    return _doc(g, _GpuDoc, pci=pci, nvlinks=links, **where)  # type: ignore[no-any-return]


def _hca_doc(h: Hca) -> _HcaDoc:
    return _doc(  # type: ignore[no-any-return]
        h,
        _HcaDoc,
        address=h.pci.address if h.pci else None,
        numa=h.numa,
        pcie_root=h.pcie_root,
        pci=_pci_doc(h.pci) if h.pci else None,
        data_direct=_pci_doc(h.data_direct) if h.data_direct else None,
        ports=[_port_doc(p) for p in h.ports],
    )


def _pci_doc(p: PciDevice) -> _PciDoc:
    link = _doc(p.link, _LinkDoc) if p.link else None
    return _doc(p, _PciDoc, link=link)  # type: ignore[no-any-return]


def _port_doc(p: Port) -> _PortDoc:
    gids = [_doc(g, _GidDoc, ip=g.ip) for g in p.gids]
    return _doc(p, _PortDoc, state=p.state.name, phys_state=p.phys_state.name, gids=gids)  # type: ignore[no-any-return]


# ---------------------------------------------------------------- reading back


def from_document(doc: Any, *, where: str = "document") -> NodeTopology:
    """The model from a v1 document; DocumentError names the first bad field."""
    try:
        schema = convert(doc, _Head).schema
        if schema != SCHEMA:
            said = f"{schema!r}" if isinstance(schema, str) else what_it_is(schema)
            raise DocumentError(
                f"{where}: schema: expected {SCHEMA!r} (a node document, `rdmaplane inspect "
                f"-o json`), got {said}"
            )
        read = convert(doc, _Document)
    except DecodeError as e:
        raise DocumentError(f"{where}: {e}" if e.path else f"{where}: top level: {e}") from None
    return _Reader(where).topology(read)


class _Reader:
    """The model from a checked document; values no machine has (a NUMA node id past the
    kernel's limit, a line rate no port runs at) are left out with a warning, as the sysfs
    reader does."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.warnings: list[ReadWarning] = []

    def topology(self, d: _Document) -> NodeTopology:
        ids = [
            self.numa(n.id, f"numa_nodes[{i}].id", required=True)
            for i, n in enumerate(d.numa_nodes)
        ]
        return NodeTopology(
            hostname=d.hostname,
            numa_nodes=tuple(
                self.numa_node(n, i) for i, n in enumerate(d.numa_nodes) if ids[i] is not None
            ),
            gpus=tuple(self.gpu(g, f"gpus[{i}]") for i, g in enumerate(d.gpus)),
            hcas=tuple(
                sorted(
                    (self.hca(h, f"hcas[{i}]") for i, h in enumerate(d.hcas)),
                    key=lambda h: natural_key(h.name),
                )
            ),
            netdevs=tuple(_model(n, Netdev) for n in d.netdevs),
            warnings=(*(_model(w, ReadWarning) for w in d.warnings), *self.warnings),
            source=d.source or self.where,
            netns_mode=d.netns_mode,
        )

    def numa_node(self, n: _NumaDoc, i: int) -> NumaNode:
        try:
            cpus = parse_cpulist(n.cpus or "")
        except ValueError:
            raise DocumentError(
                f"{self.where}: numa_nodes[{i}].cpus: not a CPU list: {n.cpus!r}"
            ) from None
        return _model(n, NumaNode, cpus=cpus)

    def pci(self, p: _PciDoc, at: str) -> PciDevice:
        link = self.link(p.link, f"{at}.link") if p.link else None
        return _model(p, PciDevice, numa=self.numa(p.numa, f"{at}.numa"), link=link)

    def link(self, d: _LinkDoc, at: str) -> PcieLink | None:
        """A PCIe link; one with a speed or width no link has is left out with a warning."""
        for key in ("speed_gts", "max_speed_gts", "slot_speed_gts"):
            speed = getattr(d, key)
            if speed is not None and not 0 < speed <= MAX_PCIE_GTS:
                self.absurd(
                    f"{at}.{key}", speed, f"is no PCIe link speed (up to {MAX_PCIE_GTS:g} GT/s)"
                )
                return None
        for key in ("width", "max_width", "slot_width"):
            width = getattr(d, key)
            if width is not None and not 0 <= width <= MAX_PCIE_WIDTH:
                self.absurd(
                    f"{at}.{key}", width, f"is no PCIe link width (x0 to x{MAX_PCIE_WIDTH})"
                )
                return None
        return _model(d, PcieLink)

    def gpu(self, g: _GpuDoc, at: str) -> Gpu:
        links = tuple(sorted(g.nvlinks.items())) if g.nvlinks is not None else None
        return _model(g, Gpu, pci=self.pci(g.pci, f"{at}.pci_device"), nvlinks=links)

    def hca(self, h: _HcaDoc, at: str) -> Hca:
        pci = self.pci(h.pci, f"{at}.pci_device") if h.pci else None
        dma = self.pci(h.data_direct, f"{at}.data_direct") if h.data_direct else None
        ports = tuple(self.port(p, f"{at}.ports[{i}]") for i, p in enumerate(h.ports))
        return _model(h, Hca, pci=pci, data_direct=dma, ports=ports)

    def port(self, p: _PortDoc, at: str) -> Port:
        return _model(
            p,
            Port,
            state=PortState[p.state],
            phys_state=PhysState[p.phys_state],
            rate_gbps=self.rate(p.rate_gbps, f"{at}.rate_gbps"),
            gids=tuple(_model(g, Gid) for g in p.gids),
            gid_table_len=p.gid_table_len or 0,
        )

    def numa(self, value: int | None, at: str, required: bool = False) -> int | None:
        """A NUMA node id (-1 or null: unknown, where the field may be unknown)."""
        if value is None or (value == -1 and not required):
            return None
        if not 0 <= value < MAX_NUMA_NODES:
            self.absurd(at, value, f"is no NUMA node (below {MAX_NUMA_NODES})")
            return None
        return value

    def rate(self, value: float | None, at: str) -> float | None:
        if value is not None and not 0 < value <= MAX_RATE_GBPS:
            self.absurd(at, value, f"is no line rate (above 0, at most {MAX_RATE_GBPS:g} Gb/s)")
            return None
        return value

    def absurd(self, at: str, value: object, why: str) -> None:
        self.warnings.append(ReadWarning(self.where, f"{at}: {value!r} {why}; left out"))
