"""`rdmaplane dra-driver`: the node agent with the DRA driver in place of the device plugin."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from rdmaplane.cli.agent import (
    AgentConfigOption,
    KubeconfigOption,
    KubeletDirOption,
    MetricsPortOption,
    NodeNameOption,
    configured,
    dra_needs_the_api_server,
    serve,
)
from rdmaplane.cli.common import LogFormatOption, SysfsRootOption, VerboseOption, fail


def dra_driver(
    node_name: NodeNameOption = None,
    sysfs_root: SysfsRootOption = None,
    kubelet_dir: KubeletDirOption = None,
    kubeconfig: KubeconfigOption = None,
    config: AgentConfigOption = None,
    device_plugin_config: Annotated[
        Path | None,
        typer.Option(
            "--device-plugin-config",
            metavar="FILE",
            help="A DevicePluginConfig file: its pools choose the ports offered and their NCCL "
            "settings, as they would for the device plugin.",
        ),
    ] = None,
    metrics_port: MetricsPortOption = None,
    log_format: LogFormatOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Run the node agent as the DRA driver rdma.rdmaplane.io: ResourceSlices for this node,
    the kubelet's DRA plugin, CDI specs per claim, device taints for faults (docs/dra.md).
    Never with the device plugin: a node's HCAs are offered one way or the other."""
    flags = (node_name, sysfs_root, kubelet_dir, kubeconfig, device_plugin_config, metrics_port)
    cfg = configured(config, *flags, log_format, device_plugin_enabled=False)
    if not cfg.publish.enabled:
        fail(dra_needs_the_api_server(config))
    cfg = replace(cfg, dra=replace(cfg.dra, enabled=True))
    serve(cfg, verbose, config)
