"""`rdmaplane scheduler-extender` (the service) and `rdmaplane explain-placement` (its
decisions, per node, for a pod — from files or from a cluster)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from rdmaplane.cli.common import (
    LogFormatOption,
    VerboseOption,
    config_file,
    fail,
    start_logging,
)
from rdmaplane.config import SchedulerExtenderConfig
from rdmaplane.scheduler import placement as pl
from rdmaplane.scheduler.cache import ClusterCache

app = typer.Typer()
ConfigOption = typer.Option(None, "--config", help="A SchedulerExtenderConfig file (YAML or JSON).")


@app.command("scheduler-extender")
def scheduler_extender(
    host: str = typer.Option("0.0.0.0", help="Address to listen on."),
    port: int = typer.Option(8888, help="Port to listen on."),
    kubeconfig: Path | None = typer.Option(
        None, help="Kubeconfig; default: the pod's service account."
    ),
    config: Path | None = ConfigOption,
    log_format: LogFormatOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Serve /filter and /prioritize for kube-scheduler (see docs/scheduler-extender.md)."""
    import uvicorn
    from lightkube import ConfigError as KubeConfigError

    from rdmaplane.kube import load_config
    from rdmaplane.scheduler.app import create_app
    from rdmaplane.scheduler.watch import make_client, watch_all

    cfg = config_file(config, SchedulerExtenderConfig)
    try:
        load_config(kubeconfig)  # none outside a pod: say so now, not in every watch retry
    except KubeConfigError as exc:
        fail(str(exc))
    start_logging(log_format, verbose)
    cache = ClusterCache(cfg.policy(), cfg.memo_entries, cfg.fabric.tier_labels)
    application = create_app(
        cache, cfg, lambda c, restarted: watch_all(c, lambda: make_client(kubeconfig), restarted)
    )
    # uvicorn logs through our handler (log_config=None); each request only with -v
    uvicorn.run(application, host=host, port=port, log_config=None, access_log=verbose)


@app.command("explain-placement")
def explain_placement(
    pod: Path = typer.Argument(..., help="Pod YAML (or a workload with spec.template)."),
    nrt: list[Path] = typer.Option(
        [], "--nrt", help="NodeResourceTopology YAML (repeatable; lists ok)."
    ),
    nodes: list[Path] = typer.Option(
        [], "--nodes", help="Node YAML (repeatable): RDMAReady, nodes without NRT."
    ),
    pods: list[Path] = typer.Option(
        [], "--pods", help="Bound pods YAML (repeatable) not yet in the NRTs."
    ),
    kubeconfig: Path | None = typer.Option(
        None, help="Read NRTs, nodes and pods from this cluster instead."
    ),
    config: Path | None = ConfigOption,
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Why each node would or would not get the pod, and its score. Exit 1 when none fits."""
    if output not in ("table", "json"):
        typer.echo("error: -o must be table or json", err=True)
        raise typer.Exit(2)
    cfg = config_file(config, SchedulerExtenderConfig)
    cache = ClusterCache(cfg.policy(), cfg.memo_entries, cfg.fabric.tier_labels)
    try:
        pod_obj = _workload_pod(next(_documents(pod), None), pod)
        if kubeconfig is not None:
            listed = list_cluster(kubeconfig)
        elif nrt or nodes:
            listed = {
                "nrt": [d for p in nrt for d in _documents(p)],
                "node": [d for p in nodes for d in _documents(p)],
                "pod": [d for p in pods for d in _documents(p)],
            }
        else:
            typer.echo("error: give --nrt/--nodes files or --kubeconfig", err=True)
            raise typer.Exit(2)
        for kind, objs in listed.items():
            cache.replace(kind, objs)
        request = pl.pod_request(pod_obj, cache.policy.names)
    except (OSError, yaml.YAMLError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    from rdmaplane.scheduler.app import explain_request, explain_rows

    names = sorted({_name(o) for objs in (listed["nrt"], listed["node"]) for o in objs})
    rows = explain_rows(cache, list(zip(names, cache.verdicts(names, request), strict=True)))
    if output == "json":
        typer.echo(json.dumps({"request": explain_request(request), "nodes": rows}, indent=2))
    else:
        _print_table(request, rows)
    raise typer.Exit(0 if any(r["fits"] for r in rows) else 1)


def _print_table(request: pl.PodRequest, rows: list[dict[str, Any]]) -> None:
    gpus, hcas, shared = request.total
    table = Table(title=f"placement of a pod asking {gpus} GPU, {hcas} HCA, {shared} shared slot")
    for col in ("NODE", "POLICY", "FITS", "SCORE", "ALIGNMENT", "DETAIL"):
        table.add_column(col)
    for r in rows:
        fits = "yes" if r["fits"] else ("never" if r["unresolvable"] else "no")
        table.add_row(r["node"], r["policy"], fits, str(r["score"]), r["alignment"], r["detail"])
    Console(width=200).print(table)


def _documents(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and isinstance(doc.get("items"), list):
            yield from (d for d in doc["items"] if isinstance(d, dict))
        elif isinstance(doc, dict):
            yield doc
        elif doc is not None:
            raise ValueError(f"{path}: expected Kubernetes objects, found {type(doc).__name__}")


def _workload_pod(obj: dict[str, Any] | None, path: Path) -> dict[str, Any]:
    if obj is None:
        raise ValueError(f"{path}: no object in the file")
    template = (obj.get("spec") or {}).get("template")
    if obj.get("kind") != "Pod" and isinstance(template, dict):
        return template
    return obj


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def list_cluster(kubeconfig: Path) -> dict[str, list[dict[str, Any]]]:
    from lightkube import operators
    from lightkube.resources.core_v1 import Node, Pod

    from rdmaplane.kube import NodeResourceTopology, sync_client
    from rdmaplane.scheduler.watch import as_dict

    client = sync_client(kubeconfig)
    bound: dict[str, Any] = {"spec.nodeName": operators.not_equal("")}
    return {
        "nrt": [as_dict(o) for o in client.list(NodeResourceTopology)],
        "node": [as_dict(o) for o in client.list(Node)],
        "pod": [as_dict(o) for o in client.list(Pod, namespace="*", fields=bound)],
    }
