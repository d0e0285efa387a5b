"""Image archives: layer tars written the same way every time, and the OCI layout around them.

The archive is an OCI image layout in one tar (`oci-layout`, `index.json`, `blobs/sha256/…`)
that also carries Docker's `manifest.json`, as `docker save` has written since Docker 25, so
`ctr images import`, `kind load image-archive`, `docker load` (old and new) and `podman load`
all take it and name it from the index's `io.containerd.image.name` (or `RepoTags`).

Layers are reproducible: entries sorted, owned by root, one modification time for all
(SOURCE_DATE_EPOCH), gzip without a name or a time; the same files give the same digests.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
_CHUNK = 1 << 20


def entry(path: str, kind: bytes, mode: int, mtime: int) -> tarfile.TarInfo:
    """A tar header for `path` in the image, owned by root."""
    info = tarfile.TarInfo(path.strip("/"))
    info.type = kind
    info.mode = mode
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def write_tree_layer(root: Path, paths: Iterable[str], out: IO[bytes], mtime: int) -> None:
    """A layer tar of `paths` (relative to `root`) and the folders above them, as they are on
    disk (modes, links; hard links within the layer kept as such)."""
    wanted: set[str] = set()
    for path in paths:
        parts = path.strip("/").split("/")
        wanted.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    first_of: dict[tuple[int, int], str] = {}
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(wanted):
            where = root / path
            st = where.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                info = entry(path, tarfile.SYMTYPE, 0o777, mtime)
                info.linkname = os.readlink(where)
                tar.addfile(info)
            elif stat.S_ISDIR(st.st_mode):
                tar.addfile(entry(path, tarfile.DIRTYPE, mode, mtime))
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in first_of:
                    info = entry(path, tarfile.LNKTYPE, mode, mtime)
                    info.linkname = first_of[key]
                    tar.addfile(info)
                    continue
                first_of[key] = path
                info = entry(path, tarfile.REGTYPE, mode, mtime)
                info.size = st.st_size
                with where.open("rb") as f:
                    tar.addfile(info, f)
            else:
                raise ValueError(f"{where}: not a file, folder or link")


@dataclass
class Config:
    """The image's run settings (Docker's and OCI's config object) and where it was made."""

    user: str = ""
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    history: list[str] = field(default_factory=list)  # what made each layer
    created: int = 0  # seconds since the epoch

    def to_json(self, diff_ids: Sequence[str]) -> dict[str, Any]:
        stamp = _rfc3339(self.created)
        run: dict[str, Any] = {"Env": [f"{k}={v}" for k, v in self.env.items()]}
        for key, value in (("User", self.user), ("WorkingDir", self.workdir),
                           ("Entrypoint", self.entrypoint), ("Cmd", self.cmd),
                           ("Labels", self.labels)):  # fmt: skip
            if value:
                run[key] = value
        return {
            "created": stamp,
            "architecture": "amd64",
            "os": "linux",
            "config": run,
            "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
            "history": [{"created": stamp, "created_by": h} for h in self.history],
        }


def _rfc3339(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Blob:
    digest: str  # sha256:…
    size: int
    media_type: str
    path: Path

    def descriptor(self, **extra: Any) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size, **extra}


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _layer_blob(layer: Path, work: Path, compress: bool) -> tuple[str, Blob]:
    """(diff id, blob) of an uncompressed layer tar; gzip level 6, as Go's default."""
    diff_id = _sha256_file(layer)
    if not compress:
        return diff_id, Blob(diff_id, layer.stat().st_size, LAYER_TAR, layer)
    packed = work / (layer.name + ".gz")
    with (
        layer.open("rb") as src,
        packed.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0) as gz,
    ):
        while chunk := src.read(_CHUNK):
            gz.write(chunk)
    return diff_id, Blob(_sha256_file(packed), packed.stat().st_size, LAYER_GZIP, packed)


def _json_blob(obj: Any, media_type: str, work: Path) -> Blob:
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = work / digest.removeprefix("sha256:")
    path.write_bytes(data)
    return Blob(digest, len(data), media_type, path)


@dataclass(frozen=True)
class Written:
    name: str
    manifest: str  # the manifest's digest: what `ctr images ls` shows for the image
    config: str  # the config's digest: the image id `docker images` shows
    layer_sizes: tuple[int, ...]  # as stored (compressed), bottom first
    diff_ids: tuple[str, ...]  # the uncompressed layers' digests


def write_archive(
    out: Path, name: str, layers: Sequence[Path], config: Config, compress: bool = True
) -> Written:
    """The archive of `layers` (uncompressed tars, bottom first) named `name`
    (`registry/repository:tag`)."""
    tag = name.rsplit(":", 1)[-1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    with tempfile.TemporaryDirectory(prefix="oci-", dir=out.parent) as tmp:
        work = Path(tmp)
        pairs = [_layer_blob(layer, work, compress) for layer in layers]
        config_blob = _json_blob(config.to_json([d for d, _ in pairs]), OCI_CONFIG, work)
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config_blob.descriptor(),
            "layers": [b.descriptor() for _, b in pairs],
        }
        manifest_blob = _json_blob(manifest, OCI_MANIFEST, work)
        annotations = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag}
        index = {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [manifest_blob.descriptor(annotations=annotations)],
        }
        docker = [{
            "Config": _blob_path(config_blob),
            "RepoTags": [name],
            "Layers": [_blob_path(b) for _, b in pairs],
        }]  # fmt: skip
        blobs = [config_blob, manifest_blob, *(b for _, b in pairs)]
        partial = out.with_name(out.name + ".part")
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            for entry_name, data in (
                ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
                ("index.json", json.dumps(index, sort_keys=True).encode()),
                ("manifest.json", json.dumps(docker).encode()),
            ):
                info = entry(entry_name, tarfile.REGTYPE, 0o644, config.created)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            tar.addfile(entry("blobs", tarfile.DIRTYPE, 0o755, config.created))
            tar.addfile(entry("blobs/sha256", tarfile.DIRTYPE, 0o755, config.created))
            for blob in blobs:
                info = entry(_blob_path(blob), tarfile.REGTYPE, 0o644, config.created)
                info.size = blob.size
                with blob.path.open("rb") as f:
                    tar.addfile(info, f)
        partial.rename(out)
        return Written(
            name,
            manifest_blob.digest,
            config_blob.digest,
            tuple(b.size for _, b in pairs),
            tuple(d for d, _ in pairs),
        )


def _blob_path(blob: Blob) -> str:
    return "blobs/sha256/" + blob.digest.removeprefix("sha256:")
