"""The image's recipe: a Debian root from the locked packages, a virtualenv with rdmaplane's wheel
and its pinned dependencies, split into the layers the Dockerfile copies.

1. Every package of image/debian.lock, unpacked (`image.deb`), with the users, `nsswitch.conf`
   and a `/var/lib/dpkg/status.d/` entry per package (what image scanners read).
2. rdmaplane's wheel built from this checkout, and the wheels of its run-time dependencies at the
   versions constraints.txt pins, for the image's CPython and glibc (binary wheels only: the
   image has no compiler).
3. In the new root, as its own programs (chroot): `python3 -m venv /opt/rdmaplane`, pip
   installing those wheels offline, every module byte-compiled (the root filesystem is
   read-only at run time, so nothing could be cached later), `ldconfig` (ctypes finds
   libibverbs through its cache), and `image/linked.py`: no ELF file lacks a library.
4. Three layers, bottom first: `debian` (the system), `python` (the dependencies), `rdmaplane`
   (its own files): a change to rdmaplane moves only the small top layer.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from image import deb, debian, dockerfile, fetch, oci

REPO = Path(__file__).resolve().parents[1]
PACKAGES = REPO / "image" / "packages.txt"
LOCK = REPO / "image" / "debian.lock"
DOCKERFILE = REPO / "Dockerfile"
CONSTRAINTS = REPO / "constraints.txt"
LINKED = REPO / "image" / "linked.py"
VENV = "opt/rdmaplane"
SUITES = (
    fetch.Suite("http://deb.debian.org/debian", "bookworm"),
    fetch.Suite("http://deb.debian.org/debian", "bookworm-updates"),
    fetch.Suite("http://deb.debian.org/debian-security", "bookworm-security"),
)
MERGED_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
USER_ID = 65532  # the image's user, as the Dockerfile's USER says: distroless' `nonroot` id
PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    f"rdmaplane:x:{USER_ID}:{USER_ID}:rdmaplane:/nonexistent:/usr/sbin/nologin\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = f"root:x:0:\nrdmaplane:x:{USER_ID}:\nnogroup:x:65534:\n"
NSSWITCH = "passwd: files\ngroup: files\nhosts: files dns\nnetworks: files\n"
LAYERS = ("debian", "python", "rdmaplane")
# The pip that installs into the image, pinned: its script wrappers and RECORD files are in the
# image, so the build machine's own pip (Debian's 23.0 in the Dockerfile, the virtualenv's in
# `make image`) must not choose them.
INSTALLER_PIP = "26.3"


class BuildError(RuntimeError):
    pass


def project() -> tuple[str, str]:
    """(version, image name) as src/rdmaplane/__init__.py defines them (a file without
    imports, read without installing rdmaplane)."""
    spec = importlib.util.spec_from_file_location(
        "_rdmaplane_init", REPO / "src/rdmaplane/__init__.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.__version__), str(module.IMAGE)


def source_date_epoch() -> int:
    """Every file's time in the image, and its creation time: SOURCE_DATE_EPOCH, else 0 (as
    ko's and Bazel's images), so a layer's digest follows from its files alone and the lower
    layers stay the same from one commit to the next."""
    return int(os.environ.get("SOURCE_DATE_EPOCH") or 0)


def log(message: str) -> None:
    print(f"[image {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ the lock


def lock() -> debian.Lock:
    """Resolve image/packages.txt against the suites (signatures checked) and write the lock."""
    roots, left_out = debian.read_roots(PACKAGES.read_text())
    packages: list[debian.Package] = []
    suites: list[str] = []
    for suite in SUITES:
        release = fetch.verified_release(suite)
        suites.append(f"{suite.archive} {suite.name} {fetch.release_date(release)}")
        packages.extend(fetch.suite_packages(suite, release))
    chosen = debian.resolve(roots, debian.newest(packages), left_out)
    made = debian.Lock(roots, left_out, tuple(suites), tuple(debian.locked(p) for p in chosen))
    LOCK.write_text(debian.render_lock(made))
    return made


def read_lock() -> debian.Lock:
    made = debian.parse_lock(LOCK.read_text())
    if (made.roots, made.left_out) != debian.read_roots(PACKAGES.read_text()):
        raise BuildError(
            "image/packages.txt differs from the roots of image/debian.lock: run `make image-lock`"
        )
    return made


# ------------------------------------------------------------------------------ the root


@dataclass(frozen=True)
class Python:
    version: str  # 3.11
    glibc: tuple[int, int]

    @classmethod
    def of(cls, made: debian.Lock) -> Python:
        names = {p.name: p.version for p in made.packages}
        minors = sorted(m[1] for n in names if (m := re.fullmatch(r"python(3\.\d+)", n)))
        glibc = re.match(r"(\d+)\.(\d+)", names.get("libc6", ""))
        if len(minors) != 1 or glibc is None:
            raise BuildError("image/debian.lock: expected one python3.N package and libc6")
        return cls(minors[0], (int(glibc[1]), int(glibc[2])))

    def platforms(self) -> list[str]:
        """The manylinux tags this glibc runs, newest first (pip takes them literally)."""
        major, minor = self.glibc
        tags = [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 4, -1)]
        aliases = {17: "manylinux2014_x86_64", 12: "manylinux2010_x86_64", 5: "manylinux1_x86_64"}
        return tags + [alias for m, alias in aliases.items() if m <= minor]


def debian_root(root: Path, made: debian.Lock) -> None:
    for link, to in MERGED_LINKS.items():
        (root / to).mkdir(parents=True, exist_ok=True)
        (root / link).symlink_to(to)
    status = root / "var/lib/dpkg/status.d"
    status.mkdir(parents=True)
    for p in made.packages:
        unpacked = deb.unpack(fetch.package_file(p), root)
        control = {**unpacked.control, "Status": "install ok installed"}
        (status / p.name).write_text("".join(f"{k}: {v}\n" for k, v in control.items()))
    for name, text in (("passwd", PASSWD), ("group", GROUP), ("nsswitch.conf", NSSWITCH)):
        (root / "etc" / name).write_text(text)


def wheels(into: Path, python: Python, version: str) -> None:
    """rdmaplane's wheel from this checkout, its dependencies' wheels for the image, and the
    installing pip's."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "wheel", "-q", "--no-deps", "-w", str(into), str(REPO)])
    (built,) = into.glob(f"rdmaplane-{version}-*.whl")
    platforms = [arg for tag in python.platforms() for arg in ("--platform", tag)]
    abi = "cp" + python.version.replace(".", "")
    run([*pip, "download", "-q", "--only-binary=:all:", *platforms,
         "--python-version", python.version, "--implementation", "cp", "--abi", abi,
         "-c", str(CONSTRAINTS), "-d", str(into), str(built), f"pip=={INSTALLER_PIP}"])  # fmt: skip
    shutil.copy(CONSTRAINTS, into / "constraints.txt")


