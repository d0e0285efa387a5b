"""`rdmaplane scheduler-extender` (the service) and `rdmaplane explain-placement` (its
decisions, per node, for a pod — from files or from a cluster)."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from rdmaplane.cli.common import (
    LogFormatOption,
    VerboseOption,
    fail,
    read_objects,
    start_logging,
)
from rdmaplane.cli.output import write_json
from rdmaplane.core.errors import RdmaplaneError

app = typer.Typer()
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", metavar="FILE", help="A SchedulerExtenderConfig file (YAML or JSON)."),
]


class PlacementOutput(StrEnum):
    table = "table"
    json = "json"


@app.command("scheduler-extender")
def scheduler_extender(
    host: Annotated[str, typer.Option(metavar="ADDRESS", help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[
        int, typer.Option(metavar="PORT", min=0, max=65535, help="Port to listen on.")
    ] = 8888,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="Kubeconfig [default: the pod's service account]."),
    ] = None,
    config: ConfigOption = None,
    tls_cert_file: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE", help="Serve HTTPS with this certificate (PEM; with --tls-key-file)."
        ),
    ] = None,
    tls_key_file: Annotated[
        Path | None, typer.Option(metavar="FILE", help="... and this key (PEM).")
    ] = None,
    debug_remote: Annotated[
        bool,
        typer.Option(
            help="Serve /debug/* to any client, not only on loopback (kubectl port-forward)."
        ),
    ] = False,
    log_format: LogFormatOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Serve /filter and /prioritize for kube-scheduler (see docs/scheduler-extender.md)."""
    import uvicorn

    from rdmaplane.adapters.config import load
    from rdmaplane.adapters.config.extender import SCHEDULER_EXTENDER_CONFIG
    from rdmaplane.adapters.kube import load_config
    from rdmaplane.services.scheduler.cache import ClusterCache
    from rdmaplane.services.scheduler.debugaccess import LoopbackDebug
    from rdmaplane.services.scheduler.root import create_app, scheduler_calls_first
    from rdmaplane.services.scheduler.serving import server_config
    from rdmaplane.services.scheduler.watch import make_client, watch_all

    cfg = load(config, SCHEDULER_EXTENDER_CONFIG)
    tls = _tls_options(tls_cert_file, tls_key_file)
    load_config(kubeconfig)  # none outside a pod: say so now, not in every watch retry
    start_logging(log_format, verbose)
    cache = ClusterCache.configured(cfg)
    application = create_app(
        cache, cfg, lambda c, restarted: watch_all(c, lambda: make_client(kubeconfig), restarted)
    )
    # uvicorn logs through our handler (log_config=None); each request only with -v
    options = {"host": host, "port": port, "log_config": None, "access_log": verbose, **tls}
    served = scheduler_calls_first(application, LoopbackDebug(application, remote=debug_remote))
    direct = application.state.direct_calls
    uvicorn.Server(server_config(served, direct, **options)).run()


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
    pod: Annotated[
        Path,
        typer.Argument(
            metavar="FILE",
            help="A Pod, or a workload (Job, Deployment, JobSet, PyTorchJob, ...): every pod "
            "template in the file (many documents and Lists are fine; - for standard input).",
        ),
    ],
    nrt: Annotated[
        list[Path],
        typer.Option(
            "--nrt", metavar="FILE...", help="NodeResourceTopology YAML (one or more; Lists ok)."
        ),
    ] = [],  # noqa: B006 (typer reads the default)
    nodes: Annotated[
        list[Path],
        typer.Option(
            "--nodes",
            metavar="FILE...",
            help="Node YAML: RDMAReady, fabric tiers, nodes without NRT.",
        ),
    ] = [],  # noqa: B006
    pods: Annotated[
        list[Path],
        typer.Option(
            "--pods", metavar="FILE...", help="Bound pods (not yet in the NRTs; a job's peers)."
        ),
    ] = [],  # noqa: B006
    kubeconfig: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="Read NRTs, nodes and pods from this cluster instead."),
    ] = None,
    config: ConfigOption = None,
    output: Annotated[PlacementOutput, typer.Option("-o", "--output", help="table or json.")] = (
        PlacementOutput.table
    ),
    webhook: Annotated[
        bool,
        typer.Option(
            "--webhook/--no-webhook",
            help="Explain each pod as rdmaplane's webhook admits it (its default policy, an "
            "opted-in namespace): a GPU pod asks the RDMA devices the webhook adds.",
        ),
    ] = True,
) -> None:
    """Why each node would or would not get each pod of FILE, and its score: the extender's
    own filter, then its prioritize over the nodes that passed (the job-aware fabric term
    included), as kube-scheduler calls them. Put FILE first: --nrt/--nodes/--pods take every
    file that follows them. Exit 1 when a pod fits nowhere (or the cluster cannot be read), 2
    on bad input."""
    from rdmaplane.adapters.config import load
    from rdmaplane.adapters.config.extender import SCHEDULER_EXTENDER_CONFIG
    from rdmaplane.adapters.documents import source_name
    from rdmaplane.services.scheduler.cache import ClusterCache
    from rdmaplane.services.scheduler.decisions import Decisions
    from rdmaplane.services.scheduler.policy import podrequest

    cfg = load(config, SCHEDULER_EXTENDER_CONFIG)
    cache = ClusterCache.configured(cfg)
    templates = _pod_templates(pod, cfg.resources.gpus)
    if webhook:
        templates = [(label, _as_admitted(label, c)) for label, c in templates]
    for label, candidate in templates:  # a pod that cannot be read: said before the nodes are
        try:
            podrequest.pod_request(candidate)
        except podrequest.RequestError as exc:
            fail(f"{source_name(pod)}: {label}: {exc}")
    if kubeconfig is not None:
        listed = list_cluster(kubeconfig)
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
    names = sorted({_name(o) for objs in (listed["nrt"], listed["node"]) for o in objs})
    decide = Decisions(cache, cfg.fabric)
    explained = [{"pod": label, **decide.explain(c, names)} for label, c in templates]
    if output is PlacementOutput.json:
        write_json(explained[0] if len(explained) == 1 else explained)
    else:
        for one in explained:
            _print_table(one)
    fits_somewhere = all(any(r["fits"] for r in one["nodes"]) for one in explained)
    raise typer.Exit(0 if fits_somewhere else 1)


