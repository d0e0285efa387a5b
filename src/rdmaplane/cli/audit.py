"""`rdmaplane audit`: firmware versions and PCIe links across nodes, and the outliers."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rdmaplane.cli.common import (
    NodeDocumentsArgument,
    SamplesOption,
    SnapshotsOption,
    fail,
    load_nodes,
    read_objects,
)

if TYPE_CHECKING:
    from rdmaplane.core.audit import Audit, NodeFacts


class AuditFormat(StrEnum):
    table = "table"
    json = "json"


def audit_command(
    files: NodeDocumentsArgument = None,
    snapshot: SnapshotsOption = None,
    sample: SamplesOption = None,
    nrt: Annotated[
        list[Path] | None,
        typer.Option(
            "--nrt",
            metavar="FILE...",
            help="NodeResourceTopology YAML the agents published (one or more; Lists ok).",
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="Read the NodeResourceTopology objects of this cluster."),
    ] = None,
    output: Annotated[AuditFormat, typer.Option("-o", "--output", help="table or json.")] = (
        AuditFormat.table
    ),
) -> None:
    """Which nodes run another firmware than the rest of the fleet's HCAs of their kind, and
    which PCIe links (NICs, GPUs) trained short of their slot. Put the node documents first:
    --nrt takes every file that follows it. Exit 1 when there are outliers (or the cluster
    cannot be read), 2 on bad input."""
    from rdmaplane.core.audit import audit

    nodes = [_topology_facts(t) for t in load_nodes(files, snapshot, sample)]
    objects = read_objects(nrt or (), "NodeResourceTopology")
    if kubeconfig is not None:
        from rdmaplane.cli.scheduler import list_cluster

        objects += list_cluster(kubeconfig, ("nrt",))["nrt"]
    nodes += [_nrt_facts(o) for o in objects]
    if not nodes:
        fail("give node documents, --snapshot FILE, --sample NAME, --nrt FILE or --kubeconfig")
    result = audit(_unique(nodes))
    if output == AuditFormat.json:
        from rdmaplane.cli.output import write_json

        write_json(_document(result))
    else:
        _print(result)
    if result.outliers:
        raise typer.Exit(1)


def _topology_facts(topo: Any) -> NodeFacts:
    from rdmaplane.core.audit import facts_of

    return facts_of(topo.hostname or topo.source or "node", topo)


def _nrt_facts(obj: dict[str, Any]) -> NodeFacts:
    from rdmaplane.core.audit import facts_from_attributes

    name = str(obj["metadata"]["name"])
    attrs = {
        str(a.get("name")): str(a.get("value"))
        for a in obj.get("attributes") or ()
        if isinstance(a, dict)
    }
    try:
        return facts_from_attributes(name, attrs)
    except ValueError as e:
        fail(f"NodeResourceTopology {name}: attributes: {e}")


def _unique(nodes: list[NodeFacts]) -> list[NodeFacts]:
    """Nodes named twice (a sample given twice) made apart with `#2`, in input order."""
    from dataclasses import replace

    seen: dict[str, int] = {}
    out = []
    for n in nodes:
        seen[n.node] = seen.get(n.node, 0) + 1
        out.append(n if seen[n.node] == 1 else replace(n, node=f"{n.node}#{seen[n.node]}"))
    return out


def _print(result: Audit) -> None:
    from rich.markup import escape
    from rich.table import Table

    from rdmaplane.cli.common import console as out
    from rdmaplane.core.untrusted import printable

    for kind, version in result.fleet_firmware.items():
        out.print(f"fleet firmware: {escape(printable(kind))} {escape(printable(version))}")
    if not result.outliers:
        out.print(f"[green]no outliers[/] among {len(result.nodes)} node(s)")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("NODE", "DEVICE", "WHAT", "WHY"):
        table.add_column(col)
    for o in result.outliers:
        table.add_row(*(escape(printable(c)) for c in (o.node, o.device, o.what, o.why)))
    out.print(table)
    out.print(f"[red]{len(result.outliers)} outlier(s)[/] among {len(result.nodes)} node(s)")


def _document(result: Audit) -> dict[str, Any]:
    return {
        "fleet_firmware": dict(result.fleet_firmware),
        "nodes": [
            {
                "node": n.node,
                "firmware": [
                    {"device": f.device, "kind": f.kind, "version": f.version} for f in n.firmware
                ],
                "downtrained": [{"device": d, "why": why} for d, why in n.downtrained],
            }
            for n in result.nodes
        ],
        "outliers": [
            {"node": o.node, "device": o.device, "what": o.what, "why": o.why}
            for o in result.outliers
        ],
    }