def in_root(root: Path) -> Callable[[list[str]], None]:
    """Run a command inside `root` as its root user: chroot when this process is root, else in
    a user namespace that maps this user to root (util-linux's unshare)."""
    env = {"PATH": "/usr/sbin:/usr/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip

    def enter() -> None:
        os.chroot(root)
        os.chdir("/")

    def command(args: list[str]) -> None:
        if os.geteuid() == 0:
            run(args, env=env, preexec_fn=enter)
        else:
            run(["unshare", "--map-root-user", f"--root={root}", "--wd=/", *args], env=env)

    return command


def python_env(root: Path, python: Python, version: str) -> None:
    staged = root / "tmp/wheels"
    staged.mkdir()
    wheels(staged, python, version)
    (pip_wheel,) = staged.glob("pip-*.whl")
    inside = in_root(root)
    py = f"/usr/bin/python{python.version}"
    inside([py, "-m", "venv", "--without-pip", f"/{VENV}"])
    inside([f"/{VENV}/bin/python", f"/tmp/wheels/{pip_wheel.name}/pip", "install", "-q",
            "--no-index", "--find-links", "/tmp/wheels", "--no-compile", "--no-cache-dir",
            "--disable-pip-version-check", "--root-user-action=ignore",
            "-c", "/tmp/wheels/constraints.txt", f"rdmaplane=={version}"])  # fmt: skip
    shutil.rmtree(staged)
    inside([py, "-m", "compileall", "-q", "-q", "--invalidation-mode", "unchecked-hash",
            f"/usr/lib/python{python.version}", f"/{VENV}"])  # fmt: skip
    inside(["/sbin/ldconfig"])
    (root / "var/cache/ldconfig/aux-cache").unlink(missing_ok=True)  # inode numbers differ
    # every ELF file's libraries there, as the image's own loader finds them (a manylinux wheel
    # leaves some to the system: grpcio's libstdc++)
    shutil.copy(LINKED, root / "tmp" / LINKED.name)
    try:
        inside([py, f"/tmp/{LINKED.name}", "/usr/bin", "/usr/sbin", "/usr/lib", f"/{VENV}"])
    finally:
        (root / "tmp" / LINKED.name).unlink()


def run(args: list[str], **kwargs: object) -> None:
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise BuildError(
            f"`{' '.join(args[:6])} …` failed ({done.returncode}):\n{done.stderr or done.stdout}"
        )


# ------------------------------------------------------------------------------ layers


def walk(root: Path) -> Iterator[str]:
    """Every path under `root`, relative, not following links."""
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        for name in sorted(dirs + files):
            yield name if rel == "." else f"{rel}/{name}"


def own_files(root: Path, python: Python, version: str) -> set[str]:
    """rdmaplane's own files in the virtualenv: its distribution's RECORD, plus the byte code
    compiled for them."""
    site = f"{VENV}/lib/python{python.version}/site-packages"
    record = root / site / f"rdmaplane-{version}.dist-info" / "RECORD"
    owned = {
        os.path.normpath(f"{site}/{line.split(',', 1)[0]}")
        for line in record.read_text().splitlines()
        if line
    }
    tag = "cpython-" + python.version.replace(".", "")
    for path in list(owned):
        if path.endswith(".py"):
            folder, name = os.path.split(path)
            owned.add(f"{folder}/__pycache__/{name[:-3]}.{tag}.pyc")
    return {p for p in owned if (root / p).exists() or (root / p).is_symlink()}


def partition(root: Path, python: Python, version: str) -> dict[str, list[str]]:
    """Each path of the root in one layer; a folder of the virtualenv that holds only
    rdmaplane's files is left to the `rdmaplane` layer, which writes the folders above its
    files."""
    own = own_files(root, python, version)
    layers: dict[str, list[str]] = {name: [] for name in LAYERS}
    venv: list[str] = []
    for path in walk(root):
        if path in own:
            layers["rdmaplane"].append(path)
        elif path == VENV or path.startswith(VENV + "/"):
            venv.append(path)
        else:
            layers["debian"].append(path)
    needed: set[str] = set()  # the virtualenv's folders the python layer must have
    for path in venv:
        where = root / path
        if where.is_symlink() or not where.is_dir() or not os.listdir(where):
            parts = path.split("/")
            needed.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    layers["python"] = [p for p in venv if p in needed]
    return layers


def layer_sources(stage: dockerfile.FinalStage) -> list[str]:
    """The layer names the Dockerfile copies, checked against the recipe's, in its order."""
    names = [Path(c.source.rstrip("/")).name for c in stage.copies]
    if names != list(LAYERS):
        raise BuildError(
            f"Dockerfile: the final stage copies {names}; the recipe makes {list(LAYERS)}"
        )
    return names


def build_root(work: Path) -> tuple[Path, dict[str, list[str]], str, str]:
    version, name = project()
    made = read_lock()
    python = Python.of(made)
    root = work / "root"
    root.mkdir()
    started = time.monotonic()
    debian_root(root, made)
    log(f"{len(made.packages)} Debian packages unpacked ({time.monotonic() - started:.1f} s)")
    started = time.monotonic()
    python_env(root, python, version)
    log(f"rdmaplane {version} and its dependencies installed ({time.monotonic() - started:.1f} s)")
    return root, partition(root, python, version), version, name


def layers_command(out: Path) -> None:
    """The Dockerfile's build stage: the root, split into `out/<layer>/` folders."""
    layer_sources(dockerfile.final_stage(DOCKERFILE.read_text()))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rdmaplane-image-", dir=out) as tmp:
        root, layers, _, _ = build_root(Path(tmp))
        epoch = source_date_epoch()  # COPY keeps times: the same as the archive's
        for layer, paths in layers.items():
            (out / layer).mkdir(exist_ok=True)
            for path in paths:  # parents first: walk() is top-down
                _move(root, out / layer, path)
            for path in [*walk(out / layer), "."]:  # after the moves, which touch folders
                os.utime(out / layer / path, (epoch, epoch), follow_symlinks=False)


def _move(root: Path, dest: Path, path: str) -> None:
    """Move `path` from `root` to `dest`, its folders made as they are in `root`."""
    parts = path.split("/")
    for i in range(1, len(parts)):
        folder = "/".join(parts[:i])
        if not (dest / folder).is_dir():
            (dest / folder).mkdir()
            shutil.copystat(root / folder, dest / folder)
    src, to = root / path, dest / path
    if src.is_dir() and not src.is_symlink():
        to.mkdir(exist_ok=True)
        shutil.copystat(src, to)
    else:
        os.rename(src, to)


def archive_command(out: Path, compress: bool = True) -> oci.Written:
    """`make image`: the root, packed as the Dockerfile's final stage describes, into `out`."""
    stage = dockerfile.final_stage(DOCKERFILE.read_text())
    names = layer_sources(stage)
    out.parent.mkdir(parents=True, exist_ok=True)
    epoch = source_date_epoch()
    with tempfile.TemporaryDirectory(prefix="rdmaplane-image-", dir=out.parent) as tmp:
        work = Path(tmp)
        root, layers, _, name = build_root(work)
        started = time.monotonic()
        tars = []
        for layer in names:
            tar = work / f"{layer}.tar"
            with tar.open("wb") as f:
                oci.write_tree_layer(root, layers[layer], f, epoch)
            tars.append(tar)
        history = [c.created_by for c in stage.copies]
        config = dataclasses.replace(stage.settings, history=history, created=epoch)
        written = oci.write_archive(out, name, tars, config, compress)
        log(f"layers packed ({time.monotonic() - started:.1f} s)")
        for layer, tar, size in zip(names, tars, written.layer_sizes, strict=True):
            log(f"  {layer}: {tar.stat().st_size / 1e6:.1f} MB, {size / 1e6:.1f} MB stored")
    return written
