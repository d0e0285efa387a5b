"""`rdmaplane device-plugin`: serve RDMA NICs to the kubelet."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from rdmaplane.cli.common import (
    LogFormatOption,
    VerboseOption,
    config_file,
    existing_dir,
    fail,
    start_logging,
)


def device_plugin(
    config: Annotated[
        str,
        typer.Option(
            "--config",
            metavar="FILE",
            help="A DevicePluginConfig file, or the shared RDMA device plugin's configList.",
        ),
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
            help="The kubelet's root (must exist), holding device-plugins/ and plugins_registry/.",
        ),
    ] = "/var/lib/kubelet",
    log_format: LogFormatOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Run the kubelet device plugin for this node's RDMA NICs until SIGTERM."""
    # gRPC and the plugin load only when this command runs: every other command starts faster
    from rdmaplane.config import DevicePluginConfig
    from rdmaplane.deviceplugin import run_standalone
    from rdmaplane.deviceplugin.server import ServeError

    cfg = config_file(config, DevicePluginConfig)
    existing_dir("--sysfs-root", sysfs_root)
    existing_dir("--kubelet-dir", kubelet_dir)
    start_logging(log_format, verbose)
    try:
        asyncio.run(
            run_standalone(cfg, sysfs_root=sysfs_root, kubelet_dir=kubelet_dir, dev_root=dev_root)
        )
    except ServeError as e:
        fail(str(e), code=1)
