"""`rdmaplane webhook` (the admission webhook service) and `rdmaplane inject` (what it would do
to a pod, offline)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from rdmaplane.cli.common import console, err_console, fail
from rdmaplane.documents import DocumentError, read_document
from rdmaplane.webhook.config import ConfigError, WebhookConfig, load_config

app = typer.Typer()

ConfigOption = Annotated[
    Path | None, typer.Option("--config", metavar="FILE", help="WebhookConfig file (YAML).")
]


def _config(path: Path | None) -> WebhookConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        fail(str(exc))


@app.command("webhook")
def webhook(
    config: ConfigOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTPS port.")] = 8443,
    kubeconfig: Annotated[
        Path | None,
        typer.Option("--kubeconfig", metavar="FILE", help="Default: the pod's service account."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Serve the mutating admission webhook over HTTPS (see docs/webhook.md): GPU pods in
    opted-in namespaces, or annotated rdmaplane.io/rdma, get the RDMA resource, IPC_LOCK,
    /dev/shm and the fault-notice volume."""
    from lightkube import ConfigError as KubeConfigError

    from rdmaplane.webhook.service import serve

    if log_level.lower() not in ("debug", "info", "warning", "error"):
        fail(f"--log-level: {log_level!r} is not one of debug, info, warning, error")
    cfg = _config(config)
    if kubeconfig is not None and not kubeconfig.is_file():
        fail(f"--kubeconfig: {kubeconfig}: no such file")
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(serve(cfg, host, port, kubeconfig, log_level.lower()))
    except KubeConfigError as exc:
        fail(f"--kubeconfig: {exc}")
    except KeyboardInterrupt:
        pass


@app.command("inject")
def inject_command(
    pod: Annotated[Path, typer.Argument(help="Pod YAML/JSON, or a workload with a pod template.")],
    config: ConfigOption = None,
    output: Annotated[
        str, typer.Option("-o", "--output", help="yaml (the pod), json (the pod) or patch.")
    ] = "yaml",
) -> None:
    """Show what the webhook does to a pod (or a workload's pod template): the pod as admitted,
    or the JSONPatch; warnings on stderr. Exit 1 when the webhook would refuse it."""
    from rdmaplane.webhook.inject import PodError, mutate

    if output not in ("yaml", "json", "patch"):
        fail(f"-o: {output!r} is not one of yaml, json, patch")
    cfg = _config(config)
    try:
        obj = _pod(read_document(pod), pod)
    except DocumentError as exc:
        fail(str(exc))
    try:
        result = mutate(obj, cfg.policy())
    except PodError as exc:
        fail(f"{pod}: refused: {exc}", 1)
    for warning in result.warnings:
        err_console.print(f"warning: {warning}", markup=False)
    if output == "patch":
        console.print_json(json.dumps(result.patch))
    elif output == "json":
        console.print_json(json.dumps(result.pod))
    else:
        console.print(yaml.safe_dump(result.pod, sort_keys=False), end="", markup=False)


def _pod(doc: object, path: Path) -> dict[str, Any]:
    """The pod in `doc`: a Pod, or the template of a workload (Deployment, Job, ...)."""
    if not isinstance(doc, dict):
        raise DocumentError(f"{path}: expected a Pod or a workload object")
    spec = doc.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    if doc.get("kind") != "Pod" and isinstance(template, dict):
        return template
    if doc.get("kind") != "Pod":
        raise DocumentError(f"{path}: kind {str(doc.get('kind'))[:40]!r} has no pod template")
    return doc
