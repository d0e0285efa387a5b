"""Container images for the real node: there is no registry on this machine.

rdmaplane's own image is `make image`'s archive (`rdmaplane_image`). Two more are written here,
each one layer in an archive of image/oci.py, which `ctr -n k8s.io images import` takes as it is:

- `busybox_image`: Debian's busybox-static with a link per applet. It is also the node's pause
  image (`sleep` holds the pod's namespaces).
- `python_image`: busybox plus this checkout's Python environment at the same paths as on the
  host: the interpreter and its standard library, the virtualenv with rdmaplane (editable, so its
  `src/`) and the distributions it needs at run time (not the dev extras), the verbs libraries
  the doctor loads (Debian's libibverbs1 and ibverbs-providers, as the image has them;
  `ldconfig` and its cache, through which `ctypes.util.find_library` finds
  them), and every shared library those binaries load (from `ldd`). Its entrypoint is
  `rdmaplane`. PyTorch (5 GB) is not in it: a training pod mounts the host's site-packages
  read-only and puts it on PYTHONPATH (`HOST_SITE`).
"""

from __future__ import annotations

import importlib.metadata as md
import io
import os
import re
import stat
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from image import oci

BUSYBOX = Path("/bin/busybox")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# what the interpreter's standard library has that no pod of ours imports
_STDLIB_LEFT_OUT = {
    "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
    "site-packages", "__phello__",
}  # fmt: skip
_ELF = b"\x7fELF"
_LDD_PATH = re.compile(r"(?:=>\s+)?(/\S+)\s+\(0x")


@dataclass(frozen=True)
class Image:
    """An image tar on disk and the name it is imported under."""

    name: str
    tar: Path


class Layer:
    """The entries of one layer: paths in the image, from host files or from bytes."""

    def __init__(self) -> None:
        self._entries: dict[str, tarfile.TarInfo] = {}
        self._data: dict[str, bytes | Path] = {}

    def directory(self, path: str, mode: int = 0o755) -> None:
        self._parents(path)
        if path.strip("/") and path not in self._entries:
            self._entries[path] = oci.entry(path, tarfile.DIRTYPE, mode, 0)

    def symlink(self, path: str, target: str) -> None:
        self._parents(path)
        info = oci.entry(path, tarfile.SYMTYPE, 0o777, 0)
        info.linkname = target
        self._entries[path] = info

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._parents(path)
        info = oci.entry(path, tarfile.REGTYPE, mode, 0)
        info.size = len(data)
        self._entries[path] = info
        self._data[path] = data

    def host(self, path: Path) -> None:
        """`path` as it is on the host, at the same place: every symlink on the way (a folder
        link such as `/lib -> usr/lib` too) kept as a link, and its target added as well."""
        self._host(Path(os.path.abspath(path)), depth=0)

    def host_tree(self, root: Path, skip: Iterable[str] = ()) -> None:
        """Everything under `root` (not following links into other places), less the names in
        `skip` directly under it."""
        left_out = set(skip)
        self.host(root)
        for entry in sorted(root.iterdir()):
            if entry.name in left_out:
                continue
            if entry.is_dir() and not entry.is_symlink():
                self.host_tree(entry)
            else:
                self.host(entry)

    def _host(self, path: Path, depth: int) -> None:
        if depth > 40:
            raise ValueError(f"too many links on the way to {path}")
        real_parent = Path(os.path.realpath(path.parent))
        if real_parent != path.parent:  # a link on the way: keep the links, then the real path
            self._link_chain(path.parent, depth)
            path = real_parent / path.name
        key = str(path)
        if key in self._entries:
            return
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(path)
            self.symlink(key, target)
            self._host(path.parent / target, depth + 1)
        elif stat.S_ISDIR(st.st_mode):
            self.directory(key, stat.S_IMODE(st.st_mode))
        elif stat.S_ISREG(st.st_mode):
            self._parents(key)
            info = oci.entry(key, tarfile.REGTYPE, stat.S_IMODE(st.st_mode), 0)
            info.size = st.st_size
            self._entries[key] = info
            self._data[key] = path
        else:
            raise ValueError(f"{path}: not a file, folder or link")

    def _link_chain(self, folder: Path, depth: int) -> None:
        """Add each symlink among `folder`'s components (and where it points)."""
        walked = Path("/")
        for part in folder.parts[1:]:
            walked = walked / part
            if walked.is_symlink():
                self._host(walked, depth + 1)
                walked = Path(os.path.realpath(walked))

    def _parents(self, path: str) -> None:
        parent = os.path.dirname(path.rstrip("/"))
        if parent not in ("", "/") and parent not in self._entries:
            self.directory(parent)

    def write(self, out: io.BufferedIOBase) -> None:
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(self._entries):
                info = self._entries[path]
                data = self._data.get(path)
                if data is None:
                    tar.addfile(info)
                elif isinstance(data, bytes):
                    tar.addfile(info, io.BytesIO(data))
                else:
                    with data.open("rb") as f:
                        tar.addfile(info, f)


def write_image(
    layer: Layer,
    name: str,
    cmd: list[str],
    env: dict[str, str],
    out: Path,
    entrypoint: list[str] | None = None,
) -> Image:
    """A one-layer image archive of `layer` at `out` (layers stored uncompressed: quicker)."""
    blob = out.with_suffix(".layer")
    with blob.open("wb") as f:
        layer.write(f)  # type: ignore[arg-type]
    config = oci.Config(env=env, cmd=cmd, entrypoint=entrypoint or [], history=["tests/node"])
    oci.write_archive(out, name, [blob], config, compress=False)
    blob.unlink()
    return Image(name, out)


