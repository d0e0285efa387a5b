"""`rdmaplane scheduler-extender` (the service) and `rdmaplane explain-placement` (its
decisions, per node, for a pod — from files or from a cluster)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rdmaplane.cli.common import (
    LogFormatOption,
    VerboseOption,
    config_file,
    fail,
    read_objects,
    start_logging,
)
from rdmaplane.config import SchedulerExtenderConfig
from rdmaplane.documents import DocumentError, printable, read_documents
from rdmaplane.scheduler import placement as pl
from rdmaplane.scheduler.cache import ClusterCache

app = typer.Typer()
ConfigOption = typer.Option(None, "--config", help="A SchedulerExtenderConfig file (YAML or JSON).")


@app.command("scheduler-extender")
def scheduler_extender(
    host: str = typer.Option("0.0.0.0", help="Address to listen on."),
    port: int = typer.Option(8888, min=0, max=65535, help="Port to listen on."),
    kubeconfig: Path | None = typer.Option(
        None, help="Kubeconfig; default: the pod's service account."
    ),
    config: Path | None = ConfigOption,
    tls_cert_file: Path | None = typer.Option(
        None, help="Serve HTTPS with this certificate (PEM; with --tls-key-file)."
    ),
    tls_key_file: Path | None = typer.Option(None, help="... and this key (PEM)."),
    debug_remote: bool = typer.Option(
        False, help="Serve /debug/* to any client, not only on loopback (kubectl port-forward)."
    ),
    log_format: LogFormatOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Serve /filter and /prioritize for kube-scheduler (see docs/scheduler-extender.md)."""
    import uvicorn
    from lightkube import ConfigError as KubeConfigError

    from rdmaplane.kube import load_config
    from rdmaplane.scheduler.app import create_app
    from rdmaplane.scheduler.debugaccess import LoopbackDebug
    from rdmaplane.scheduler.serving import server_config
    from rdmaplane.scheduler.watch import make_client, watch_all

    cfg = config_file(config, SchedulerExtenderConfig)
    tls = _tls_options(tls_cert_file, tls_key_file)
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
    options = {"host": host, "port": port, "log_config": None, "access_log": verbose, **tls}
    served = LoopbackDebug(application, remote=debug_remote)
    uvicorn.Server(server_config(served, **options)).run()


def _tls_options(cert: Path | None, key: Path | None) -> dict[str, str]:
    """uvicorn's HTTPS options, the pair loaded once now so a bad file is said at start."""
    import ssl

    if cert is None and key is None:
        return {}
    for flag, path in (("--tls-cert-file", cert), ("--tls-key-file", key)):
        if path is not None and not path.is_file():
            fail(f"{flag} {path}: not a file")
    if cert is None or key is None:
        fail("--tls-cert-file and --tls-key-file go together")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        fail(f"--tls-cert-file {cert}, --tls-key-file {key}: not a PEM certificate and key: {exc}")
    return {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}


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
    """Why each node would or would not get the pod, and its score. Exit 1 when none fits
    (or the cluster cannot be read), 2 on bad input."""
    if output not in ("table", "json"):
        fail(f"-o {output!r}: choose table or json")
    cfg = config_file(config, SchedulerExtenderConfig)
    cache = ClusterCache(cfg.policy(), cfg.memo_entries, cfg.fabric.tier_labels)
    pod_obj = _workload_pod(pod)
    try:
        request = pl.pod_request(pod_obj, cache.policy.names)
    except pl.RequestError as exc:
        fail(f"{pod}: {exc}")
    if kubeconfig is not None:
        try:
            listed = list_cluster(kubeconfig)
        except ClusterError as exc:
            fail(str(exc), exc.code)
    elif nrt or nodes:
        listed = {
            "nrt": read_objects(nrt, "NodeResourceTopology"),
            "node": read_objects(nodes, "Node"),
            "pod": read_objects(pods, "Pod"),
        }
    else:
        fail("give --nrt/--nodes files or --kubeconfig")
    for kind, objs in listed.items():
        cache.replace(kind, objs)
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
        cells = (r["node"], r["policy"], fits, str(r["score"]), r["alignment"], r["detail"])
        table.add_row(*(escape(printable(str(c))) for c in cells))  # names come from files
    Console(width=200).print(table)


def _workload_pod(path: Path) -> dict[str, Any]:
    """The pod in the file: a Pod, or the `spec.template` of a workload (Job, Deployment...)."""
    try:
        docs = read_documents(path)
    except DocumentError as exc:
        fail(str(exc))
    if not docs:
        fail(f"{path}: no object in the file")
    obj = docs[0]
    if not isinstance(obj, dict):
        fail(f"{path}: expected a Pod or a workload object, got {type(obj).__name__}")
    spec = obj.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    pod = template if obj.get("kind") != "Pod" and isinstance(template, dict) else obj
    if not isinstance(pod.get("metadata") or {}, dict):
        fail(f"{path}: metadata: expected an object")
    return pod


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


class ClusterError(Exception):
    """The cluster cannot be read: `code` 2 for an unusable kubeconfig, 1 when the API server
    cannot be reached or refuses; the message is one line."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def list_cluster(kubeconfig: Path) -> dict[str, list[dict[str, Any]]]:
    """NRTs, nodes and bound pods from the cluster, or `ClusterError`."""
    import httpx2  # lightkube's transport: its errors are what an unreachable server raises
    from lightkube import ApiError, ConfigError, operators
    from lightkube.resources.core_v1 import Node, Pod

    from rdmaplane.kube import NodeResourceTopology, sync_client
    from rdmaplane.scheduler.watch import as_dict

    try:
        client = sync_client(kubeconfig)
    except ConfigError as exc:
        raise ClusterError(str(exc), 2) from None
    bound: dict[str, Any] = {"spec.nodeName": operators.not_equal("")}
    try:
        return {
            "nrt": [as_dict(o) for o in client.list(NodeResourceTopology)],
            "node": [as_dict(o) for o in client.list(Node)],
            "pod": [as_dict(o) for o in client.list(Pod, namespace="*", fields=bound)],
        }
    except ApiError as exc:
        raise ClusterError(f"the API server refused: {exc.status.message or exc}", 1) from None
    except (httpx2.HTTPError, OSError) as exc:
        raise ClusterError(f"cannot reach the API server of {kubeconfig}: {exc}", 1) from None
