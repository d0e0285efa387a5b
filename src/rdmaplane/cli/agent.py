"""`rdmaplane agent`: the node agent (one per GPU node, run by the DaemonSet)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rdmaplane.cli.common import fail

if TYPE_CHECKING:
    from rdmaplane.agent.config import AgentConfig
    from rdmaplane.agent.plugin import EmbeddedPlugin
    from rdmaplane.agent.service import Agent

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
            "--kubelet-dir", metavar="DIR", help="The kubelet's root. Default: /var/lib/kubelet."
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option("--kubeconfig", metavar="FILE", help="Default: the pod's service account."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", metavar="FILE", help="Agent configuration (YAML)."),
    ] = None,
    device_plugin_config: Annotated[
        Path | None,
        typer.Option(
            "--device-plugin-config", metavar="FILE", help="Pools of the embedded device plugin."
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
        typer.Option("--metrics-port", help="Port of /metrics, /healthz, /readyz. Default: 9478."),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format", help="text or json (one JSON object per line). Default: text."
        ),
    ] = None,
) -> None:
    """Run the node agent: discovery, device plugin, topology publisher, health, fault
    actions (notice, eviction, taint: docs/faults.md), metrics."""
    # the agent's stack (gRPC, lightkube, prometheus) loads only when this command runs
    from lightkube import ConfigError as KubeConfigError

    from rdmaplane.agent import config as agent_config
    from rdmaplane.agent import logs
    from rdmaplane.agent.podresources import PodResourcesClient
    from rdmaplane.agent.service import Agent
    from rdmaplane.deviceplugin.config import ConfigError as PluginConfigError
    from rdmaplane.deviceplugin.server import ServeError
    from rdmaplane.kube import async_client

    overrides: dict[str, object] = {
        "node_name": node_name,
        "sysfs_root": sysfs_root,
        "kubelet_dir": kubelet_dir,
        "kubeconfig": kubeconfig,
        "device_plugin_config": device_plugin_config,
        "metrics_port": metrics_port,
        "log_format": log_format,
    }
    try:
        cfg = agent_config.load(config, **overrides)
    except agent_config.ConfigError as e:
        fail(str(e))
    if no_publish:
        cfg = cfg.model_copy(update={"publish": cfg.publish.model_copy(update={"enabled": False})})
    if no_device_plugin:
        cfg = cfg.model_copy(update={"device_plugin_enabled": False})
    if not cfg.sysfs_root.is_dir():
        fail(f"sysfs root {cfg.sysfs_root} is not a directory")
    logs.configure(cfg.log_format, cfg.log_level)
    try:
        plugin = _plugin(cfg)
        kube = async_client(cfg.kubeconfig) if cfg.publish.enabled else None
    except (PluginConfigError, KubeConfigError) as e:
        fail(str(e))
    resources = [cfg.gpu_resource, *(plugin.resources if plugin else [])]
    pod_resources = PodResourcesClient(cfg.pod_resources_socket, resources)
    service = Agent(cfg, kube=kube, plugin=plugin, allocation_source=pod_resources)
    try:
        asyncio.run(_serve(service))
    except (ServeError, OSError) as e:  # e.g. the kubelet folder or the metrics port unusable
        fail(str(e), code=1)


def _plugin(cfg: AgentConfig) -> EmbeddedPlugin | None:
    from rdmaplane.agent.plugin import EmbeddedPlugin
    from rdmaplane.deviceplugin.config import PluginConfig, load_config

    if not cfg.device_plugin_enabled:
        return None
    plugin_config = (
        load_config(cfg.device_plugin_config) if cfg.device_plugin_config else PluginConfig()
    )
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
