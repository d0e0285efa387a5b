"""Snapshots: what the reader needs, read back identically; redaction; hostile archives."""

from __future__ import annotations

import io
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from rdmaplane.adapters.discovery import NodeSourceError, load_node, samples, snapshot
from rdmaplane.adapters.discovery.sysfs import read_node
from rdmaplane.core.model import NetnsMode, NodeTopology


@pytest.mark.parametrize("name", samples.names())
def test_snapshot_reads_back_as_the_same_node(
    name: str, sample_trees: dict[str, Path], sample_nodes: dict[str, NodeTopology], tmp_path: Path
) -> None:
    out = tmp_path / "node.tar.gz"
    counts = snapshot.create(str(out), root=str(sample_trees[name]))
    assert counts["bytes"] < 300 * 1024  # "a few hundred KB at most"
    again = load_node(snapshot_file=str(out))
    assert replace(again, source=None) == replace(sample_nodes[name], source=None)


def test_a_kernel_without_the_netns_parameter_stays_shared_in_its_snapshot(
    tmp_path: Path,
) -> None:
    """No parameter under an ib_core that is there: an older kernel, shared. The snapshot keeps
    the (empty) ib_core folder, so it reads the same; without it the mode would be unknown."""
    root = tmp_path / "sys"
    samples.build({**samples.load("workstation").spec, "netns_mode": "none"}, root)
    out = tmp_path / "node.tar.gz"
    snapshot.create(str(out), root=str(root))
    assert read_node(str(root)).netns_mode is NetnsMode.SHARED
    assert load_node(snapshot_file=str(out)).netns_mode is NetnsMode.SHARED
    with tarfile.open(out) as tar:
        assert [m.name for m in tar.getmembers() if m.name.startswith("module")] == [
            "module/ib_core"
        ]


