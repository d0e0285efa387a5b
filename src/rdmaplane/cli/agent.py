"""`rdmaplane agent`: the node agent (one per GPU node, run by the DaemonSet)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rdmaplane.cli.common import (
    LogFormatOption,
    VerboseOption,
    config_file,
    existing_dir,
    fail,
    start_logging,
)

if TYPE_CHECKING:
    from rdmaplane.agent.plugin import EmbeddedPlugin
    from rdmaplane.agent.service import Agent
    from rdmaplane.config import AgentConfig, DevicePluginConfig

log = logging.getLogger("rdmaplane.agent")


def agent(
    node_name: Annotated[
        str | None,
        typer.Option("--node-name", envvar="NODE_NAME", help="The Node this agent speaks for."),
    ] = None,
    sysfs_root: Annotated[
        Path | None,
        typer.Option(
            "--sysfs-root", metavar="DIR", help="A tree laid out like /sys. Default: /sys."
        ),
    ] = None,
    kubelet_dir: Annotated[
        Path | None,
        typer.Option(
            "--kubelet-dir",
            metavar="DIR",
            help="The kubelet's root; must exist (with the plugin on). Default: /var/lib/kubelet.",
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option("--kubeconfig", metavar="FILE", help="Default: the pod's service account."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", metavar="FILE", help="An AgentConfig file (YAML or JSON)."),
    ] = None,
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
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            help="Port of /metrics, /healthz, /readyz. Default: 9478.",
        ),
    ] = None,
    log_format: LogFormatOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Run the node agent: discovery, device plugin, topology publisher, health, fault
    actions (notice, eviction, taint: docs/faults.md), metrics."""
    # the agent's stack (gRPC, lightkube, prometheus) loads only when this command runs
    from lightkube import ConfigError as KubeConfigError

    from rdmaplane.agent.podresources import PodResourcesClient
    from rdmaplane.agent.service import Agent
    from rdmaplane.config import AgentConfig, DevicePluginConfig
    from rdmaplane.deviceplugin.server import ServeError
    from rdmaplane.kube import async_client

    cfg = config_file(
        config,
        AgentConfig,
        node_name=node_name,
        sysfs_root=sysfs_root,
        kubelet_dir=kubelet_dir,
        kubeconfig=kubeconfig,
        device_plugin_config=device_plugin_config,
        metrics_port=metrics_port,
        log_format=log_format,
    )
    if not cfg.node_name:
        fail(f"{f'{config}: ' if config else ''}nodeName: required (--node-name or $NODE_NAME)")
    if no_publish:
        cfg = cfg.model_copy(update={"publish": cfg.publish.model_copy(update={"enabled": False})})
    if no_device_plugin:
        cfg = cfg.model_copy(update={"device_plugin_enabled": False})
    # The pools are read with the plugin off too: they say which GID index the node label names.
    plugin_config = config_file(cfg.device_plugin_config, DevicePluginConfig)
    existing_dir("--sysfs-root", cfg.sysfs_root)
    if cfg.device_plugin_enabled:
        existing_dir("--kubelet-dir", cfg.kubelet_dir)
    start_logging(cfg.log_format, verbose, cfg.log_level)
    try:
        kube = async_client(cfg.kubeconfig) if cfg.publish.enabled else None
    except KubeConfigError as e:
        fail(str(e))
    plugin = _plugin(cfg, plugin_config)
    resources = [cfg.gpu_resource, *(plugin.resources if plugin else [])]
    pod_resources = PodResourcesClient(cfg.pod_resources_socket, resources)
    service = Agent(
        cfg,
        kube=kube,
        plugin=plugin,
        allocation_source=pod_resources,
        pools=plugin_config.pools,
    )
    try:
        asyncio.run(_serve(service))
    except (ServeError, OSError) as e:  # e.g. the kubelet folder or the metrics port unusable
        fail(str(e), code=1)


def _plugin(cfg: AgentConfig, plugin_config: DevicePluginConfig) -> EmbeddedPlugin | None:
    from rdmaplane.agent.plugin import EmbeddedPlugin

    if not cfg.device_plugin_enabled:
        return None
    return EmbeddedPlugin(plugin_config, kubelet_dir=cfg.kubelet_dir, dev_root=cfg.dev_root)


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
