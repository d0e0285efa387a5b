"""image/: unpacking packages dpkg-deb built, the Dockerfile as the image's description, the
archive's layout and digests, and the split into layers."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from image import build, deb, dockerfile, oci

DPKG_DEB = shutil.which("dpkg-deb")
needs_dpkg_deb = pytest.mark.skipif(DPKG_DEB is None, reason="dpkg-deb builds the test packages")


def make_deb(tmp: Path, name: str, files: dict[str, bytes | str]) -> Path:
    """A .deb built by dpkg-deb itself from `files` (bytes: a file, str: a symlink's target)."""
    tree = tmp / f"{name}-tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0-1\nArchitecture: amd64\nMaintainer: t <t@t>\n"
        "Description: test\n"
    )
    for path, content in files.items():
        where = tree / path
        where.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            where.symlink_to(content)
        else:
            where.write_bytes(content)
            where.chmod(0o755 if path.startswith(("bin/", "usr/bin/")) else 0o644)
    out = tmp / f"{name}.deb"
    subprocess.run(
        [DPKG_DEB, "--root-owner-group", "-Zxz", "--build", str(tree), str(out)],  # type: ignore[list-item]
        check=True, capture_output=True,
    )  # fmt: skip
    return out


@needs_dpkg_deb
def test_a_package_lands_merged_into_usr_without_its_docs(tmp_path: Path) -> None:
    package = make_deb(tmp_path, "tool", {
        "bin/tool": b"#!/bin/sh\n", "bin/sh": "dash", "lib/x86_64-linux-gnu/libt.so.1": b"ELF",
        "usr/share/doc/tool/copyright": b"Apache-2.0", "usr/share/doc/tool/README": b"r",
        "usr/share/man/man1/tool.1.gz": b"m",
    })  # fmt: skip
    root = tmp_path / "root"
    root.mkdir()
    unpacked = deb.unpack(package, root)
    assert unpacked.control["Package"] == "tool" and unpacked.control["Version"] == "1.0-1"
    assert (root / "usr/bin/tool").read_bytes() == b"#!/bin/sh\n"
    assert os.access(root / "usr/bin/tool", os.X_OK)
    assert os.readlink(root / "usr/bin/sh") == "dash"
    assert (root / "usr/lib/x86_64-linux-gnu/libt.so.1").is_file()
    assert (root / "usr/share/doc/tool/copyright").read_bytes() == b"Apache-2.0"
    assert not (root / "usr/share/doc/tool/README").exists()
    assert not (root / "usr/share/man").exists()
    assert not (root / "bin").exists()  # the build links /bin to usr/bin


@needs_dpkg_deb
def test_two_packages_may_not_put_different_files_in_one_place(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    deb.unpack(make_deb(tmp_path, "one", {"usr/lib/same": b"x", "bin/clash": b"1"}), root)
    deb.unpack(make_deb(tmp_path, "two", {"usr/lib/same": b"x"}), root)  # identical: fine
    with pytest.raises(deb.DebError, match="usr/bin/clash is already there"):
        deb.unpack(make_deb(tmp_path, "three", {"usr/bin/clash": b"2"}), root)


def test_not_a_deb_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.deb"
    junk.write_bytes(b"PK\x03\x04")
    with pytest.raises(deb.DebError, match=r"not a \.deb"):
        deb.unpack(junk, tmp_path)


def test_the_dockerfile_describes_the_recipes_layers_and_settings() -> None:
    stage = dockerfile.final_stage(build.DOCKERFILE.read_text())
    assert build.layer_sources(stage) == list(build.LAYERS)
    assert stage.settings.user == f"{build.USER_ID}:{build.USER_ID}"
    assert stage.settings.entrypoint == ["rdmaplane"]
    assert stage.settings.env["PATH"].startswith(f"/{build.VENV}/bin:")
    assert stage.settings.labels["org.opencontainers.image.licenses"] == "Apache-2.0"


@pytest.mark.parametrize(
    ("final", "error"),
    [
        ("FROM scratch\nCOPY --from=build /layers/debian/ /\nRUN true\n", r":5: RUN in the final"),
        ("FROM scratch\nCOPY /x /\n", r":4: COPY must be"),
        ("FROM debian\nCOPY --from=build /layers/debian/ /\n", r":3: the final stage must start"),
        ("FROM scratch\nCOPY --from=build /l/ /\nENTRYPOINT rdmaplane\n", r":5: ENTRYPOINT must"),
        ("FROM scratch\nUSER 1\n", "copies no layers"),
        ("FROM scratch\nENV A\n", r":4: ENV takes key=value"),
    ],
)
def test_a_final_stage_make_image_could_not_match_is_refused(final: str, error: str) -> None:
    with pytest.raises(dockerfile.DockerfileError, match=error):
        dockerfile.final_stage("FROM debian AS build\nRUN x\n" + final)  # final: line 3 on


def test_continuation_lines_and_comments() -> None:
    steps = dockerfile.instructions("# c\nENV A=1 \\\n  # inside\n  B=2\nUSER 1\n")
    assert steps == [(2, "ENV", "A=1  B=2"), (5, "USER", "1")]


def tree(root: Path) -> None:
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/tool").write_text("x")
    (root / "usr/bin/tool").chmod(0o755)
    os.link(root / "usr/bin/tool", root / "usr/bin/tool2")
    (root / "bin").symlink_to("usr/bin")


def layer_digest(root: Path, paths: list[str]) -> str:
    out = root.parent / f"{root.name}.tar"
    with out.open("wb") as f:
        oci.write_tree_layer(root, paths, f, mtime=1234)
    return hashlib.sha256(out.read_bytes()).hexdigest()


def test_a_layer_depends_on_its_files_alone(tmp_path: Path) -> None:
    """The same files give the same bytes, whenever and in whatever order they were made."""
    first, second = tmp_path / "a", tmp_path / "b"
    tree(first)
    tree(second)
    os.utime(second / "usr/bin/tool", (1, 1))
    paths = ["usr/bin/tool2", "bin", "usr/bin/tool"]
    assert layer_digest(first, paths) == layer_digest(second, list(reversed(paths)))
    with tarfile.open(tmp_path / "a.tar") as tar:
        members = {m.name: m for m in tar}
    assert list(members) == ["bin", "usr", "usr/bin", "usr/bin/tool", "usr/bin/tool2"]
    assert members["usr/bin/tool2"].islnk() and members["usr/bin/tool2"].linkname == "usr/bin/tool"
    assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 1234)}
    (second / "usr/bin/tool").write_text("y")
    assert layer_digest(first, paths) != layer_digest(second, paths)


