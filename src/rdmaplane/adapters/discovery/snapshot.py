"""Support snapshots: the sysfs subset the reader needs, as a small `.tar.gz`.

A snapshot is made by reading the node once with recording on, so it carries exactly what the
reader touches (no second list of paths to keep in sync). Symlinks are kept as the kernel made
them; files whose read failed (EINVAL on torn-down GID attributes) are listed in the sidecar with
their errno so a read of the snapshot fails the same way. `redact` replaces GUIDs, MACs, IP
addresses (inside GIDs too), GPU UUIDs and the hostname, consistently across the snapshot.
"""

from __future__ import annotations

import io
import ipaddress
import json
import os
import posixpath
import socket
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rdmaplane.adapters.discovery.sysfs import SIDECAR, Recording, read_node
from rdmaplane.adapters.discovery.tree import MAX_LINKS, MemoryTree
from rdmaplane.core import paths
from rdmaplane.core.errors import InputError
from rdmaplane.core.model import Gpu, NodeTopology

MAX_MEMBERS = 200_000
MAX_BYTES = 64 << 20


class SnapshotError(InputError):
    """A snapshot that cannot be read: not a tar.gz, too large, or with unsafe members."""


@dataclass(frozen=True)
class Capture:
    """A snapshot in memory: the node as read while recording, and the archive of it."""

    topology: NodeTopology
    archive: bytes
    files: int
    links: int


def capture(
    root: str = paths.SYSFS,
    *,
    redact: bool = False,
    gpu_info: dict[str, dict[str, Any]] | None = None,
) -> Capture:
    """Read the node at `root` once, recording, and pack what was read into a `.tar.gz`.

    `gpu_info` (from NVML on a live node) is kept in the sidecar, since sysfs has no GPU UUIDs.
    """
    recording = Recording()
    topo = read_node(root, gpu_info=gpu_info, recording=recording)
    writer = _Writer(os.path.realpath(root), _Redactor() if redact else None)
    for rel in sorted(recording.links):
        writer.add_path(rel)
    for rel in sorted(recording.dirs):
        writer.add_dir(rel)
    unreadable = {}
    for rel, data in sorted(recording.files.items()):
        if rel == SIDECAR:
            continue
        if isinstance(data, int):  # replayed by the reader, where the file is in the archive
            if writer.add_file(rel, b""):
                unreadable[rel] = _errno_name(data)
        else:
            writer.add_file(rel, data)
    side: dict[str, object] = {
        "hostname": topo.hostname or socket.gethostname(),
        "gpus": {g.pci.address: _gpu_facts(g) for g in topo.gpus},
        "unreadable": unreadable,
    }
    writer.add_sidecar(side)
    return Capture(topo, writer.archive(), writer.file_count, writer.link_count)


def create(
    out: str,
    *,
    root: str = paths.SYSFS,
    redact: bool = False,
    gpu_info: dict[str, dict[str, Any]] | None = None,
) -> dict[str, int]:
    """`capture` written to the file `out`; returns counts for the caller to show."""
    snap = capture(root, redact=redact, gpu_info=gpu_info)
    Path(out).write_bytes(snap.archive)
    return {"files": snap.files, "links": snap.links, "bytes": len(snap.archive)}


def _gpu_facts(gpu: Gpu) -> dict[str, Any]:
    facts: dict[str, Any] = {"uuid": gpu.uuid, "name": gpu.name}
    if gpu.nvlinks is not None:
        facts["nvlinks"] = dict(gpu.nvlinks)
    return facts


def _errno_name(code: int) -> str:
    import errno

    return errno.errorcode.get(code, "EIO")


def read_archive(path: str) -> MemoryTree:
    """The snapshot's tree, read from the archive into memory (nothing is extracted); refused
    (`SnapshotError`) when it is not a `.tar.gz`, too large, or holds what a snapshot never
    does: absolute or `..` names, links leading out of it, hard links, devices, FIFOs, or two
    entries at one place."""
    tree = MemoryTree(f"snapshot:{path}")
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = tar.getmembers()
            _check_members(members, path)
            if members and not any(
                m.name == SIDECAR or m.name.startswith("class/") for m in members
            ):
                raise _refused(
                    path, f"a .tar.gz without {SIDECAR} or class/: not made by `snapshot create`"
                )
            for m in members:
                _add_member(tree, tar, m, path)
    except SnapshotError:
        raise
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:  # ValueError: two at a place
        raise _refused(path, str(e)) from e
    return tree


