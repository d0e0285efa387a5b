"""`rdmaplane device-plugin`: serve RDMA NICs to the kubelet."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Annotated, NoReturn

import typer


def device_plugin(
    config: Annotated[
        str, typer.Option("--config", metavar="FILE", help="Plugin config (YAML or JSON).")
    ],
    sysfs_root: Annotated[
        str, typer.Option("--sysfs-root", metavar="DIR", help="Where sysfs is mounted.")
    ] = "/sys",
    dev_root: Annotated[
        str,
        typer.Option(
            "--dev-root",
            metavar="DIR",
            help="Where to look for device nodes; the kubelet is still told /dev/... paths.",
        ),
    ] = "/dev",
    kubelet_dir: Annotated[
        str,
        typer.Option(
            "--kubelet-dir",
            metavar="DIR",
            help="The kubelet's root, holding device-plugins/ and plugins_registry/.",
        ),
    ] = "/var/lib/kubelet",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run the kubelet device plugin for this node's RDMA NICs until SIGTERM."""
    # gRPC and the plugin load only when this command runs: every other command starts faster.
    # It runs in one process; only what it uses is imported (see rdmaplane.cli.main).
    from rdmaplane.deviceplugin import ConfigError, load_config, run_standalone
    from rdmaplane.deviceplugin.server import ServeError

    try:
        cfg = load_config(config)
    except ConfigError as e:
        fail(str(e))
    for name, path in (("--sysfs-root", sysfs_root), ("--kubelet-dir", kubelet_dir)):
        if not os.path.isdir(path):
            fail(f"{name} {path!r} is not a directory")
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        asyncio.run(
            run_standalone(cfg, sysfs_root=sysfs_root, kubelet_dir=kubelet_dir, dev_root=dev_root)
        )
    except ServeError as e:
        fail(str(e), code=1)


def fail(message: str, code: int = 2) -> NoReturn:
    """The CLI's one-line error; its module (rich, node sources) loads only on the way out."""
    from rdmaplane.cli import common

    common.fail(message, code)
