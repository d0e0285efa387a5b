"""The trees the sysfs reader reads: a directory on disk (`/sys`, a tree someone laid out), or
one in memory (a snapshot's archive, a bundled sample), answering alike: the same contents,
links followed the same way (relative to their folder, at most 40 in a row, as the kernel
does), the same errors (ENOENT, ENOTDIR, EISDIR, ELOOP, EINVAL for a readlink of no link).

Reading a snapshot in memory spares a temporary extraction of thousands of files (bench/cli.py
has the figures), and a sample never touches the disk.
"""

from __future__ import annotations

import errno
import os
import posixpath
from dataclasses import dataclass
from typing import Protocol

MAX_LINKS = 40  # the kernel's limit on links followed in one lookup (ELOOP beyond)
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK  # a FIFO planted in a tree must not hang the reader


class SysfsTree(Protocol):
    """What the reader asks of a tree; paths are relative to its root, `/`-separated."""

    name: str  # what the reader's `source` says

    def read(self, rel: str, limit: int) -> bytes: ...

    def read_many(self, folder: str, names: list[str]) -> list[bytes | OSError]: ...

    def listdir(self, rel: str) -> list[str]: ...

    def isdir(self, rel: str) -> bool: ...

    def lexists(self, rel: str) -> bool: ...

    def readlink(self, rel: str) -> str: ...

    def realpath(self, rel: str) -> str | None:
        """Where `rel` leads, relative to the root ("" for the root); None when it leaves the
        tree. Parts that do not resolve are kept as written (as `os.path.realpath` does)."""
        ...

    def close(self) -> None: ...


def _error(code: int, rel: str) -> OSError:
    return OSError(code, os.strerror(code), rel)


# ------------------------------------------------------------------------------------ on disk


class DiskTree:
    """A directory. Files are opened relative to their folder, whose descriptor is kept while
    reads stay in it: resolving a deep sysfs path (through `class/…` symlinks) once per folder
    instead of once per file is most of the reader's time on a big node (GID tables are
    hundreds of files each)."""

    def __init__(self, root: str) -> None:
        self.name = root
        self.root = os.path.realpath(root)
        self._fd = -1
        self._folder: str | None = None

    def _path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def _folder_fd(self, folder: str) -> int:
        if folder != self._folder:
            self.close()
            self._fd = os.open(self._path(folder), os.O_RDONLY | os.O_DIRECTORY)
            self._folder = folder
        return self._fd

    def read(self, rel: str, limit: int) -> bytes:
        folder, _, name = rel.rpartition("/")
        fd = os.open(name, _READ_FLAGS, dir_fd=self._folder_fd(folder))
        try:
            return os.read(fd, limit)
        finally:
            os.close(fd)

    def read_many(self, folder: str, names: list[str]) -> list[bytes | OSError]:
        try:
            dir_fd = self._folder_fd(folder)
        except OSError as e:
            return [e for _ in names]
        out: list[bytes | OSError] = []
        for name in names:
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
                try:
                    out.append(os.read(fd, 4096))
                finally:
                    os.close(fd)
            except OSError as e:
                out.append(e)
        return out

    def listdir(self, rel: str) -> list[str]:
        return os.listdir(self._path(rel))

    def isdir(self, rel: str) -> bool:
        return os.path.isdir(self._path(rel))

    def lexists(self, rel: str) -> bool:
        return os.path.lexists(self._path(rel))

    def readlink(self, rel: str) -> str:
        return os.readlink(self._path(rel))

    def realpath(self, rel: str) -> str | None:
        real = os.path.realpath(self._path(rel))
        if real != self.root and not real.startswith(self.root + os.sep):
            return None
        return "" if real == self.root else os.path.relpath(real, self.root)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._folder = -1, None


# ------------------------------------------------------------------------------------ in memory


@dataclass(frozen=True, slots=True)
class _Link:
    target: str


_DIR = object()