def _refused(path: str, why: str) -> SnapshotError:
    return SnapshotError(f"{path}: not a readable snapshot ({why})")


def _add_member(tree: MemoryTree, tar: tarfile.TarFile, m: tarfile.TarInfo, path: str) -> None:
    name = posixpath.normpath(m.name)
    if m.isdir():
        tree.add_dir(name)
    elif m.isreg():
        data = tar.extractfile(m)
        tree.add_file(name, data.read() if data is not None else b"")
    elif m.issym():
        target = posixpath.normpath(posixpath.join(posixpath.dirname(name), m.linkname))
        if m.linkname.startswith("/") or target == ".." or target.startswith("../"):
            raise _refused(path, f"link {m.name!r} points out of the snapshot")
        tree.add_link(name, m.linkname)
    else:
        raise _refused(path, f"member {m.name!r} is no file, folder or symlink")


def _check_members(members: list[tarfile.TarInfo], path: str) -> None:
    """Bounds, and names that stay inside the tree."""
    for m in members:
        if m.name.startswith(("/", os.sep)):  # tarfile's data filter would strip the /
            raise _refused(path, f"member {m.name!r} has an absolute path")
        if ".." in posixpath.normpath(m.name).split("/"):
            raise _refused(path, f"member {m.name!r} lies outside the tree")
    if len(members) > MAX_MEMBERS:
        raise SnapshotError(f"{path}: {len(members)} entries, more than {MAX_MEMBERS}")
    total = sum(m.size for m in members)
    if total > MAX_BYTES:
        raise SnapshotError(f"{path}: {total} bytes unpacked, more than {MAX_BYTES}")


class _Writer:
    def __init__(self, root: str, redactor: _Redactor | None) -> None:
        self.root = root
        self.redactor = redactor
        self.buffer = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buffer, mode="w:gz", compresslevel=9)  # noqa: SIM115
        self.seen: set[str] = set()
        self.file_count = 0
        self.link_count = 0
        self.mtime = int(time.time())

    def add_path(self, rel: str, links: int = 0) -> str | None:
        """Add every symlink met on the way to `rel`, and on the way to each link's target, so
        the archive resolves `rel` as the tree did; returns where `rel` really lives, or None
        when it leads out of the tree or into a loop (whose links are kept: a reader meets
        the same loop)."""
        current = ""
        for part in rel.split("/"):
            candidate = f"{current}/{part}" if current else part
            full = os.path.join(self.root, candidate)
            if not os.path.islink(full):
                current = candidate
                continue
            target = os.readlink(full)
            self._member(candidate, tarfile.SYMTYPE, linkname=target)
            followed = os.path.normpath(os.path.join(os.path.dirname(full), target))
            if links >= MAX_LINKS or not followed.startswith(self.root + os.sep):
                return None
            found = self.add_path(os.path.relpath(followed, self.root), links + 1)
            if found is None:
                return None
            current = found
        return current

    def add_dir(self, rel: str) -> None:
        real = self.add_path(rel)
        if real is not None:
            self._member(real, tarfile.DIRTYPE)

    def add_file(self, rel: str, data: bytes) -> bool:
        """Whether the file is in the archive (a path through a loop or out of the tree has
        only its links there)."""
        real = self.add_path(rel)
        if real is None or os.path.islink(os.path.join(self.root, real)):
            return False
        if self.redactor is not None:
            data = self.redactor.content(real, data)
        self._member(real, tarfile.REGTYPE, data=data)
        return True

    def add_sidecar(self, side: dict[str, object]) -> None:
        if self.redactor is not None:
            side = self.redactor.sidecar(side)
        self._member(SIDECAR, tarfile.REGTYPE, data=json.dumps(side, indent=1).encode())

    def _member(self, name: str, kind: bytes, *, linkname: str = "", data: bytes = b"") -> None:
        if name in self.seen:
            return
        self.seen.add(name)
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mtime = self.mtime
        info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
        if kind == tarfile.SYMTYPE:
            info.linkname = linkname
            self.link_count += 1
        if kind == tarfile.REGTYPE:
            info.size = len(data)
            self.file_count += 1
        self.tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

    def archive(self) -> bytes:
        self.tar.close()
        return self.buffer.getvalue()


