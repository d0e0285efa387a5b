"""Unpack a .deb into a root folder as dpkg would, less its maintainer scripts and its docs.

A .deb is an `ar` archive of `debian-binary`, `control.tar.*` and `data.tar.*`. Files go where
the data tar says, with the merged-/usr layout Debian 12 installs (`/bin`, `/sbin`, `/lib*` are
links into `/usr`). Documentation, manual pages and translations are left out, as
debian:bookworm-slim's dpkg excludes leave them out, except each package's `copyright`.
No maintainer script runs: the build does the few things they would have done that the image
needs (the loader cache, byte-compiled modules, the users).
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from image.debian import stanzas

MERGED = {"bin", "sbin", "lib", "lib32", "lib64", "libx32"}
_LEFT_OUT = tuple(
    f"usr/share/{folder}/"
    for folder in ("man", "info", "locale", "lintian", "groff", "linda", "bug", "menu")
)


class DebError(ValueError):
    pass


@dataclass(frozen=True)
class Unpacked:
    control: dict[str, str]  # the package's control paragraph
    paths: tuple[str, ...]  # what it put into the root, relative


def members(data: bytes, source: str) -> dict[str, bytes]:
    """The members of an ar archive (the common format, which dpkg-deb writes)."""
    if not data.startswith(b"!<arch>\n"):
        raise DebError(f"{source}: not a .deb (no ar magic)")
    found: dict[str, bytes] = {}
    at = 8
    while at < len(data):
        header = data[at : at + 60]
        if len(header) < 60 or header[58:60] != b"`\n":
            raise DebError(f"{source}: a truncated ar header at byte {at}")
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        found[name] = data[at + 60 : at + 60 + size]
        at += 60 + size + (size % 2)
    return found


def _tar(found: dict[str, bytes], stem: str, source: str) -> tarfile.TarFile:
    for name, blob in found.items():
        if name == stem or name.startswith(stem + "."):
            if name.endswith(".zst"):
                raise DebError(
                    f"{source}: {name} is zstd-compressed, which this reader cannot open"
                )
            return tarfile.open(fileobj=io.BytesIO(blob), mode="r:*")
    raise DebError(f"{source}: no {stem}.* member")


def target(name: str) -> str | None:
    """Where a data-tar path lands in the merged-/usr root, or None if it is left out."""
    parts = PurePosixPath(name.removeprefix("./")).parts
    if not parts:
        return None
    if parts[0] in MERGED:
        parts = ("usr", *parts)
    path = "/".join(parts)
    # of the documentation, the copyright files alone (and the folders that hold them)
    doc = path.startswith("usr/share/doc/") and len(parts) > 4  # below usr/share/doc/<package>
    if (doc and not path.endswith("/copyright")) or (path + "/").startswith(_LEFT_OUT):
        return None
    return path


def unpack(deb: Path, root: Path) -> Unpacked:
    """Put the package's files under `root`; refuse a file another package already put there
    with different content, and files owned by anyone but root. Folders owned by a system
    group (base-files' `/var/local`, staff, and `/var/mail`, mail) become root's, without
    their group's write and set-group-ID bits: the image has none of those groups."""
    found = members(deb.read_bytes(), deb.name)
    with _tar(found, "control.tar", deb.name) as control_tar:
        control_file = control_tar.extractfile("./control") or control_tar.extractfile("control")
        if control_file is None:
            raise DebError(f"{deb.name}: no control file")
        control = next(stanzas(control_file.read().decode()))
    paths: list[str] = []
    with _tar(found, "data.tar", deb.name) as data:
        for member in data:
            path = target(member.name)
            if path is None:
                continue
            where = root / path
            if member.isdir():
                mode = stat.S_IMODE(member.mode)
                if member.uid or member.gid:
                    mode &= ~(stat.S_ISGID | stat.S_IWGRP)
                where.mkdir(parents=True, exist_ok=True)
                where.chmod(mode)
                continue
            if member.uid or member.gid:
                raise DebError(f"{deb.name}: {member.name} is owned by {member.uid}:{member.gid}")
            where.parent.mkdir(parents=True, exist_ok=True)
            if member.issym():
                if where.is_symlink() and os.readlink(where) == member.linkname:
                    continue
                _refuse_if_present(where, deb.name, path)
                where.symlink_to(member.linkname)
            elif member.islnk():
                linked = target(member.linkname)
                if linked is None:
                    raise DebError(f"{deb.name}: {path} links to {member.linkname}, left out")
                _refuse_if_present(where, deb.name, path)
                os.link(root / linked, where)
            elif member.isfile():
                stream = data.extractfile(member)
                assert stream is not None
                content = stream.read()
                if where.is_file() and not where.is_symlink() and where.read_bytes() == content:
                    continue
                _refuse_if_present(where, deb.name, path)
                where.write_bytes(content)
                where.chmod(stat.S_IMODE(member.mode))
            else:
                raise DebError(f"{deb.name}: {member.name} is not a file, folder or link")
            paths.append(path)
    return Unpacked(control, tuple(paths))


def _refuse_if_present(where: Path, package: str, path: str) -> None:
    if where.exists() or where.is_symlink():
        raise DebError(f"{package}: {path} is already there, from another package")