def test_snapshot_keeps_only_what_the_reader_needs(
    sample_trees: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "node.tar.gz"
    snapshot.create(str(out), root=str(sample_trees["hgx-h100-roce"]))
    with tarfile.open(out) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert not any("/counters/" in n or "hw_counters" in n for n in names)
    assert any(n.endswith("gids/254") for n in names)
    links = [m for m in members if m.issym()]
    assert all(not m.linkname.startswith("/") for m in links)  # relative, as the kernel makes them


def test_redaction_is_consistent_and_keeps_the_structure(
    sample_trees: dict[str, Path], sample_nodes: dict[str, NodeTopology], tmp_path: Path
) -> None:
    out = tmp_path / "node.tar.gz"
    snapshot.create(str(out), root=str(sample_trees["degraded"]), redact=True)
    red = load_node(snapshot_file=str(out))
    orig = sample_nodes["degraded"]
    with tarfile.open(out) as tar:
        raw = b"".join(
            tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        ).decode()
    uuids = [g.uuid or "" for g in orig.gpus]
    for secret in ("10.99.1.17", "0a63:0111", "b8:3f:d2:90:00:f0", "gpu-degraded-7", *uuids):
        assert secret not in raw
    assert red.hostname == "redacted-node"
    for a, b in zip(orig.hcas, red.hcas, strict=True):
        pa, pb = a.ports[0], b.ports[0]
        assert [g.index for g in pa.gids] == [g.index for g in pb.gids]
        assert [(g.type, g.family, g.is_link_local) for g in pa.gids] == [
            (g.type, g.family, g.is_link_local) for g in pb.gids
        ]
        assert a.node_guid != b.node_guid
    # one address maps to one replacement: the v1 and v2 GIDs of an address stay equal
    gids = red.hca("mlx5_0").ports[0].gids  # type: ignore[union-attr]
    assert gids[4].raw == gids[5].raw and gids[4].raw != orig.hca("mlx5_0").ports[0].gids[4].raw  # type: ignore[union-attr]


def _tar(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    out = tmp_path / "evil.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return out


def test_hostile_archives_are_refused(tmp_path: Path) -> None:
    up = tarfile.TarInfo("../../etc/evil")
    with pytest.raises(NodeSourceError, match="not a readable snapshot"):
        load_node(snapshot_file=str(_tar(tmp_path, [(up, b"x")])))
    link = tarfile.TarInfo("class/infiniband/mlx5_0")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc"
    with pytest.raises(NodeSourceError, match="not a readable snapshot"):
        load_node(snapshot_file=str(_tar(tmp_path, [(link, b"")])))
    absolute = tarfile.TarInfo("/class/infiniband/mlx5_0/hca_type")
    with pytest.raises(NodeSourceError, match="absolute path"):  # tarfile would strip the /
        load_node(snapshot_file=str(_tar(tmp_path, [(absolute, b"MT4129")])))
    device = tarfile.TarInfo("class/infiniband/null")
    device.type = tarfile.CHRTYPE
    with pytest.raises(NodeSourceError, match="not a readable snapshot"):
        load_node(snapshot_file=str(_tar(tmp_path, [(device, b"")])))
    not_tar = tmp_path / "junk.tar.gz"
    not_tar.write_bytes(b"garbage")
    with pytest.raises(NodeSourceError, match=r"junk\.tar\.gz"):
        load_node(snapshot_file=str(not_tar))
    with pytest.raises(NodeSourceError, match="does not exist"):
        load_node(snapshot_file=str(tmp_path / "missing.tar.gz"))
    with pytest.raises(NodeSourceError, match="is not a file"):
        load_node(snapshot_file=str(tmp_path))


def test_oversized_archives_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot, "MAX_BYTES", 10)
    big = tarfile.TarInfo("class/x")
    with pytest.raises(NodeSourceError, match="more than 10"):
        load_node(snapshot_file=str(_tar(tmp_path, [(big, b"x" * 100)])))


def test_one_source_only(sample_trees: dict[str, Path]) -> None:
    with pytest.raises(NodeSourceError, match="only one"):
        load_node(sysfs_root=str(sample_trees["degraded"]), sample="degraded")
    with pytest.raises(NodeSourceError, match="no sample named"):
        load_node(sample="nope")
    for flag in ("sample", "snapshot_file", "sysfs_root"):
        with pytest.raises(NodeSourceError, match="empty value"):
            load_node(**{flag: ""})
    assert read_node(str(sample_trees["workstation"])).hostname == "ws-lab-2"


def _hostile(root: Path, kind: str) -> None:
    """Shapes a tree can have that no kernel makes: two links pointing at each other, a link
    to itself, a folder link back to class/infiniband, a link that leads out of the tree."""
    ib = root / "class" / "infiniband"
    if kind == "loop":
        (ib / "loopa").symlink_to("loopb")
        (ib / "loopb").symlink_to("loopa")
    elif kind == "self":
        (ib / "me").symlink_to("me")
    elif kind == "selfdir":
        (ib / "selfdir").symlink_to("../infiniband")
    elif kind == "device loop":
        device = ib / "mlx5_0" / "device"
        real = device.resolve()
        device.unlink()
        device.symlink_to("device")
        assert real.exists()


@pytest.mark.parametrize("kind", ["loop", "self", "selfdir", "device loop"])
def test_whatever_create_accepts_the_reader_reads_back(tmp_path: Path, kind: str) -> None:
    """A snapshot of a hostile tree reads back as the tree itself reads: the same node, the
    same warnings (links of a loop are kept, so the reader meets the same loop)."""
    root = tmp_path / "sys"
    samples.build(samples.load("workstation").spec, root)
    _hostile(root, kind)
    out = tmp_path / "node.tar.gz"
    snapshot.create(str(out), root=str(root))
    direct, again = read_node(str(root)), load_node(snapshot_file=str(out))
    assert replace(again, source=None) == replace(direct, source=None)
    if kind != "device loop":
        assert [h.name for h in direct.hcas] == ["mlx5_0", "rxe0"]  # no entry of the hostile kind


def test_an_archive_is_read_without_extracting_it(
    tmp_path: Path, sample_trees: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "node.tar.gz"
    snapshot.create(str(out), root=str(sample_trees["dgx-a100"]))

    def no_extraction(*args: object, **kwargs: object) -> None:
        raise AssertionError("extracted")

    monkeypatch.setattr(tarfile.TarFile, "extractall", no_extraction)
    monkeypatch.setattr(tarfile.TarFile, "extract", no_extraction)
    assert load_node(snapshot_file=str(out)).source == f"snapshot:{out}"


def test_an_archive_with_two_entries_at_one_place_is_refused(tmp_path: Path) -> None:
    """What an older `snapshot create` wrote for a loop: a link, and files below its name."""
    link = tarfile.TarInfo("class/infiniband/loopa")
    link.type, link.linkname = tarfile.SYMTYPE, "loopb"
    below = tarfile.TarInfo("class/infiniband/loopa/node_type")
    with pytest.raises(NodeSourceError, match=r"not a readable snapshot .*is not a folder"):
        load_node(snapshot_file=str(_tar(tmp_path, [(link, b""), (below, b"1: CA")])))