def _print_table(explained: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from rdmaplane.core.untrusted import printable

    total = explained["request"]["total"]
    asking = ", ".join(f"{count} {name}" for name, count in total.items()) or "no device"
    title = f"placement of {explained['pod']}: asking {asking}"
    job = explained["job"]
    if job is not None:
        left = "" if job["remaining"] is None else f", {job['remaining']} to place"
        title += f"; its job: {job['boundPeers']} bound peer(s){left}"
    table = Table(title=escape(printable(title)))
    for col in ("NODE", "POLICY", "FITS", "SCORE", "ALIGNMENT", "DETAIL"):
        table.add_column(col)
    for r in explained["nodes"]:
        fits = "yes" if r["fits"] else ("never" if r["unresolvable"] else "no")
        score = str(r["score"])
        if "fabricTerm" in r:
            score += f" (node {r['nodeScore']}, fabric {r['fabricTerm']:g})"
        cells = (r["node"], r["policy"], fits, score, r["alignment"], r["detail"])
        table.add_row(*(escape(printable(str(c))) for c in cells))  # names come from files
    Console(width=200).print(table)


def _pod_templates(path: Path, gpus: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """(label, pod) for every pod template of the file's objects (`-`: standard input; other
    objects skipped, a warning for each that asks GPUs in a kind rdmaplane does not read);
    exit 2 when there is none."""
    from rdmaplane.adapters.documents import manifest_objects, read_documents, source_name
    from rdmaplane.cli.common import err_console
    from rdmaplane.core.workloads import label, manifest_templates, pod_of, unread_gpu_workloads

    source = source_name(path)
    objects = manifest_objects(read_documents(path), source)
    for warning in unread_gpu_workloads(objects, gpus):
        err_console.print(f"warning: {warning}", markup=False, soft_wrap=True)
    found = manifest_templates(objects, source)
    return [(f"{label(obj)} {t.pointer}".rstrip(), pod_of(obj, t)) for obj, ts in found for t in ts]


def _as_admitted(label: str, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as rdmaplane's webhook admits it (the API server calls it before the scheduler
    sees the pod); what the webhook says, and why it is not called, on stderr."""
    from rdmaplane.adapters.config import load
    from rdmaplane.adapters.config.webhook import WEBHOOK_CONFIG
    from rdmaplane.cli.common import err_console
    from rdmaplane.services.webhook.policy.inject import PodError, mutate, not_sent

    def warn(message: str) -> None:
        err_console.print(f"warning: {label}: {message}", markup=False, soft_wrap=True)

    policy = load(None, WEBHOOK_CONFIG)
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    why = not_sent(pod, namespace, True, policy)
    if why is not None:
        warn(f"the webhook is not called: {why}; explained as it is")
        return pod
    try:
        result = mutate(pod, policy)
    except PodError as exc:
        fail(f"{label}: the webhook refuses it: {exc}", 1)
    for said in result.warnings:
        warn(said)
    added = [
        f"{op['path'].rpartition('/')[2].replace('~1', '/')}: {op['value']}"
        for op in result.patch
        if "/resources/" in str(op.get("path")) and isinstance(op.get("value"), str)
    ]
    if added:
        warn(f"explained as the webhook admits it (--no-webhook: as written): {', '.join(added)}")
    return dict(result.pod)


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


class ClusterError(RdmaplaneError):
    """The API server cannot be reached or refuses (exit 1); the message is one line."""


def list_cluster(
    kubeconfig: Path, kinds: tuple[str, ...] = ("nrt", "node", "pod")
) -> dict[str, list[dict[str, Any]]]:
    """NRTs, nodes and bound pods from the cluster (those of `kinds`); `KubeconfigError` for an
    unusable kubeconfig, `ClusterError` when the server cannot be read."""
    import httpx2  # lightkube's transport: its errors are what an unreachable server raises
    from lightkube import ApiError, operators
    from lightkube.resources.core_v1 import Node, Pod

    from rdmaplane.adapters.kube import NodeResourceTopology, sync_client
    from rdmaplane.services.scheduler.watch import as_dict

    client = sync_client(kubeconfig)
    bound: dict[str, Any] = {"spec.nodeName": operators.not_equal("")}

    def listed(kind: str) -> list[dict[str, Any]]:
        if kind == "nrt":
            return [as_dict(o) for o in client.list(NodeResourceTopology)]
        if kind == "node":
            return [as_dict(o) for o in client.list(Node)]
        return [as_dict(o) for o in client.list(Pod, namespace="*", fields=bound)]

    try:
        return {kind: listed(kind) for kind in kinds}
    except ApiError as exc:
        raise ClusterError(f"the API server refused: {exc.status.message or exc}") from None
    except (httpx2.HTTPError, OSError) as exc:
        raise ClusterError(f"cannot reach the API server of {kubeconfig}: {exc}") from None