class MemoryTree:
    """A tree held in dicts: files (bytes), folders, symbolic links. Built by a snapshot's
    reader and the sample builder; links never lead out of it (an archive whose links would is
    refused before it gets here, as tarfile's `data` filter refuses it)."""

    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self._entries: dict[str, object] = {"": _DIR}
        self._children: dict[str, set[str]] = {"": set()}

    # ---- building

    def add_dir(self, rel: str) -> None:
        rel = _clean(rel)
        if rel and self._entries.get(rel) is not _DIR:
            self._add(rel, _DIR)
            self._children.setdefault(rel, set())

    def add_file(self, rel: str, data: bytes) -> None:
        self._add(_clean(rel), bytes(data))

    def add_link(self, rel: str, target: str) -> None:
        self._add(_clean(rel), _Link(target))

    def _add(self, rel: str, entry: object) -> None:
        """Raises ValueError where a tree cannot hold it: below a file or a link, or in the
        place of something of another kind (a file may be written again)."""
        parent, _, name = rel.rpartition("/")
        if self._entries.get(parent, _DIR) is not _DIR:
            raise ValueError(f"{rel}: {parent} is not a folder")
        self.add_dir(parent)
        old = self._entries.get(rel)
        if old is not None and (old is _DIR or isinstance(old, _Link)) and old != entry:
            raise ValueError(f"{rel}: given twice, as two kinds of entry")
        self._entries[rel] = entry
        self._children[parent].add(name)

    def items(self) -> list[tuple[str, bytes | str | None]]:
        """Every entry but the root, parents first: (path, file bytes | link target | None
        for a folder)."""
        out: list[tuple[str, bytes | str | None]] = []
        for rel, entry in sorted(self._entries.items()):
            if rel:
                value = entry.target if isinstance(entry, _Link) else entry
                out.append((rel, value if isinstance(value, bytes | str) else None))
        return out

    # ---- reading

    def _walk(self, rel: str, follow_last: bool = True) -> str:
        """The path `rel` leads to, following links; OSError as a lookup on disk fails."""
        pending = [p for p in rel.split("/") if p and p != "."][::-1]
        here: list[str] = []
        followed = 0
        while pending:
            part = pending.pop()
            if part == "..":
                if here:
                    here.pop()
                continue
            path = "/".join([*here, part])
            entry = self._entries.get(path)
            if entry is None:
                raise _error(errno.ENOENT, rel)
            if isinstance(entry, _Link) and (pending or follow_last):
                followed += 1
                if followed > MAX_LINKS:
                    raise _error(errno.ELOOP, rel)
                if entry.target.startswith("/"):  # the tree's root stands for /
                    here = []
                pending += [p for p in entry.target.split("/") if p and p != "."][::-1]
                continue
            if isinstance(entry, bytes) and pending:
                raise _error(errno.ENOTDIR, rel)
            here.append(part)
        return "/".join(here)

    def read(self, rel: str, limit: int) -> bytes:
        entry = self._entries[self._walk(rel)]
        if not isinstance(entry, bytes):
            raise _error(errno.EISDIR, rel)
        return entry[:limit]

    def read_many(self, folder: str, names: list[str]) -> list[bytes | OSError]:
        out: list[bytes | OSError] = []
        for name in names:
            try:
                out.append(self.read(f"{folder}/{name}", 4096))
            except OSError as e:
                out.append(e)
        return out

    def listdir(self, rel: str) -> list[str]:
        path = self._walk(rel)
        if self._entries[path] is not _DIR:
            raise _error(errno.ENOTDIR, rel)
        return list(self._children[path])

    def isdir(self, rel: str) -> bool:
        try:
            return self._entries[self._walk(rel)] is _DIR
        except OSError:
            return False

    def lexists(self, rel: str) -> bool:
        try:
            self._walk(rel, follow_last=False)
        except OSError:
            return False
        return True

    def readlink(self, rel: str) -> str:
        entry = self._entries[self._walk(rel, follow_last=False)]
        if not isinstance(entry, _Link):
            raise _error(errno.EINVAL, rel)
        return entry.target

    def realpath(self, rel: str) -> str | None:
        try:
            return self._walk(rel)
        except OSError:
            return posixpath.normpath(rel).lstrip("/") if rel.strip("/") else ""

    def close(self) -> None:
        pass


def _clean(rel: str) -> str:
    return "/".join(p for p in rel.split("/") if p and p != ".")
