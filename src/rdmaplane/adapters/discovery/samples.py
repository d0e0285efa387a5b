"""Bundled sample nodes: compact YAML specs materialised into sysfs trees.

One builder serves `--sample NAME`, `make demo` and the tests, so the tests read the same kind
of tree the kernel makes (relative symlinks from `class/` and `bus/` into `devices/`, full-form
GIDs, per-port GID tables with empty entries) rather than the code's own assumptions.

Spec shorthand: a PCI path `17:01.0/18:00.0/1a:00.0` means `pci0000:17/0000:17:01.0/…`, root
complex first, endpoint last; `roots` maps each root complex to its NUMA node (-1 = unknown).
NICs and GPUs get PCIe link files at their model's maximum (`PCIE_LINKS`), unless
`pcie: {speed, width}` says the link trained short. `netns_mode` is what ib_core's parameter
reads (`shared`, default; `exclusive`; `none`: a kernel without the parameter); an HCA with
`netns: pod` was moved into a pod's network namespace (by an RDMA CNI, exclusive mode): only
its verbs device shows on the node. An HCA with `data_direct: PATH` (ConnectX-8) has a Data
Direct function there (Mellanox 0x2100, bound to mlx5_ib), tied to it as the kernel ties
them: both functions' VPD carry the card's `vuid` in the read-only keyword `VU`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import posixpath
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rdmaplane.adapters.discovery import vpd
from rdmaplane.adapters.discovery.sysfs import IB_CORE, NETNS_PARAMETER, SIDECAR, read_node
from rdmaplane.adapters.discovery.tree import MemoryTree
from rdmaplane.core.counters import HW, PMA, PORT_COUNTERS
from rdmaplane.core.errors import InputError
from rdmaplane.core.model import DATA_DIRECT_DEVICE, NodeTopology

CARDS: dict[str, dict[str, str]] = {
    "cx7": {
        "device": "0x1021",
        "hca_type": "MT4129",
        "board_id": "MT_0000000838",
        "fw": "28.39.2048",
    },
    "cx6dx": {
        "device": "0x101d",
        "hca_type": "MT4125",
        "board_id": "MT_0000000359",
        "fw": "22.38.1002",
    },
    "cx6": {
        "device": "0x101b",
        "hca_type": "MT4123",
        "board_id": "MT_0000000223",
        "fw": "20.37.1014",
    },
    "cx-vf": {  # ConnectX-6 Dx / ConnectX-7 SR-IOV virtual function
        "device": "0x101e",
        "hca_type": "MT4126",
        "board_id": "MT_0000000359",
        "fw": "22.38.1002",
    },
    "cx8": {  # ConnectX-8 SuperNIC: device id from mlx5_core's table, firmware as NVIDIA ships it
        "device": "0x1023",
        "hca_type": "MT4131",
        "board_id": "MT_0000001100",
        "fw": "40.44.1036",
    },
    "bf3": {  # BlueField-3's integrated ConnectX-7
        "device": "0xa2dc",
        "hca_type": "MT41692",
        "board_id": "MT_0000000884",
        "fw": "32.44.1036",
    },
    "cx5": {
        "device": "0x1017",
        "hca_type": "MT4119",
        "board_id": "MT_0000000080",
        "fw": "16.35.2000",
    },
}
# PCIe link maxima (GT/s, lanes) by (vendor, device): the NICs and GPUs the samples hold. A
# function without an entry (NVMe, NVSwitch, another vendor's NIC, a VF) gets no link files.
PCIE_LINKS: dict[tuple[str, str], tuple[float, int]] = {
    ("0x15b3", "0x1021"): (32.0, 16),  # ConnectX-7: PCIe 5.0 x16
    ("0x15b3", "0x101d"): (16.0, 16),  # ConnectX-6 Dx: PCIe 4.0 x16
    ("0x15b3", "0x101b"): (16.0, 16),  # ConnectX-6
    ("0x15b3", "0x1017"): (8.0, 16),  # ConnectX-5: PCIe 3.0 x16
    ("0x10de", "0x2330"): (32.0, 16),  # H100 SXM5
    ("0x10de", "0x2335"): (32.0, 16),  # H200 SXM
    ("0x10de", "0x20b0"): (16.0, 16),  # A100 SXM4
    ("0x10de", "0x20b5"): (16.0, 16),  # A100 80GB PCIe
    ("0x10de", "0x26b9"): (16.0, 16),  # L40S
    ("0x10de", "0x26b1"): (16.0, 16),  # RTX 6000 Ada
}
PORT_STATES = {"DOWN": "1: DOWN", "INIT": "2: INIT", "ARMED": "3: ARMED", "ACTIVE": "4: ACTIVE"}
PHYS_STATES = {"Polling": "2: Polling", "Disabled": "3: Disabled", "LinkUp": "5: LinkUp"}
GID_TYPES = {"v1": "IB/RoCE v1", "v2": "RoCE v2"}
NETNS_MODES = {"shared": "Y", "exclusive": "N", "none": None}
# Every counter file the kernel shows (`rdmaplane.core.counters`), 0 unless the spec says otherwise;
# hw_counters device-wide, and none on InfiniBand ports.
COUNTERS = [c.name for c in PORT_COUNTERS if c.directory == PMA]
HW_COUNTERS = [c.name for c in PORT_COUNTERS if c.directory == HW]


# The specs are our own package data: libyaml's parser when PyYAML has it (several times faster
# than the pure-Python one, which untrusted documents keep: see rdmaplane.adapters.documents).
_SPEC_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SampleError(InputError):
    """A sample name that does not exist or a spec that does not hold together."""


@dataclass(frozen=True)
class Sample:
    name: str
    description: str
    spec: dict[str, Any]


def _spec_files() -> dict[str, Any]:
    folder = resources.files("rdmaplane.adapters.discovery") / "sample_nodes"
    return {p.name[: -len(".yaml")]: p for p in folder.iterdir() if p.name.endswith(".yaml")}


def names() -> list[str]:
    return sorted(_spec_files())


def load(name: str) -> Sample:
    files = _spec_files()
    if name not in files:
        raise SampleError(f"no sample named {name!r}; samples: {', '.join(sorted(files))}")
    spec = yaml.load(files[name].read_text(), Loader=_SPEC_LOADER)
    return Sample(name=name, description=" ".join(spec.get("description", "").split()), spec=spec)


def all_samples() -> list[Sample]:
    return [load(n) for n in names()]


@contextmanager
def materialised(name: str) -> Iterator[Path]:
    """A temporary sysfs tree of the sample on disk, removed afterwards."""
    tree = sample_tree(name)  # a name that is no sample fails here, before any path is made
    scratch = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # thousands of tiny files
    with tempfile.TemporaryDirectory(prefix="rdmaplane-sample-", dir=scratch) as tmp:
        root = Path(tmp) / "sys"
        write_tree(tree, root)
        yield root


def materialise(name: str, dest: Path) -> None:
    """Lay the sample's sysfs tree out at `dest` (missing, or an empty directory), for
    `--sysfs-root` and for editing by hand."""
    tree = sample_tree(name)
    if dest.is_dir() and any(dest.iterdir()):
        raise SampleError(f"{dest}: not empty; give a new or empty directory")
    if dest.exists() and not dest.is_dir():
        raise SampleError(f"{dest}: exists and is not a directory")
    if not dest.parent.is_dir():
        raise SampleError(f"{dest}: its directory {dest.parent} does not exist")
    write_tree(tree, dest)


def read_sample(name: str) -> NodeTopology:
    """The sample read through the real sysfs reader, from its tree in memory."""
    return read_node(sample_tree(name))


def sample_tree(name: str) -> MemoryTree:
    """The sysfs tree of a bundled sample, in memory (`source` reads `sample:NAME`)."""
    tree = MemoryTree(f"sample:{name}")
    _Builder(load(name).spec, tree).build()
    return tree


# ---------------------------------------------------------------- the builder


def build(spec: dict[str, Any], root: Path) -> None:
    """Write the sysfs tree that `spec` describes below `root` (missing or empty)."""
    tree = MemoryTree(str(root))
    _Builder(spec, tree).build()
    write_tree(tree, root)


def write_tree(tree: MemoryTree, root: Path) -> None:
    """Lay a tree in memory out on disk below `root` (missing or empty)."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, value in tree.items():
        path = root / rel
        if value is None:
            path.mkdir(exist_ok=True)
        elif isinstance(value, str):
            path.symlink_to(value)
        else:
            path.write_bytes(value)


