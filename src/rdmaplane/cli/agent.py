"""`rdmaplane agent`: the node agent (one per GPU node, run by the DaemonSet)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rdmaplane.cli.common import (
    LogFormatOption,
    SysfsRootOption,
    VerboseOption,
    existing_dir,
    fail,
    start_logging,
)
from rdmaplane.core import paths

if TYPE_CHECKING:
    from rdmaplane.core.settings.agent import AgentSettings
    from rdmaplane.services.agent.root import Agent

log = logging.getLogger("rdmaplane.services.agent")


def _a_folder(flag: str) -> Callable[[str | None], Path | None]:
    """The folder a flag names; '' is refused (as a Path it would be the working directory)."""

    def check(value: str | None) -> Path | None:
        if value == "":
            fail(f"{flag} '': not a directory")
        return None if value is None else Path(value)

    return check


NodeNameOption = Annotated[
    str | None,
    typer.Option(
        "--node-name", metavar="NAME", envvar="NODE_NAME", help="The Node this agent speaks for."
    ),
]
KubeletDirOption = Annotated[
    str | None,
    typer.Option(
        "--kubelet-dir",
        metavar="DIR",
        help=f"The kubelet's root; must exist (with the plugin on). Default: {paths.KUBELET_DIR}.",
        callback=_a_folder("--kubelet-dir"),
    ),
]
KubeconfigOption = Annotated[
    Path | None,
    typer.Option("--kubeconfig", metavar="FILE", help="Default: the pod's service account."),
]
AgentConfigOption = Annotated[
    Path | None,
    typer.Option("--config", metavar="FILE", help="An AgentConfig file (YAML or JSON)."),
]
MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        metavar="PORT",
        min=0,
        max=65535,
        help="Port of /metrics, /healthz, /readyz. Default: 9478.",
    ),
]


def agent(
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
            help="A DevicePluginConfig file: the plugin's pools (they also give the gid-index "
            "label, so pass the standalone plugin's with --no-device-plugin).",
        ),
    ] = None,
    no_publish: Annotated[
        bool, typer.Option("--no-publish", help="Do not talk to the API server.")
    ] = False,
    no_device_plugin: Annotated[
        bool, typer.Option("--no-device-plugin", help="Do not serve the kubelet.")
    ] = False,
    metrics_port: MetricsPortOption = None,
    log_format: LogFormatOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Run the node agent: discovery, device plugin, topology publisher, health, fault
    actions (notice, eviction, taint: docs/faults.md), metrics."""
    flags = (node_name, sysfs_root, kubelet_dir, kubeconfig, device_plugin_config, metrics_port)
    cfg = configured(config, *flags, log_format)
    if no_publish:
        if cfg.dra.enabled:
            fail(dra_needs_the_api_server(config))
        cfg = replace(cfg, publish=replace(cfg.publish, enabled=False))
    if no_device_plugin:
        cfg = replace(cfg, device_plugin_enabled=False)
    serve(cfg, verbose, config)


def dra_needs_the_api_server(source: Path | None) -> str:
    where = f"{source}: " if source else ""
    return f"{where}dra.enabled: the DRA driver needs the API server (no --no-publish)"


def configured(
    config: Path | None,
    node_name: str | None,
    sysfs_root: str | None,
    kubelet_dir: str | None,
    kubeconfig: Path | None,
    device_plugin_config: Path | None,
    metrics_port: int | None,
    log_format: str | None,
    **more: object,
) -> AgentSettings:
    """The AgentConfig of the file (or the defaults) with the flags that were given on top."""
    # the agent's stack (gRPC, lightkube, prometheus) loads only when the command runs
    from rdmaplane.adapters.config import load
    from rdmaplane.adapters.config.agent import AGENT_CONFIG

    return load(
        config,
        AGENT_CONFIG,
        node_name=node_name,
        sysfs_root=sysfs_root,
        kubelet_dir=kubelet_dir,
        kubeconfig=kubeconfig,
        device_plugin_config=device_plugin_config,
        metrics_port=metrics_port,
        log_format=log_format,
        **more,
    )


def serve(cfg: AgentSettings, verbose: bool, source: Path | None) -> None:
    """Run the agent as `cfg` (read from `source`) says: with the device plugin, the DRA
    driver, or neither."""
    from rdmaplane.adapters.config import load
    from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG
    from rdmaplane.services.agent.root import configured_agent

    where = f"{source}: " if source else ""
    if not cfg.node_name:
        fail(f"{where}nodeName: required (--node-name or $NODE_NAME)")
    # The pools are read with the plugin off too: they say which GID index the node label names,
    # and which ports the DRA driver offers with which plan.
    plugin_config = load(cfg.device_plugin_config, DEVICE_PLUGIN_CONFIG)
    existing_dir("--sysfs-root", cfg.sysfs_root)
    if cfg.device_plugin_enabled or cfg.dra.enabled:
        existing_dir("--kubelet-dir", cfg.kubelet_dir)
    start_logging(cfg.log_format, verbose, cfg.log_level)
    service = configured_agent(cfg, plugin_config)
    try:
        asyncio.run(_serve(service))
    except OSError as e:  # the metrics port unusable (a kubelet folder: ServeError, exit 1)
        fail(str(e), code=1)


async def _serve(service: Agent) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "rdmaplane agent starting",
        extra={"node": service.config.node_name, "pid": os.getpid()},
    )
    await service.run(stop)
