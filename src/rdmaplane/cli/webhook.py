"""`rdmaplane webhook` (the admission webhook service) and `rdmaplane inject` (what it would do
to a pod, offline)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from rdmaplane.cli.common import (
    LogFormatOption,
    VerboseOption,
    config_file,
    console,
    err_console,
    fail,
    start_logging,
)
from rdmaplane.config import WebhookConfig
from rdmaplane.documents import DocumentError, read_document

app = typer.Typer()

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", metavar="FILE", help="A WebhookConfig file (YAML or JSON)."),
]


@app.command("webhook")
def webhook(
    config: ConfigOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTPS port.")] = 8443,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            metavar="FILE",
            help="For its Secret and caBundle. Default: the pod's service account.",
        ),
    ] = None,
    log_format: LogFormatOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Serve the mutating admission webhook over HTTPS (see docs/webhook.md): GPU pods in
    opted-in namespaces, or annotated rdmaplane.io/rdma, get the RDMA resource, IPC_LOCK,
    /dev/shm and the fault-notice volume."""
    from lightkube import ConfigError as KubeConfigError

    from rdmaplane.kube import load_config
    from rdmaplane.webhook.service import serve

    cfg = config_file(config, WebhookConfig)
    if not cfg.tls.from_files:  # its own certificate: it needs the API server
        try:
            load_config(kubeconfig)  # none outside a pod: say so now, not in every retry
        except KubeConfigError as exc:
            fail(str(exc))
    start_logging(log_format, verbose)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(cfg, host, port, kubeconfig, access_log=verbose))


@app.command("inject")
def inject_command(
    file: Annotated[
        Path,
        typer.Argument(
            metavar="FILE", help="A Pod, or a workload (Deployment, Job, JobSet, PyTorchJob, ...)."
        ),
    ],
    config: ConfigOption = None,
    output: Annotated[
        str,
        typer.Option("-o", "--output", help="yaml or json (the object as admitted), or patch."),
    ] = "yaml",
) -> None:
    """Show what the webhook does to a pod, or to every pod template of a workload (their pods
    pass through it): the object with the additions, or the JSONPatch per pod (-o patch, keyed
    by the template's JSON pointer); warnings on stderr. Exit 1 when it would refuse a pod."""
    from rdmaplane.webhook.inject import PodError, mutate

    if output not in ("yaml", "json", "patch"):
        fail(f"-o: {output!r} is not one of yaml, json, patch")
    cfg = config_file(config, WebhookConfig)
    try:
        doc = read_document(file)
        pods = _pods(doc, file)
    except DocumentError as exc:
        fail(str(exc))
    policy = cfg.policy()
    patches: dict[str, Any] = {}
    for at, pod in pods:
        where = "".join(f"/{t}" for t in at)
        try:
            result = mutate(pod, policy)
        except PodError as exc:
            fail(f"{file}: {where or 'the pod'}: refused: {exc}", 1)
        for warning in result.warnings:
            err_console.print(f"warning: {where or 'pod'}: {warning}", markup=False)
        patches[where] = result.patch
        if not at:
            doc = result.pod
        else:
            parent: Any = doc
            for token in at[:-1]:
                parent = parent[token]
            parent[at[-1]] = result.pod
    if output == "patch":
        console.print_json(json.dumps(patches[""] if list(patches) == [""] else patches))
    elif output == "json":
        console.print_json(json.dumps(doc))
    else:
        console.print(yaml.safe_dump(doc, sort_keys=False), end="", markup=False)


def _pods(doc: object, path: Path) -> list[tuple[tuple[str | int, ...], dict[str, Any]]]:
    """(path, pod) for the Pod in `doc`, or for every pod template inside a workload: a
    mapping under a `template` key whose `spec` has `containers`."""
    if not isinstance(doc, dict):
        raise DocumentError(f"{path}: expected a Pod or a workload object")
    if doc.get("kind") == "Pod":
        for part in ("metadata", "spec"):
            if not isinstance(doc.get(part, {}), dict):
                raise DocumentError(f"{path}: {part}: expected a mapping")
        if not isinstance(doc.get("spec", {}).get("containers"), list):
            raise DocumentError(f"{path}: spec.containers: expected a list of containers")
        return [((), doc)]
    found: list[tuple[tuple[str | int, ...], dict[str, Any]]] = []
    stack: list[tuple[tuple[str | int, ...], object]] = [((), doc)]
    while stack:
        at, node = stack.pop()
        items = (
            node.items()
            if isinstance(node, dict)
            else enumerate(node)
            if isinstance(node, list)
            else ()
        )
        for key, child in items:
            spec = child.get("spec") if isinstance(child, dict) else None
            if (
                key == "template"
                and isinstance(spec, dict)
                and isinstance(spec.get("containers"), list)
            ):
                found.append(((*at, key), child))
            elif isinstance(child, dict | list):
                stack.append(((*at, key), child))
    if not found:
        raise DocumentError(f"{path}: kind {str(doc.get('kind'))[:40]!r} holds no pod template")
    return sorted(found, key=lambda f: [str(t) for t in f[0]])
