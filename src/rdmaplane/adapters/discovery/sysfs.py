"""Read a node's GPUs, RDMA devices, ports, GIDs, netdevs, NUMA nodes and PCIe tree from sysfs.

The root is any tree laid out like `/sys`: a directory (the real one, a materialised sample),
or one in memory (`discovery.tree`: a snapshot's archive, a sample). The reader never raises
on bad content: a file that is missing, unreadable (EINVAL on empty GID attributes, EACCES),
garbage or absurd (a NUMA node no kernel numbers, an entry of class/infiniband that is no
RDMA device) becomes a `ReadWarning` naming the file, and the rest of the node is still read.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from rdmaplane.adapters.discovery import vpd
from rdmaplane.adapters.discovery.tree import DiskTree, SysfsTree
from rdmaplane.core import paths
from rdmaplane.core.model import (
    DATA_DIRECT_DEVICE,
    MAX_NUMA_NODES,
    MAX_PCIE_GTS,
    MAX_PCIE_WIDTH,
    MELLANOX_VENDOR,
    NVIDIA_VENDOR,
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
    parse_cpulist,
    parse_rate_gbps,
)
from rdmaplane.core.selectors import natural_key
from rdmaplane.core.untrusted import DocumentError, printable, what_it_is

SIDECAR = ".rdmaplane/node.json"  # facts sysfs lacks (hostname, GPU UUIDs), kept beside the tree
SIDECAR_MAX_BYTES = 8 << 20  # an 8-GPU node's is a few KiB; EINVAL lists of big nodes far less
VPD_MAX_BYTES = 32768  # the largest VPD the PCI format can address
IB_CORE = "module/ib_core"
# ib_core's bool parameter bound to the kernel's `ib_devices_shared_netns`: `Y` shared, `N`
# exclusive; it follows `rdma system set netns` at run time.
NETNS_PARAMETER = f"{IB_CORE}/parameters/netns_mode"

_ROOT_COMPLEX = re.compile(r"^pci[0-9a-f]{4,}:[0-9a-f]{2}$")
_BDF = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_GPU_CLASS_BYTES = (b"0x0300", b"0x0302")  # VGA and 3D controllers
_ZERO_GID = b"0000:0000:0000:0000:0000:0000:0000:0000\n"
_QUIET = (errno.ENOENT, errno.EINVAL, errno.ENODATA, errno.EOPNOTSUPP)

T = TypeVar("T")


class Recording:
    """What a read touched: file contents (or the errno reading failed with), listed directories
    and resolved links — exactly the subset a snapshot must carry to be read again."""

    def __init__(self) -> None:
        self.files: dict[str, bytes | int] = {}
        self.dirs: set[str] = set()
        self.links: set[str] = set()


class _Sysfs:
    """File access relative to a tree's root (on disk or in memory), collecting warnings
    instead of raising, and recording what was read when asked."""

    def __init__(self, tree: SysfsTree, recording: Recording | None = None) -> None:
        self.tree = tree
        self.warnings: list[ReadWarning] = []
        self.recorded_errors: dict[str, int] = {}
        self.recording = recording

    def warn(self, rel: str, message: str) -> None:
        self.warnings.append(ReadWarning(rel, message))

    def read(self, rel: str, limit: int = 65536) -> bytes:
        """Raw content (at most `limit` bytes); raises OSError, including the errors a snapshot
        recorded for `rel`."""
        try:
            if rel in self.recorded_errors:
                code = self.recorded_errors[rel]
                raise OSError(code, os.strerror(code))
            data = self.tree.read(rel, limit)
        except OSError as e:
            if self.recording is not None and e.errno is not None and e.errno != errno.ENOENT:
                self.recording.files[rel] = e.errno
            raise
        if self.recording is not None:
            self.recording.files[rel] = data
        return data

    def read_many(self, folder: str, names: list[str]) -> list[tuple[str, bytes | OSError]]:
        """`read` for many files of one directory, in one tight loop: a GID table is hundreds
        of files, and per-file bookkeeping is what the reader spends its time on."""
        recorded, recording = self.recorded_errors, self.recording
        out = list(zip(names, self.tree.read_many(folder, names), strict=True))
        if recorded:
            for i, (name, _) in enumerate(out):
                code = recorded.get(f"{folder}/{name}")
                if code is not None:
                    out[i] = (name, OSError(code, os.strerror(code)))
        if recording is not None:
            for name, data in out:
                if isinstance(data, bytes):
                    recording.files[f"{folder}/{name}"] = data
                elif data.errno not in (None, errno.ENOENT):
                    recording.files[f"{folder}/{name}"] = data.errno
        return out

    def close(self) -> None:
        self.tree.close()

    def text(self, rel: str, *, optional: bool = False) -> str | None:
        try:
            data = self.read(rel)
        except OSError as e:
            if not (optional and e.errno in _QUIET):
                self.warn(rel, e.strerror or type(e).__name__)
            return None
        try:
            return self.printable(rel, data.decode("utf-8").strip())
        except UnicodeDecodeError:
            self.warn(rel, "not UTF-8 text")
            return None

    def printable(self, rel: str, text: str) -> str:
        """`text` safe for a terminal; a snapshot is untrusted input, and no sysfs attribute
        holds escape sequences or line breaks, so one that does is junk worth a warning."""
        if text.isprintable():
            return text
        self.warn(rel, "control characters escaped")
        return printable(text)

    def parsed(self, rel: str, parse: Callable[[str], T], *, optional: bool = False) -> T | None:
        return self.parse(rel, self.text(rel, optional=optional), parse)

    def parse(self, rel: str, raw: str | None, parse: Callable[[str], T]) -> T | None:
        """`parse(raw)`, or None with a warning naming `rel` when the content is junk."""
        if raw is None:
            return None
        try:
            return parse(raw)
        except _Absurd as e:
            self.warn(rel, f"{raw[:60]!r} {e}; left out")
            return None
        except (ValueError, KeyError, IndexError):
            self.warn(rel, f"cannot parse {raw[:60]!r}")
            return None

    def listdir(self, rel: str, *, optional: bool = False) -> list[str]:
        try:
            names = sorted(self.tree.listdir(rel))
        except OSError as e:
            if not (optional and e.errno in _QUIET):
                self.warn(rel, e.strerror or type(e).__name__)
            return []
        if self.recording is not None:
            self.recording.dirs.add(rel)
        if all(n.isprintable() for n in names):
            return names
        for odd in (n for n in names if not n.isprintable()):
            self.warn(f"{rel}/{printable(odd)}", "name with control characters; left out")
        return [n for n in names if n.isprintable()]

    def entries(self, rel: str) -> list[str] | OSError:
        """A folder's names, or why it cannot be listed (no warning: the caller says what
        that means); a failed listing is recorded as the link or path that led to it."""
        try:
            names = sorted(self.tree.listdir(rel))
        except OSError as e:
            if self.recording is not None:
                self.recording.links.add(rel.rpartition("/")[0])
            return e
        if self.recording is not None:
            self.recording.dirs.add(rel)
        return [n for n in names if n.isprintable()]

    def has(self, rel: str) -> bool:
        """Whether `rel` exists; a directory that does is kept in a snapshot (empty)."""
        if self.recording is not None and self.tree.isdir(rel):
            self.recording.dirs.add(rel)
        return self.tree.lexists(rel)

    def resolve(self, rel: str) -> list[str] | None:
        """The link target as path parts below the root; None when it leaves the root."""
        if self.recording is not None:
            self.recording.links.add(rel)
        real = self.tree.realpath(rel)
        if real is None:
            self.warn(rel, "link points outside the sysfs root")
            return None
        return real.split("/") if real else []

    def link_name(self, rel: str) -> str | None:
        """Last component of a symlink's target (e.g. the driver of a PCI function). The kernel's
        links end in the name they point to, so no resolution is needed unless one does not."""
        try:
            target = self.tree.readlink(rel)
        except OSError:
            return None
        if self.recording is not None:
            self.recording.links.add(rel)
        name = os.path.basename(target.rstrip("/"))
        if name not in ("", ".", ".."):
            return name
        real = self.tree.realpath(rel)
        return os.path.basename(real) if real else None


def read_node(
    root: str | SysfsTree = paths.SYSFS,
    *,
    hostname: str | None = None,
    gpu_info: dict[str, dict[str, Any]] | None = None,
    recording: Recording | None = None,
    netlink: Callable[[], NetnsMode | None] | None = None,
) -> NodeTopology:
    """Read and model the node whose sysfs is at `root`.

    `gpu_info` (PCI address → uuid, name, nvlinks; from NVML on a live node) overrides the
    sidecar that snapshots and samples carry; `netlink` (a live node's RDMA netlink, asked only
    when the tree cannot tell the netns mode); `recording` collects what was read.
    """
    tree = DiskTree(root) if isinstance(root, str) else root
    fs = _Sysfs(tree, recording)
    pci_cache: dict[str, PciDevice | None] = {}

    def pci(address: str) -> PciDevice | None:
        if address not in pci_cache:
            pci_cache[address] = _read_pci(fs, address)
        return pci_cache[address]

    try:
        sidecar = _read_sidecar(fs)
        if gpu_info:
            sidecar["gpus"] = gpu_info
        fs.recorded_errors = _recorded_errors(fs, sidecar.get("unreadable"))
        numa = _read_numa(fs)
        netdevs = _read_netdevs(fs)
        hcas = _read_hcas(fs, pci, netdevs, _read_data_direct(fs, pci))
        gpus = _read_gpus(fs, pci, _sidecar_map(fs, sidecar, "gpus"))
        netns_mode = _read_netns_mode(fs, netlink)
    finally:
        fs.close()
    return NodeTopology(
        hostname=_sidecar_text(fs, sidecar, "hostname") or hostname,
        numa_nodes=numa,
        gpus=gpus,
        hcas=hcas,
        netdevs=tuple(netdevs.values()),
        warnings=tuple(fs.warnings),
        source=tree.name,
        netns_mode=netns_mode,
    )


def _read_sidecar(fs: _Sysfs) -> dict[str, object]:
    """The sidecar as a mapping (empty when there is none); a broken one is a warning, since
    the tree beside it may still be good."""
    from rdmaplane.adapters.documents import decode, parse_document  # YAML: only snapshots have one

    try:
        raw = fs.read(SIDECAR, limit=SIDECAR_MAX_BYTES + 1)
    except OSError as e:
        if e.errno not in _QUIET:
            fs.warn(SIDECAR, e.strerror or type(e).__name__)
        return {}
    try:
        if len(raw) > SIDECAR_MAX_BYTES:
            raise DocumentError(f"{SIDECAR}: larger than {SIDECAR_MAX_BYTES} bytes")
        data = parse_document(decode(raw, SIDECAR), SIDECAR)
    except DocumentError as e:
        fs.warn(SIDECAR, str(e).removeprefix(f"{SIDECAR}: "))
        return {}
    if not isinstance(data, dict):
        fs.warn(SIDECAR, "not a JSON object")
        return {}
    return data


def _recorded_errors(fs: _Sysfs, entries: object) -> dict[str, int]:
    """Files a snapshot could not read on the node (`{"path": "EINVAL"}`): regular files cannot
    fail like sysfs attributes do, so the sidecar carries the errno and reads replay it."""
    if entries is None:
        return {}
    if not isinstance(entries, dict):
        fs.warn(SIDECAR, "'unreadable' is not an object")
        return {}
    out = {}
    for rel, name in entries.items():
        code = getattr(errno, str(name), None)
        if isinstance(code, int):
            out[str(rel)] = code
        else:
            fs.warn(SIDECAR, f"unknown errno {name!r} for {rel}")
    return out


# ---------------------------------------------------------------- RDMA netns mode


# A bool parameter as the kernel prints it (`Y`/`N`), or as written by hand (`1`/`0`).
_NETNS_VALUES = {
    "Y": NetnsMode.SHARED,
    "1": NetnsMode.SHARED,
    "N": NetnsMode.EXCLUSIVE,
    "0": NetnsMode.EXCLUSIVE,
}


def _read_netns_mode(fs: _Sysfs, netlink: Callable[[], NetnsMode | None] | None) -> NetnsMode:
    """ib_core's `netns_mode` parameter; where it is unreadable or missing, the RDMA netlink
    answer of a live node; then an ib_core without the parameter is an older kernel, which has
    no exclusive mode. Junk in the parameter is a warning naming the file, and the mode unknown.
    """
    present = fs.has(NETNS_PARAMETER)
    if present and (mode := fs.parsed(NETNS_PARAMETER, _NETNS_VALUES.__getitem__)) is not None:
        return mode
    if netlink is not None and (asked := netlink()) is not None:
        return asked
    if present or not fs.has(IB_CORE):
        return NetnsMode.UNKNOWN
    return NetnsMode.SHARED


def hcas_in_other_namespaces(root: str) -> list[str]:
    """HCAs this network namespace does not see: named by a verbs device
    (`class/infiniband_verbs` is not namespaced) but missing from `class/infiniband` (which
    is). In exclusive mode these are devices an RDMA CNI moved into pods."""
    fs = _Sysfs(DiskTree(root))
    try:
        seen = set(fs.listdir("class/infiniband", optional=True))
        verbs = _read_char_devices(fs, "class/infiniband_verbs", ["uverbs"])
    finally:
        fs.close()
    return sorted({ibdev for ibdev, _ in verbs.values()} - seen)


# ---------------------------------------------------------------- NUMA


def _parse_distances(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split())


def _read_numa(fs: _Sysfs) -> tuple[NumaNode, ...]:
    base = "devices/system/node"
    nodes = []
    for name in fs.listdir(base, optional=True):
        if not (name.startswith("node") and name[4:].isdigit()):
            continue
        if int(name[4:]) >= MAX_NUMA_NODES:
            fs.warn(f"{base}/{name}", f"is no NUMA node (below {MAX_NUMA_NODES}); left out")
            continue
        rel = f"{base}/{name}"
        nodes.append(
            NumaNode(
                id=int(name[4:]),
                cpus=fs.parsed(f"{rel}/cpulist", parse_cpulist) or (),
                distances=fs.parsed(f"{rel}/distance", _parse_distances) or (),
            )
        )
    return tuple(sorted(nodes, key=lambda n: n.id))


# ---------------------------------------------------------------- PCI


def split_pci_path(parts: list[str]) -> tuple[str, tuple[str, ...]] | None:
    """From a resolved device path (`devices/pci0000:17/0000:17:01.0/…/0000:1a:00.0`), the root
    complex and the bridges above the function. Works below VMBus/ACPI parents too (Azure puts
    the root complex deep below `devices/LNXSYSTM:00/…`)."""
    roots = [i for i, p in enumerate(parts[:-1]) if _ROOT_COMPLEX.match(p)]
    if not roots or not _BDF.match(parts[-1]):
        return None
    r = roots[-1]
    bridges = tuple(parts[r + 1 : -1])
    if not all(_BDF.match(b) for b in bridges):
        return None
    return parts[r], bridges


class _Absurd(ValueError):
    """A value that parses but no kernel writes (the message says why)."""


def _parse_numa(text: str) -> int | None:
    n = int(text)
    if not -1 <= n < MAX_NUMA_NODES:
        raise _Absurd(f"is no NUMA node (the kernel numbers them below {MAX_NUMA_NODES})")
    return None if n == -1 else n


def _read_pci(fs: _Sysfs, address: str) -> PciDevice | None:
    rel = f"bus/pci/devices/{address}"
    parts = fs.resolve(rel)
    if parts is None:
        return None
    split = split_pci_path(parts)
    if split is None:
        fs.warn(rel, f"not a PCI function path: {'/'.join(parts)}")
        return None
    root, bridges = split
    return PciDevice(
        address=address,
        root=root,
        bridges=bridges,
        vendor=fs.text(f"{rel}/vendor"),
        device=fs.text(f"{rel}/device", optional=True),
        class_code=fs.text(f"{rel}/class", optional=True),
        numa=fs.parsed(f"{rel}/numa_node", _parse_numa, optional=True),
        driver=fs.link_name(f"{rel}/driver"),
        local_cpus=fs.text(f"{rel}/local_cpulist", optional=True),
        link=_read_link(fs, rel, bridges[-1] if bridges else None),
    )


def _read_link(fs: _Sysfs, rel: str, upstream: str | None) -> PcieLink | None:
    """The function's PCIe link, and the maximum of the port above it (its slot); None where
    the kernel shows no link (a function on the root complex's own bus, a virtual function)."""
    speed = fs.parsed(f"{rel}/current_link_speed", _parse_link_speed, optional=True)
    width = fs.parsed(f"{rel}/current_link_width", _parse_link_width, optional=True)
    max_speed = fs.parsed(f"{rel}/max_link_speed", _parse_link_speed, optional=True)
    max_width = fs.parsed(f"{rel}/max_link_width", _parse_link_width, optional=True)
    if speed is None or width is None or max_speed is None or max_width is None:
        return None
    slot = f"bus/pci/devices/{upstream}" if upstream else None
    return PcieLink(
        speed,
        width,
        max_speed,
        max_width,
        fs.parsed(f"{slot}/max_link_speed", _parse_link_speed, optional=True) if slot else None,
        fs.parsed(f"{slot}/max_link_width", _parse_link_width, optional=True) if slot else None,
    )


def _parse_link_speed(text: str) -> float | None:
    """`16.0 GT/s PCIe` (older kernels: `8 GT/s`) → 16.0; `Unknown` (no link) → None."""
    if text.startswith("Unknown"):
        return None
    number, unit = text.split()[:2]
    if unit != "GT/s":
        raise ValueError(text)
    value = float(number)
    if not 0 < value <= MAX_PCIE_GTS:
        raise _Absurd(f"is no PCIe link speed (up to {MAX_PCIE_GTS:g} GT/s)")
    return value


def _parse_link_width(text: str) -> int:
    value = int(text)
    if not 0 <= value <= MAX_PCIE_WIDTH:
        raise _Absurd(f"is no PCIe link width (x0 to x{MAX_PCIE_WIDTH})")
    return value


def _read_gpus(
    fs: _Sysfs, pci: Callable[[str], PciDevice | None], known: dict[str, object]
) -> tuple[Gpu, ...]:
    found = []
    base = "bus/pci/devices"
    addresses = fs.listdir(base, optional=True)
    classes = fs.read_many(base, [f"{a}/class" for a in addresses])  # hundreds on a big server
    for address, (_, cls) in zip(addresses, classes, strict=True):
        if isinstance(cls, OSError) or not cls.startswith(_GPU_CLASS_BYTES):
            continue
        if fs.text(f"{base}/{address}/vendor", optional=True) != NVIDIA_VENDOR:
            continue
        dev = pci(address)
        if dev is not None:
            found.append(dev)
    gpus = []
    for index, dev in enumerate(sorted(found, key=lambda d: d.address)):
        at = f"gpus.{dev.address}"
        facts = _sidecar_map(fs, known, dev.address, at)
        gpus.append(
            Gpu(
                index=index,
                pci=dev,
                uuid=_sidecar_text(fs, facts, "uuid", f"{at}.uuid"),
                name=_sidecar_text(fs, facts, "name", f"{at}.name"),
                nvlinks=_nvlinks(fs, facts.get("nvlinks"), f"{at}.nvlinks"),
            )
        )
    return tuple(gpus)


# The sidecar is as untrusted as the tree (it arrives in a support archive): a field of the
# wrong type is a warning naming its key, and the field is left out.


def _sidecar_map(fs: _Sysfs, d: dict[str, object], key: str, at: str = "") -> dict[str, object]:
    v = d.get(key)
    if v is None:
        return {}
    if isinstance(v, dict):
        return v
    fs.warn(SIDECAR, f"{at or key}: expected an object, got {what_it_is(v)}")
    return {}


def _sidecar_text(fs: _Sysfs, d: dict[str, object], key: str, at: str = "") -> str | None:
    v = d.get(key)
    if v is None or isinstance(v, str):
        return v if v is None else fs.printable(f"{SIDECAR}: {at or key}", v)
    fs.warn(SIDECAR, f"{at or key}: expected a string, got {what_it_is(v)}")
    return None


def _nvlinks(fs: _Sysfs, links: object, at: str) -> tuple[tuple[str, int], ...] | None:
    """NVLinks to each peer GPU (PCI address → count of bonded links), as NVML reports them."""
    if links is None:
        return None
    if isinstance(links, dict) and all(
        isinstance(k, str) and isinstance(n, int) and not isinstance(n, bool) and n >= 0
        for k, n in links.items()
    ):
        return tuple(sorted(links.items()))
    fs.warn(SIDECAR, f"{at}: expected a map of peer PCI address to a link count")
    return None


# ---------------------------------------------------------------- netdevs


def _read_netdevs(fs: _Sysfs) -> dict[str, Netdev]:
    out: dict[str, Netdev] = {}
    for name in sorted(fs.listdir("class/net", optional=True), key=natural_key):
        rel = f"class/net/{name}"
        entries = set(fs.listdir(rel, optional=True))
        lower = tuple(
            sorted(
                fs.link_name(f"{rel}/{e}") or e[len("lower_") :]
                for e in entries
                if e.startswith("lower_")
            )
        )
        pci_addr = fs.link_name(f"{rel}/device") if "device" in entries else None
        if "bonding" in entries:
            kind = NetdevKind.BOND
            slaves = fs.text(f"{rel}/bonding/slaves", optional=True)
            lower = tuple(sorted(slaves.split())) if slaves else lower
        elif fs.text(f"{rel}/type", optional=True) == "32":
            kind = NetdevKind.IPOIB
        elif pci_addr is not None:
            kind = NetdevKind.PHYSICAL
        elif lower:
            kind = NetdevKind.VLAN
        else:
            kind = NetdevKind.VIRTUAL
        out[name] = Netdev(
            name=name,
            kind=kind,
            pci=pci_addr if pci_addr and _BDF.match(pci_addr) else None,
            mac=fs.text(f"{rel}/address", optional=True),
            mtu=fs.parsed(f"{rel}/mtu", int, optional=True),
            operstate=fs.text(f"{rel}/operstate", optional=True),
            speed_mbps=fs.parsed(f"{rel}/speed", _parse_speed, optional=True),
            master=fs.link_name(f"{rel}/master") if "master" in entries else None,
            lower=lower,
            dev_port=fs.parsed(f"{rel}/dev_port", int, optional=True),
        )
    return out


def _parse_speed(text: str) -> int | None:
    n = int(text)
    return n if n > 0 else None  # -1 / 0 while the link is down


# ---------------------------------------------------------------- HCAs


def _read_char_devices(fs: _Sysfs, cls: str, prefixes: Iterable[str]) -> dict[str, list[str]]:
    """`class/infiniband_verbs` etc.: device name → the HCA (`ibdev`) and port it serves."""
    out: dict[str, list[str]] = {}
    for name in fs.listdir(cls, optional=True):
        if not name.startswith(tuple(prefixes)):
            continue
        ibdev = fs.text(f"{cls}/{name}/ibdev")
        if ibdev is None:
            continue
        port = fs.text(f"{cls}/{name}/port", optional=True) or ""
        out[name] = [ibdev, port]
    return out


def _vuid(fs: _Sysfs, address: str) -> str | None:
    """The `VU` keyword of a PCI function's VPD; None when it has no readable VPD (the file
    is root's alone) or no such keyword."""
    try:
        data = fs.read(f"bus/pci/devices/{address}/vpd", VPD_MAX_BYTES)
    except OSError:
        return None
    return vpd.ro_keyword(data, "VU")


def _read_data_direct(fs: _Sysfs, pci: Callable[[str], PciDevice | None]) -> dict[str, PciDevice]:
    """ConnectX-8 Data Direct functions (Mellanox device 0x2100), by the VUID in their VPD.
    The kernel ties one to its NIC by that VUID (the NIC's firmware reports it); sysfs has no
    link between them, so a NIC's own VPD, which carries the card's `VU`, stands in."""
    base = "bus/pci/devices"
    addresses = fs.listdir(base, optional=True)
    found = {}
    for address, (_, device) in zip(
        addresses, fs.read_many(base, [f"{a}/device" for a in addresses]), strict=True
    ):
        if isinstance(device, OSError) or device.strip() != DATA_DIRECT_DEVICE.encode():
            continue
        if fs.text(f"{base}/{address}/vendor", optional=True) != MELLANOX_VENDOR:
            continue
        function, vuid = pci(address), _vuid(fs, address)
        if function is None:
            continue
        if vuid is None:
            fs.warn(
                f"{base}/{address}/vpd",
                "a Data Direct function without a readable VUID: no NIC is paired through it",
            )
            continue
        found[vuid] = function
    return found


def _read_hcas(
    fs: _Sysfs,
    pci: Callable[[str], PciDevice | None],
    netdevs: dict[str, Netdev],
    data_direct: dict[str, PciDevice],
) -> tuple[Hca, ...]:
    verbs = _read_char_devices(fs, "class/infiniband_verbs", ["uverbs"])
    mad = _read_char_devices(fs, "class/infiniband_mad", ["umad", "issm"])
    hcas = []
    for name in sorted(fs.listdir("class/infiniband", optional=True), key=natural_key):
        rel = f"class/infiniband/{name}"
        port_names = fs.entries(f"{rel}/ports")
        if isinstance(port_names, OSError):  # a link to elsewhere (a loop, a folder of links)
            why = port_names.strerror or type(port_names).__name__
            fs.warn(rel, f"not an RDMA device ({rel}/ports: {why}); left out")
            continue
        dev = None
        address = fs.link_name(f"{rel}/device")
        if address is not None and _BDF.match(address):
            dev = pci(address)
        parent_netdev = fs.text(f"{rel}/parent", optional=True) if address is None else None
        dma = None
        if dev is not None and dev.vendor == MELLANOX_VENDOR and data_direct:
            vuid = _vuid(fs, dev.address)
            dma = data_direct.get(vuid) if vuid is not None else None
        ports = tuple(
            _read_port(fs, name, int(p), dev, netdevs, mad, parent_netdev)
            for p in port_names
            if p.isdigit()
        )
        hcas.append(
            Hca(
                name=name,
                pci=dev,
                ports=ports,
                node_type=fs.text(f"{rel}/node_type", optional=True),
                node_guid=fs.text(f"{rel}/node_guid", optional=True),
                sys_image_guid=fs.text(f"{rel}/sys_image_guid", optional=True),
                fw_ver=fs.text(f"{rel}/fw_ver", optional=True),
                hca_type=fs.text(f"{rel}/hca_type", optional=True),
                board_id=fs.text(f"{rel}/board_id", optional=True),
                uverbs=next((v for v, (ib, _) in sorted(verbs.items()) if ib == name), None),
                parent_netdev=parent_netdev,
                data_direct=dma,
            )
        )
    return tuple(hcas)


def _parse_state(text: str) -> int:
    """`4: ACTIVE` → 4."""
    return int(text.split(":", 1)[0])


def _parse_link_layer(text: str) -> LinkLayer:
    return LinkLayer(text)


def _read_port(
    fs: _Sysfs,
    hca: str,
    number: int,
    dev: PciDevice | None,
    netdevs: dict[str, Netdev],
    mad: dict[str, list[str]],
    parent_netdev: str | None,
) -> Port:
    rel = f"class/infiniband/{hca}/ports/{number}"
    rate = fs.text(f"{rel}/rate")
    state = fs.parsed(f"{rel}/state", _parse_state) or 0
    phys = fs.parsed(f"{rel}/phys_state", _parse_state) or 0
    gids, table_len = _read_gids(fs, rel)
    mine = sorted(k for k, (ib, p) in mad.items() if ib == hca and p == str(number))
    return Port(
        number=number,
        state=PortState(state) if state in PortState._value2member_map_ else PortState.NOP,
        phys_state=PhysState(phys) if phys in PhysState._value2member_map_ else PhysState.NOP,
        link_layer=fs.parsed(f"{rel}/link_layer", _parse_link_layer) or LinkLayer.UNKNOWN,
        rate_gbps=fs.parse(f"{rel}/rate", rate, parse_rate_gbps),
        rate=rate,
        lid=fs.parsed(f"{rel}/lid", _hex, optional=True),
        sm_lid=fs.parsed(f"{rel}/sm_lid", _hex, optional=True),
        netdev=_port_netdev(dev, number, netdevs, gids) or parent_netdev,
        gids=gids,
        gid_table_len=table_len,
        umad=next((k for k in mine if k.startswith("umad")), None),
        issm=next((k for k in mine if k.startswith("issm")), None),
    )


def _hex(text: str) -> int:
    return int(text, 16)


def _port_netdev(
    dev: PciDevice | None, number: int, netdevs: dict[str, Netdev], gids: tuple[Gid, ...]
) -> str | None:
    """The interface behind a port, as `ibdev2netdev` reports it: the PCI function's netdev
    (matched on `dev_port` when a function has several), its bond master when enslaved (RoCE LAG
    shows `mlx5_bond_0 → bond0`), else the netdev of the port's first GID."""
    if dev is not None:
        own = [n for n in netdevs.values() if n.pci == dev.address]
        if len(own) > 1:
            own = [n for n in own if n.dev_port in (None, number - 1)] or own
        if own:
            first = min(own, key=lambda n: (n.dev_port or 0, n.name))
            return first.master or first.name
    return next((g.netdev for g in gids if g.netdev), None)


def _read_gids(fs: _Sysfs, port_rel: str) -> tuple[tuple[Gid, ...], int]:
    """Non-empty GIDs of a port, and the table length (the number of `gids/<i>` files).

    Empty entries read as all zeros and are skipped without touching their attributes, which
    fail with EINVAL; a non-empty entry whose attributes fail keeps the error on the `Gid`.
    """
    folder = f"{port_rel}/gids"
    names = sorted((n for n in fs.listdir(folder, optional=True) if n.isdigit()), key=int)
    gids = []
    for name, data in fs.read_many(folder, names):
        if data == _ZERO_GID:
            continue
        if isinstance(data, OSError):
            fs.warn(f"{folder}/{name}", data.strerror or type(data).__name__)
            continue
        raw = data.decode("ascii", "replace").strip()
        if _is_zero_gid(raw):
            continue
        try:
            gid = Gid(index=int(name), raw=_canonical_gid(raw))
        except ValueError:
            fs.warn(f"{folder}/{name}", f"not a GID: {raw[:60]!r}")
            continue
        gids.append(_with_attrs(fs, port_rel, gid))
    return tuple(gids), len(names)


def _is_zero_gid(raw: str) -> bool:
    return raw.replace(":", "").strip("0") == "" and len(raw) >= 32


def _canonical_gid(raw: str) -> str:
    """Full 8×4 hex form, as the kernel prints it; raises ValueError on anything else."""
    groups = raw.lower().split(":")
    if len(groups) != 8 or not all(len(g) == 4 for g in groups):
        raise ValueError(raw)
    int("".join(groups), 16)
    return ":".join(groups)


def _with_attrs(fs: _Sysfs, port_rel: str, gid: Gid) -> Gid:
    errors = []
    gid_type: GidType | None = None
    netdev: str | None = None
    for attr in ("types", "ndevs"):
        rel = f"{port_rel}/gid_attrs/{attr}/{gid.index}"
        try:
            value = fs.printable(rel, fs.read(rel).decode("utf-8", "replace").strip())
        except OSError as e:
            errors.append(f"{attr}: {e.strerror or type(e).__name__}")
            continue
        if attr == "ndevs":
            netdev = value or None
        elif value in GidType._value2member_map_:
            gid_type = GidType(value)
        else:
            errors.append(f"types: unknown GID type {value[:40]!r}")
    if gid_type is not None and errors == ["ndevs: Invalid argument"]:
        errors = []  # InfiniBand GIDs have no netdev; the kernel answers EINVAL
    error = "; ".join(errors) or None
    if error:
        fs.warn(f"{port_rel}/gid_attrs/*/{gid.index}", error)
    return Gid(index=gid.index, raw=gid.raw, type=gid_type, netdev=netdev, attrs_error=error)
