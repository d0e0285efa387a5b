"""`rdmaplane device-plugin`: serve RDMA NICs to the kubelet."""

from __future__ import annotations

from typing import Annotated

import typer

from rdmaplane.cli.common import (
    LogFormatOption,
    SysfsRootOption,
    VerboseOption,
    existing_dir,
    log_options,
)
from rdmaplane.core import paths


def device_plugin(
    config: Annotated[
        str,
        typer.Option(
            "--config",
            metavar="FILE",
            help="A DevicePluginConfig file, or the shared RDMA device plugin's configList.",
        ),
    ],
    sysfs_root: SysfsRootOption = None,
    dev_root: Annotated[
        str,
        typer.Option(
            "--dev-root",
            metavar="DIR",
            help="Where to look for device nodes; the kubelet is still told /dev/... paths.",
        ),
    ] = paths.DEV,
    kubelet_dir: Annotated[
        str,
        typer.Option(
            "--kubelet-dir",
            metavar="DIR",
            help="The kubelet's root (must exist), holding device-plugins/ and plugins_registry/.",
        ),
    ] = paths.KUBELET_DIR,
    log_format: LogFormatOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Run the kubelet device plugin for this node's RDMA NICs until SIGTERM."""
    # Check everything here, then become the lean serving process (one process: see
    # rdmaplane.services.deviceplugin.root); nothing of the CLI or the validator stays loaded.
    from rdmaplane.adapters.config import load
    from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG
    from rdmaplane.core.settings.deviceplugin import Standalone
    from rdmaplane.services.deviceplugin.root import exec_standalone

    settings = load(config, DEVICE_PLUGIN_CONFIG)
    sysfs_root = paths.SYSFS if sysfs_root is None else sysfs_root
    existing_dir("--sysfs-root", sysfs_root)
    existing_dir("--kubelet-dir", kubelet_dir)
    fmt, level = log_options(log_format, verbose)
    exec_standalone(Standalone(settings, sysfs_root, kubelet_dir, dev_root, fmt, level))