def expand_path(short: str) -> tuple[str, list[str]]:
    """`17:01.0/18:00.0` → (`pci0000:17`, [`0000:17:01.0`, `0000:18:00.0`])."""
    parts = [p if p.count(":") == 2 else f"0000:{p}" for p in short.split("/")]
    domain, bus = parts[0].split(":")[:2]
    return f"pci{domain}:{bus}", parts


def link_local_gid(mac: str) -> str:
    """fe80::/64 with the EUI-64 interface id the kernel derives from a MAC address."""
    b = bytearray(int(x, 16) for x in mac.split(":"))
    b[0] ^= 0x02
    eui = bytes(b[:3]) + b"\xff\xfe" + bytes(b[3:])
    return full_gid(ipaddress.IPv6Address(b"\xfe\x80" + bytes(6) + eui))


def full_gid(addr: ipaddress.IPv6Address) -> str:
    h = addr.packed.hex()
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def ip_gid(ip: str) -> str:
    a = ipaddress.ip_address(ip.split("/")[0])
    if isinstance(a, ipaddress.IPv4Address):
        return full_gid(ipaddress.IPv6Address(b"\x00" * 10 + b"\xff\xff" + a.packed))
    return full_gid(a)


class _Builder:
    def __init__(self, spec: dict[str, Any], tree: MemoryTree) -> None:
        self.spec = spec
        self.tree = tree
        self.roots: dict[str, int] = spec.get("roots", {})
        self.cpus: dict[int, str] = {n["id"]: n["cpus"] for n in spec.get("numa", [])}
        self.unreadable: dict[str, str] = {}
        self.uverbs = 0
        self.umad = 0

    # --- files
    def write(self, rel: str, content: str) -> None:
        self.tree.add_file(rel, (content if content.endswith("\n") else content + "\n").encode())

    def link(self, rel: str, target_rel: str) -> None:
        """A relative symlink at `rel` pointing to `target_rel` (both below the root)."""
        if self.tree.lexists(rel):
            return
        folder, _, name = target_rel.rpartition("/")
        here = rel.rpartition("/")[0]
        self.tree.add_link(rel, posixpath.join(posixpath.relpath(folder or ".", here or "."), name))

    # --- PCI
    def pci_function(
        self,
        short: str,
        vendor: str,
        device: str,
        cls: str,
        driver: str,
        pcie: dict[str, Any] | None = None,
    ) -> str:
        """Create the function's directory (and its bridges); returns its `devices/…` path.
        `pcie` ({speed, width}) is a link that trained short of its maximum."""
        root, parts = expand_path(short)
        if root not in self.roots:
            raise SampleError(f"PCI path {short}: root complex {root} missing from 'roots'")
        numa = self.roots[root]
        rel = f"devices/{root}"
        limits = PCIE_LINKS.get((vendor, device))
        for i, addr in enumerate(parts):
            rel = f"{rel}/{addr}"
            last = i == len(parts) - 1
            if limits is not None and i >= len(parts) - 2:  # the function and its slot's port
                self.pcie_link(rel, limits, pcie or {})
            self.write(f"{rel}/vendor", vendor if last else "0x8086")
            self.write(f"{rel}/device", device if last else "0x1234")
            self.write(f"{rel}/class", cls if last else "0x060400")
            self.write(f"{rel}/numa_node", str(numa))
            self.write(f"{rel}/local_cpulist", self.cpus.get(numa, ",".join(self.cpus.values())))
            drv = driver if last else "pcieport"
            self.link(f"{rel}/driver", f"bus/pci/drivers/{drv}")
            self.link(f"bus/pci/devices/{addr}", rel)
        return rel

    def pcie_link(self, rel: str, limits: tuple[float, int], short: dict[str, Any]) -> None:
        """The link files of a function or of the port above it (the same link, seen from
        both ends), as `lspci`'s kernel writes them: `16.0 GT/s PCIe`, `16`."""
        speed, width = float(short.get("speed", limits[0])), int(short.get("width", limits[1]))
        for name, value in (
            ("current_link_speed", f"{speed:.1f} GT/s PCIe"),
            ("current_link_width", str(width)),
            ("max_link_speed", f"{limits[0]:.1f} GT/s PCIe"),
            ("max_link_width", str(limits[1])),
        ):
            self.write(f"{rel}/{name}", value)

    # --- whole node
    def build(self) -> None:
        for node in self.spec.get("numa", []):
            base = f"devices/system/node/node{node['id']}"
            self.write(f"{base}/cpulist", node["cpus"])
            self.write(f"{base}/distance", " ".join(str(d) for d in node["distances"]))
        gpus: dict[str, dict[str, str]] = {}
        for i, gpu in enumerate(self.spec.get("gpus", [])):
            rel = self.pci_function(
                gpu["path"],
                "0x10de",
                gpu.get("device", "0x2330"),
                gpu.get("class", "0x030200"),
                "nvidia",
                gpu.get("pcie"),
            )
            gpus[rel.rsplit("/", 1)[1]] = {
                "uuid": gpu.get("uuid") or self.gpu_uuid(i),
                "name": gpu.get("name", "NVIDIA GPU"),
            }
        for dev in self.spec.get("pci", []):
            self.pci_function(
                dev["path"],
                dev["vendor"],
                dev.get("device", "0x0001"),
                dev["class"],
                dev.get("driver", "unknown"),
            )
        for nd in self.spec.get("netdevs", []):
            self.netdev(nd)
        for hca in self.spec.get("hcas", []):
            self.hca(hca)
        self.netns_mode(self.spec.get("netns_mode", "shared"))
        self.write("class/infiniband_verbs/abi_version", "6")
        self.write("class/infiniband_mad/abi_version", "5")
        sidecar = {"hostname": self.spec.get("hostname"), "gpus": gpus}
        if self.unreadable:
            sidecar["unreadable"] = self.unreadable
        self.write(SIDECAR, json.dumps(sidecar, indent=1, sort_keys=True))

    def netns_mode(self, mode: str) -> None:
        if mode not in NETNS_MODES:
            raise SampleError(f"netns_mode {mode!r}: one of {', '.join(NETNS_MODES)}")
        value = NETNS_MODES[mode]
        if value is None:
            self.write(f"{IB_CORE}/refcnt", "12")  # a module without the parameter
        else:
            self.write(NETNS_PARAMETER, value)

    def gpu_uuid(self, i: int) -> str:
        return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.spec.get('hostname')}/{i}"))

    # --- netdevs
    def netdev(self, nd: dict[str, Any]) -> None:
        name = nd["name"]
        if "pci" in nd:
            fn = self.pci_function(
                nd["pci"],
                nd.get("vendor", "0x15b3"),
                nd.get("device", "0x1021"),
                nd.get("class", "0x020000"),
                nd.get("driver", "mlx5_core"),
            )
            rel = f"{fn}/net/{name}"
            self.link(f"{rel}/device", fn)
        else:
            rel = f"devices/virtual/net/{name}"
        self.link(f"class/net/{name}", rel)
        self.write(f"{rel}/type", "32" if nd.get("kind") == "ipoib" else "1")
        self.write(f"{rel}/address", nd.get("mac", "00:00:00:00:00:00"))
        self.write(f"{rel}/mtu", str(nd.get("mtu", 9000 if "pci" in nd else 1500)))
        up = nd.get("up", True)
        self.write(f"{rel}/operstate", "up" if up else "down")
        self.write(f"{rel}/speed", str(nd.get("speed", 0) if up else -1))
        self.write(f"{rel}/dev_port", str(nd.get("dev_port", 0)))
        if nd.get("slaves"):
            self.write(f"{rel}/bonding/mode", "802.3ad 4")
            self.write(f"{rel}/bonding/slaves", " ".join(nd["slaves"]))
        for slave in nd.get("slaves", []):
            self.link(f"{rel}/lower_{slave}", f"class/net/{slave}")
        if "master" in nd:
            self.link(f"{rel}/master", f"devices/virtual/net/{nd['master']}")
        if "vlan_of" in nd:
            self.link(f"{rel}/lower_{nd['vlan_of']}", f"class/net/{nd['vlan_of']}")

    # --- HCAs
    def hca(self, h: dict[str, Any]) -> None:
        name = h["name"]
        card = CARDS[h.get("card", "cx7")]
        if "path" in h:
            fn = self.pci_function(
                h["path"],
                "0x15b3",
                card["device"],
                h.get("class", "0x020700" if h.get("ib") else "0x020000"),
                "mlx5_core",
                h.get("pcie"),
            )
            rel = f"{fn}/infiniband/{name}"
            self.link(f"{rel}/device", fn)
            if "data_direct" in h:
                self.data_direct(h, fn)
        else:  # software RDMA (rxe/siw) has no PCI function
            fn = None
            rel = f"devices/virtual/infiniband/{name}"
            self.write(f"{rel}/parent", h["parent"])
        verbs_rel = (
            f"{fn or 'devices/virtual/infiniband_verbs'}/infiniband_verbs/uverbs{self.uverbs}"
        )
        self.write(f"{verbs_rel}/ibdev", name)
        self.write(f"{verbs_rel}/dev", f"231:{192 + self.uverbs}")
        self.link(f"class/infiniband_verbs/uverbs{self.uverbs}", verbs_rel)
        self.uverbs += 1
        if h.get("netns") == "pod":  # moved into a pod's namespace: the node sees its verbs only
            return
        self.link(f"class/infiniband/{name}", rel)
        guid = h.get("guid", "b83f:d203:00a1:0000")
        self.write(f"{rel}/node_type", "1: CA")
        self.write(f"{rel}/node_guid", guid)
        self.write(f"{rel}/sys_image_guid", guid)
        if fn is None:  # ib_core's fw_ver, empty without a driver's; no mlx5 attributes
            self.write(f"{rel}/fw_ver", "")
        else:
            self.write(f"{rel}/fw_ver", h.get("fw", card["fw"]))
            self.write(f"{rel}/hca_type", h.get("hca_type", card["hca_type"]))
            self.write(f"{rel}/board_id", card["board_id"])
        for i, port in enumerate(h.get("ports", [])):
            self.port(name, rel, fn, i + 1, port, guid)

    def data_direct(self, h: dict[str, Any], fn: str) -> None:
        """The NIC's Data Direct function, and the card's VUID in both functions' VPD."""
        if "vuid" not in h:
            raise SampleError(f"HCA {h['name']}: data_direct needs the card's vuid")
        dd = self.pci_function(
            h["data_direct"], "0x15b3", DATA_DIRECT_DEVICE, "0x020700", "mlx5_ib"
        )
        image = vpd.encode("NVIDIA ConnectX-8 SuperNIC", {"SN": h["vuid"][-8:], "VU": h["vuid"]})
        for function in (fn, dd):
            self.tree.add_file(f"{function}/vpd", image)

    def port(
        self, hca: str, hca_rel: str, fn: str | None, number: int, p: dict[str, Any], guid: str
    ) -> None:
        rel = f"{hca_rel}/ports/{number}"
        ib = p.get("link_layer", "Ethernet") == "InfiniBand"
        state = p.get("state", "ACTIVE")
        self.write(f"{rel}/state", PORT_STATES[state])
        default_phys = "LinkUp" if state == "ACTIVE" else "Disabled"
        self.write(f"{rel}/phys_state", PHYS_STATES[p.get("phys_state", default_phys)])
        self.write(f"{rel}/rate", p.get("rate", "400 Gb/sec (4X NDR)"))
        self.write(f"{rel}/link_layer", "InfiniBand" if ib else "Ethernet")
        self.write(f"{rel}/lid", p.get("lid", "0x0"))
        self.write(f"{rel}/sm_lid", p.get("sm_lid", "0x0"))
        self.write(f"{rel}/cap_mask", "0x00010000")
        counters = p.get("counters", {})
        for c in COUNTERS:
            self.write(f"{rel}/counters/{c}", str(counters.get(c, 0)))
        for c in HW_COUNTERS if not ib else ():
            self.write(f"{hca_rel}/hw_counters/{c}", str(counters.get(c, 0)))
        table = p["gids"] if "gids" in p else self.gid_table(p, guid, ib)
        size = p.get("gid_tbl_len", 128 if ib else 255)
        self.gids(rel, table, size)
        for kind in ("umad", "issm") if fn is not None else ():
            if kind == "issm" and not ib:
                continue
            dev_rel = f"{fn}/infiniband_mad/{kind}{self.umad}"
            self.write(f"{dev_rel}/ibdev", hca)
            self.write(f"{dev_rel}/port", str(number))
            self.link(f"class/infiniband_mad/{kind}{self.umad}", dev_rel)
        if fn is not None:
            self.umad += 1

    def gid_table(self, p: dict[str, Any], guid: str, ib: bool) -> list[dict[str, Any]]:
        """The table the kernel builds: link-local v1/v2, then v1/v2 per address in the order
        addresses were added, for the port netdev and then each VLAN; IB: subnet prefix + GUID."""
        if ib:
            return [{"gid": "fe80:0000:0000:0000:" + guid, "type": "v1", "ndev": None}]
        table: list[dict[str, Any]] = []
        for netdev, addrs in [(p["netdev"], p.get("addresses", []))] + [
            (f"{p['netdev']}.{v['id']}", v.get("addresses", [])) for v in p.get("vlans", [])
        ]:
            for gid in [link_local_gid(p["mac"])] + [ip_gid(a) for a in addrs]:
                table += [{"gid": gid, "type": t, "ndev": netdev} for t in ("v1", "v2")]
        return table

    def gids(self, port_rel: str, table: list[dict[str, Any]], size: int) -> None:
        entries = {e.get("index", i): e for i, e in enumerate(table)}
        zero = ":".join(["0000"] * 8)
        for i in range(max(size, max(entries, default=0) + 1)):
            e = entries.get(i)
            gid = zero if e is None else (e["gid"] if "gid" in e else ip_gid(e["ip"]))
            self.write(f"{port_rel}/gids/{i}", gid)
            if e is None:
                continue
            for attr, value in (
                ("types", GID_TYPES.get(e.get("type", "v2"))),
                ("ndevs", e.get("ndev")),
            ):
                path = f"{port_rel}/gid_attrs/{attr}/{i}"
                if value is None or e.get("einval"):
                    self.write(path, "")
                    self.unreadable[self._class_path(path)] = "EINVAL"
                else:
                    self.write(path, value)

    def _class_path(self, devices_rel: str) -> str:
        """The reader addresses ports through `class/infiniband/<hca>/…`."""
        _head, _, tail = devices_rel.partition("/infiniband/")
        return f"class/infiniband/{tail}"