def _busybox(layer: Layer) -> None:
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    layer.directory("/bin")
    layer.file("/bin/busybox", BUSYBOX.read_bytes(), 0o755)
    for applet in applets:
        if applet != "busybox":
            layer.symlink(f"/bin/{applet}", "busybox")
    for folder in ("/proc", "/sys", "/dev", "/etc", "/root", "/var"):
        layer.directory(folder)
    layer.directory("/tmp", 0o1777)
    layer.file("/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n")
    layer.file("/etc/group", b"root:x:0:\nnogroup:x:65534:\n")


def busybox_image(name: str, out: Path) -> Image:
    """busybox; its command sleeps, as a pause image's must (pods give their own)."""
    layer = Layer()
    _busybox(layer)
    return write_image(layer, name, ["sleep", "2147483647"], {"PATH": PATH}, out)


# --- the Python environment


def runtime_distributions(root: str = "rdmaplane") -> list[md.Distribution]:
    """`root` and every distribution it requires at run time (no extras), transitively."""
    seen: dict[str, md.Distribution] = {}
    todo = [root]
    while todo:
        name = _canonical(todo.pop())
        if name in seen:
            continue
        dist = md.distribution(name)
        seen[name] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(seen.values(), key=lambda d: _canonical(d.metadata["Name"]))


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distribution_files(dist: md.Distribution) -> Iterator[Path]:
    """A distribution's installed files; for an editable install, its source folders too."""
    for f in dist.files or ():
        path = Path(str(dist.locate_file(f))).resolve()
        if path.is_file():
            yield path
        if path.suffix == ".pth":  # an editable install's line: a folder on sys.path
            for line in path.read_text().splitlines():
                if line.startswith("/") and Path(line).is_dir():
                    yield Path(line)


def _shared_libraries(binaries: Iterable[Path]) -> set[Path]:
    """Every library `ldd` says these ELF files load."""
    found: set[Path] = set()
    for binary in binaries:
        with binary.open("rb") as f:
            if f.read(4) != _ELF:
                continue
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        found.update(Path(m.group(1)) for m in _LDD_PATH.finditer(out))
    return found


def _elf_candidates(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from (p for p in path.rglob("*.so*") if p.is_file())
        elif path.suffix == ".so" or ".so." in path.name or os.access(path, os.X_OK):
            yield path


VERBS_PACKAGES = ("libibverbs1", "ibverbs-providers")
LDCONFIG = (Path("/sbin/ldconfig"), Path("/etc/ld.so.cache"))


def package_files(packages: Iterable[str]) -> list[Path]:
    """The files Debian's packages installed, their documentation left out."""
    listed = subprocess.run(
        ["dpkg", "-L", *packages], capture_output=True, text=True, check=True
    ).stdout.split()
    return [Path(f) for f in listed if Path(f).is_file() and not f.startswith("/usr/share/")]


def python_image(name: str, out: Path, extra_library_roots: Iterable[Path] = ()) -> Image:
    """busybox plus this interpreter, its virtualenv with rdmaplane's run-time distributions,
    the verbs libraries, and their shared libraries; `extra_library_roots` (e.g. torch's folder
    in the host's site-packages) add their libraries' dependencies, not themselves."""
    layer = Layer()
    _busybox(layer)
    verbs = [*package_files(VERBS_PACKAGES), *LDCONFIG]
    for path in verbs:
        layer.host(path)
    base = Path(sys.base_prefix)
    executable = Path(os.path.realpath(sys.executable))
    stdlib = Path(sysconfig.get_paths(vars={"base": str(base)})["stdlib"])
    layer.host(executable)
    libpython = base / "lib" / str(sysconfig.get_config_var("INSTSONAME") or "")
    binaries: list[Path] = [executable, *_elf_candidates(verbs)]
    if libpython.is_file():
        layer.host(libpython)
        binaries.append(libpython)
    left_out = _STDLIB_LEFT_OUT | {f"config-{sysconfig.get_python_version()}-x86_64-linux-gnu"}
    layer.host_tree(stdlib, skip=left_out)
    binaries.extend(_elf_candidates([stdlib / "lib-dynload"]))
    venv = Path(sys.prefix)
    layer.host(venv / "pyvenv.cfg")
    for link in sorted((venv / "bin").glob("python*")):
        layer.host(link)
    site = Path(sysconfig.get_paths()["purelib"])
    layer.directory(str(site))
    for dist in runtime_distributions():
        for path in _distribution_files(dist):
            if path.is_dir():
                layer.host_tree(path)
                binaries.extend(_elf_candidates([path]))
            else:
                layer.host(path)
                binaries.extend(_elf_candidates([path]))
    binaries.extend(_elf_candidates(extra_library_roots))
    for library in sorted(_shared_libraries(binaries)):
        if not str(library).startswith(tuple(str(r) for r in extra_library_roots)):
            layer.host(library)
    env = {"PATH": f"{venv / 'bin'}:{PATH}", "PYTHONDONTWRITEBYTECODE": "1"}
    return write_image(
        layer, name, ["--help"], env, out, entrypoint=[str(venv / "bin" / "rdmaplane")]
    )


HOST_SITE = Path(sysconfig.get_paths()["purelib"])
