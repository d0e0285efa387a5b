"""`rdmaplane webhook` (the admission webhook service) and `rdmaplane inject` (what it would do
to a pod, offline)."""

from __future__ import annotations

import asyncio
import contextlib
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from rdmaplane.cli.common import (
    LogFormatOption,
    VerboseOption,
    fail,
    start_logging,
)

app = typer.Typer()

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", metavar="FILE", help="A WebhookConfig file (YAML or JSON)."),
]


@app.command("webhook")
def webhook(
    config: ConfigOption = None,
    host: Annotated[str, typer.Option(metavar="ADDRESS", help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(metavar="PORT", min=1, max=65535, help="HTTPS port.")] = 8443,
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
    from rdmaplane.adapters.config import load
    from rdmaplane.adapters.config.webhook import WEBHOOK_CONFIG
    from rdmaplane.adapters.kube import load_config
    from rdmaplane.services.webhook.root import serve

    cfg = load(config, WEBHOOK_CONFIG)
    if not cfg.tls.from_files:  # its own certificate: it needs the API server
        load_config(kubeconfig)  # none outside a pod: say so now, not in every retry
    start_logging(log_format, verbose)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(cfg, host, port, kubeconfig, access_log=verbose))


class InjectOutput(StrEnum):
    yaml = "yaml"
    json = "json"
    patch = "patch"


@app.command("inject")
def inject_command(
    file: Annotated[
        Path,
        typer.Argument(
            metavar="FILE",
            help="A manifest (- for standard input): Pods and workloads (Deployment, Job, "
            "JobSet, PyTorchJob, LeaderWorkerSet, ...), one or many documents or a List.",
        ),
    ],
    config: ConfigOption = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="The namespace the objects go to [default: each object's own, else default].",
        ),
    ] = None,
    not_opted_in: Annotated[
        bool,
        typer.Option(
            "--not-opted-in",
            help="The namespace lacks the rdmaplane.io/inject=enabled label: only pods "
            "annotated rdmaplane.io/rdma are sent to the webhook.",
        ),
    ] = False,
    output: Annotated[
        InjectOutput,
        typer.Option("-o", "--output", help="yaml or json (the objects as admitted), or patch."),
    ] = InjectOutput.yaml,
) -> None:
    """Show what the webhook does to each pod of a manifest: a Pod, or every pod template of
    a workload (their pods pass through it). Each object comes out in order, with the
    additions (other objects exactly as they are), or the JSONPatch per pod template (-o
    patch: a Pod's list; a workload's keyed by the template's JSON pointer; several objects
    keyed by Kind/namespace/name). A pod the API server would not send to the webhook
    (exempt namespace, no GPU in limits, opted out) is left as it is, and the warnings on
    stderr say why; so is an object of a kind rdmaplane does not read that asks GPUs
    (RayCluster, InferenceService, ...). Exit 1 when the webhook would refuse a pod."""
    import copy

    from rdmaplane.adapters.config import load
    from rdmaplane.adapters.config.webhook import WEBHOOK_CONFIG
    from rdmaplane.adapters.documents import manifest_objects, read_documents, source_name
    from rdmaplane.core.workloads import label, manifest_templates, pod_of, unread_gpu_workloads
    from rdmaplane.services.scheduler.policy.podrequest import RequestError, pod_request
    from rdmaplane.services.webhook.policy.inject import PodError, mutate, not_sent

    policy = load(config, WEBHOOK_CONFIG)
    source = source_name(file)
    docs = copy.deepcopy(read_documents(file))
    objects = manifest_objects(docs, source)
    for warning in unread_gpu_workloads(objects, policy.resources.gpus):
        _warn(warning)
    templates = manifest_templates(objects, source)
    patches: dict[str, dict[str, Any]] = {}
    for obj, found in templates:
        ns = str(namespace or _meta(obj).get("namespace") or "default")
        key = label(obj, ns)
        done: dict[str, Any] = {}
        for t in found:
            where = f"{key} {t.pointer}".rstrip()
            try:  # what the scheduler extender (and the API server) will refuse, said here too
                pod_request(pod_of(obj, t))
            except RequestError as exc:
                _warn(f"{where}: the scheduler extender refuses this pod: {exc}")
            why = not_sent(t.template, ns, not not_opted_in, policy)
            if why is not None:
                _warn(f"{where}: the webhook is not called: {why}; left as it is")
                done[t.pointer] = []
                continue
            try:
                result = mutate(t.template, policy, str(ns))
            except PodError as exc:
                fail(f"{source}: {where}: refused: {exc}", 1)
            for warning in result.warnings:
                _warn(f"{where}: {warning}")
            done[t.pointer] = result.patch
            _replace(obj, t.path, result.pod)
        if key in patches:  # the same object twice: both shown, the second as applied last
            _warn(f"{source}: {key} given more than once; kubectl apply keeps the last")
            key += f" ({sum(k.split(' (')[0] == key for k in patches) + 1})"
        patches[key] = done
    _print(docs, patches, output)


def _warn(message: str) -> None:
    from rdmaplane.cli.common import err_console

    err_console.print(f"warning: {message}", markup=False, soft_wrap=True)


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _replace(obj: dict[str, Any], path: tuple[str | int, ...], new: dict[str, Any]) -> None:
    """Put `new` at `path` in `obj` (the empty path: `obj` becomes `new`)."""
    if not path:
        obj.clear()
        obj.update(new)
        return
    parent: Any = obj
    for token in path[:-1]:
        parent = parent[token]
    parent[path[-1]] = new


def _print(docs: list[object], patches: dict[str, dict[str, Any]], output: InjectOutput) -> None:
    """The documents as they came (many: a YAML stream, or a List in JSON), or the patches:
    a Pod's list, a workload's per template pointer, several objects' per
    `Kind/namespace/name`. Written by the serializer straight to stdout (cli/output.py)."""
    from rdmaplane.cli.output import write_json, write_yaml

    if output is InjectOutput.patch:
        per_object = [p[""] if list(p) == [""] else p for p in patches.values()]
        shown: Any = (
            per_object[0] if len(per_object) == 1 else dict(zip(patches, per_object, strict=True))
        )
        write_json(shown)
    elif output is InjectOutput.json:
        shown = docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List", "items": docs}
        write_json(shown)
    else:
        write_yaml(docs)
