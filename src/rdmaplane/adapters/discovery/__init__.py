"""Adapters that turn a node — live `/sys`, a snapshot or a bundled sample — into the model."""

from __future__ import annotations

import os

from rdmaplane.adapters.discovery.sysfs import read_node
from rdmaplane.core import paths
from rdmaplane.core.errors import InputError
from rdmaplane.core.model import NodeTopology

__all__ = ["NodeSourceError", "load_node", "read_node"]


class NodeSourceError(InputError):
    """The node to read was named wrongly (several sources, missing directory, bad sample)."""


def load_node(
    *, sysfs_root: str | None = None, snapshot_file: str | None = None, sample: str | None = None
) -> NodeTopology:
    """Read the node from exactly one source; the live `/sys` of this machine by default."""
    # imported here: a long-running reader of sysfs (the device plugin) never loads them
    from rdmaplane.adapters.discovery import nvml, samples, snapshot

    given = {
        flag: value
        for flag, value in (
            ("--sysfs-root", sysfs_root),
            ("--snapshot", snapshot_file),
            ("--sample", sample),
        )
        if value is not None
    }
    if len(given) > 1:
        raise NodeSourceError("give only one of --sysfs-root, --snapshot and --sample")
    for flag, value in given.items():
        if not value:
            raise NodeSourceError(f"{flag}: empty value (leave the flag out to read /sys)")
    if sample:
        try:
            return samples.read_sample(sample)
        except samples.SampleError as e:
            raise NodeSourceError(str(e)) from e
    if snapshot_file:
        if not os.path.exists(snapshot_file):
            raise NodeSourceError(f"snapshot {snapshot_file!r} does not exist")
        if not os.path.isfile(snapshot_file):
            raise NodeSourceError(f"snapshot {snapshot_file!r} is not a file")
        try:
            return read_node(snapshot.read_archive(snapshot_file))
        except snapshot.SnapshotError as e:
            raise NodeSourceError(str(e)) from e
    root = sysfs_root or paths.SYSFS
    if not os.path.isdir(root):
        raise NodeSourceError(f"sysfs root {root!r} is not a directory")
    live = os.path.realpath(root) == paths.SYSFS
    import socket

    from rdmaplane.adapters.discovery.rdma_netlink import (
        RdmaNetlink,  # asked only about this machine
    )

    return read_node(
        root,
        hostname=socket.gethostname() if live else None,
        gpu_info=nvml.gpu_info() if live else None,
        netlink=RdmaNetlink().netns_mode if live else None,
    )