def test_the_archive_is_an_oci_layout_and_a_docker_archive(tmp_path: Path) -> None:
    root = tmp_path / "root"
    tree(root)
    layer = tmp_path / "layer.tar"
    with layer.open("wb") as f:
        oci.write_tree_layer(root, ["usr/bin/tool", "bin"], f, 0)
    config = oci.Config(user="65532", entrypoint=["tool"], history=["COPY x /"], created=0)
    out = tmp_path / "image.tar"
    written = oci.write_archive(out, "registry.example/a/b:1.2", [layer], config)
    with tarfile.open(out) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    for name, data in files.items():  # every blob is named by its digest
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"] == {
        "io.containerd.image.name": "registry.example/a/b:1.2",
        "org.opencontainers.image.ref.name": "1.2",
    }
    assert entry["digest"] == written.manifest
    manifest = json.loads(files["blobs/sha256/" + entry["digest"].split(":")[1]])
    (layer_entry,) = manifest["layers"]
    blob = files["blobs/sha256/" + layer_entry["digest"].split(":")[1]]
    assert layer_entry["mediaType"] == oci.LAYER_GZIP and layer_entry["size"] == len(blob)
    image_config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert image_config["rootfs"]["diff_ids"] == [
        "sha256:" + hashlib.sha256(gzip.decompress(blob)).hexdigest()
    ]
    assert image_config["config"]["User"] == "65532"
    (docker,) = json.loads(files["manifest.json"])
    assert docker["RepoTags"] == ["registry.example/a/b:1.2"]
    assert docker["Config"] == "blobs/sha256/" + manifest["config"]["digest"].split(":")[1]


def test_pip_gets_every_manylinux_tag_this_glibc_runs() -> None:
    tags = build.Python("3.11", (2, 36)).platforms()
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_37_x86_64" not in tags


def test_each_path_goes_to_one_layer_rdmaplanes_own_on_top(tmp_path: Path) -> None:
    root = tmp_path / "root"
    site = root / build.VENV / "lib/python3.11/site-packages"
    for path in ("rdmaplane/__init__.py", "rdmaplane/__pycache__/__init__.cpython-311.pyc",
                 "yaml/__init__.py", "rdmaplane-0.1.0.dist-info/METADATA"):  # fmt: skip
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text("x")
    (root / build.VENV / "bin").mkdir()
    (root / build.VENV / "bin/rdmaplane").write_text("#!")
    (site / "rdmaplane-0.1.0.dist-info/RECORD").write_text(
        "rdmaplane/__init__.py,sha256=x,1\nrdmaplane-0.1.0.dist-info/METADATA,,\n"
        "rdmaplane-0.1.0.dist-info/RECORD,,\n../../../bin/rdmaplane,sha256=y,2\n"
    )
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3.11").write_text("elf")
    layers = build.partition(root, build.Python("3.11", (2, 36)), "0.1.0")
    every = [p for paths in layers.values() for p in paths]
    assert len(every) == len(set(every))
    assert "usr/bin/python3.11" in layers["debian"]
    s = f"{build.VENV}/lib/python3.11/site-packages"
    assert set(layers["rdmaplane"]) == {
        f"{s}/rdmaplane/__init__.py", f"{s}/rdmaplane/__pycache__/__init__.cpython-311.pyc",
        f"{s}/rdmaplane-0.1.0.dist-info/METADATA", f"{s}/rdmaplane-0.1.0.dist-info/RECORD",
        f"{build.VENV}/bin/rdmaplane",
    }  # fmt: skip
    assert f"{s}/yaml/__init__.py" in layers["python"]
    assert f"{s}/rdmaplane" not in layers["python"]  # a folder of rdmaplane's alone
    files = {p for p in every if not (root / p).is_dir()}
    on_disk = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert files == on_disk