class _Redactor:
    """Consistent replacement of identifying values: the same input always maps to the same
    output, and a link-local GID keeps matching its (redacted) MAC address."""

    def __init__(self) -> None:
        self.map: dict[str, str] = {}

    def _fresh(self, kind: str, value: str, make: object) -> str:
        key = f"{kind}:{value}"
        if key not in self.map:
            n = sum(1 for k in self.map if k.startswith(f"{kind}:")) + 1
            self.map[key] = make(n)  # type: ignore[operator]
        return self.map[key]

    def mac(self, mac: str) -> str:
        octets = mac.split(":")
        if len(octets) != 6:  # IPoIB hardware addresses carry the port GUID
            return ":".join(octets[:-8] + self.guid(":".join(octets[-8:]).replace(":", "")))
        return self._fresh(
            "mac", mac, lambda n: f"02:00:00:{n >> 16 & 255:02x}:{n >> 8 & 255:02x}:{n & 255:02x}"
        )

    def guid(self, guid: str) -> list[str]:
        flat = guid.replace(":", "").lower()
        new = self._fresh("guid", flat, lambda n: f"0200000000{n:06x}")
        return [new[i : i + 2] for i in range(0, 16, 2)]

    def guid_text(self, text: str) -> str:
        b = self.guid(text)
        return ":".join("".join(b[i : i + 2]) for i in range(0, 8, 2))

    def ip(
        self, addr: ipaddress.IPv4Address | ipaddress.IPv6Address
    ) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        if isinstance(addr, ipaddress.IPv4Address):
            new = self._fresh(
                "ip4", str(addr), lambda n: str(ipaddress.IPv4Address(0x0A000000 + n))
            )
            return ipaddress.IPv4Address(new)
        new = self._fresh(
            "ip6", str(addr), lambda n: str(ipaddress.IPv6Address((0xFD00 << 112) + n))
        )
        return ipaddress.IPv6Address(new)

    def gid(self, raw: str) -> str:
        try:
            addr = ipaddress.IPv6Address(raw)
        except ValueError:
            return raw
        packed = addr.packed
        if packed == bytes(16):
            return raw
        if addr.ipv4_mapped is not None:
            packed = bytes(10) + b"\xff\xff" + self.ip(addr.ipv4_mapped).packed
        elif addr.is_link_local:
            iid = packed[8:]
            if iid[3:5] == b"\xff\xfe":  # EUI-64 from a MAC: keep it derived from the new MAC
                mac = bytes([iid[0] ^ 2]) + iid[1:3] + iid[5:]
                new = bytes(
                    int(x, 16) for x in self.mac(":".join(f"{b:02x}" for b in mac)).split(":")
                )
                iid = bytes([new[0] ^ 2]) + new[1:3] + b"\xff\xfe" + new[3:]
            else:
                iid = bytes(int(x, 16) for x in self.guid(iid.hex()))
            packed = packed[:8] + iid
        else:
            packed = self.ip(addr).packed
        h = packed.hex()
        return ":".join(h[i : i + 4] for i in range(0, 32, 4))

    def content(self, real: str, data: bytes) -> bytes:
        name = os.path.basename(real)
        parent = os.path.basename(os.path.dirname(real))
        text = data.decode("utf-8", "replace").strip()
        if name in ("node_guid", "sys_image_guid"):
            return (self.guid_text(text) + "\n").encode()
        if name == "address" and text:
            return (self.mac(text) + "\n").encode()
        if parent == "gids":
            return (self.gid(text) + "\n").encode()
        return data

    def sidecar(self, side: dict[str, object]) -> dict[str, object]:
        out = dict(side)
        out["hostname"] = "redacted-node"
        gpus = side.get("gpus")
        if isinstance(gpus, dict):
            out["gpus"] = {
                pci: {
                    **info,
                    "uuid": self._fresh(
                        "uuid", str(info.get("uuid")), lambda n: f"GPU-redacted-{n:04d}"
                    ),
                }
                for pci, info in gpus.items()
                if isinstance(info, dict)
            }
        return out
