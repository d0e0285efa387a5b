"""`rdmaplane fabric show` (where nodes sit on the fabric, as a table, JSON or a Graphviz
picture) and `rdmaplane fabric export --kueue | --volcano` (the same fabric for gang
schedulers). Both read the fabric from a fabric file, from Node (and NRT) files, or from a
cluster."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rdmaplane.cli.common import fail, read_objects
from rdmaplane.cli.output import write_json, write_text, write_yaml
from rdmaplane.core import fabric as fab
from rdmaplane.core import names
from rdmaplane.core.fabric_export import KUEUE_API_VERSION

if TYPE_CHECKING:
    from rich.table import Table

SCHEMA = names.FABRIC_SCHEMA
OBJECT_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # RFC 1123 subdomain

app = typer.Typer(
    help="The fabric between nodes: tiers, rails, where a job's pods are; exports for gang "
    "schedulers (docs/fabric.md).",
    no_args_is_help=True,
)

FabricFile = Annotated[
    Path | None,
    typer.Option("--fabric-file", metavar="FILE", help="A `kind: Fabric` file (docs/fabric.md)."),
]
NodesFile = Annotated[
    list[Path],
    typer.Option("--nodes", metavar="FILE", help="Node YAML/JSON (a List is fine); repeatable."),
]
NrtFile = Annotated[
    list[Path],
    typer.Option("--nrt", metavar="FILE", help="NodeResourceTopology files: per-HCA rails."),
]
Kubeconfig = Annotated[
    Path | None,
    typer.Option("--kubeconfig", metavar="FILE", help="Read Nodes, NRTs and pods from a cluster."),
]
TierLabel = Annotated[
    list[str],
    typer.Option(
        "--tier-label",
        metavar="KEY",
        help="Node label keys of the tiers, closest first (repeat per tier) [default: the "
        "topograph, GKE, EKS and OCI schemes; for a fabric file fabric.topograph.run/tier-N].",
    ),
]


@dataclass
class FabricView:
    """What the commands show or export: node locations and the label keys of their tiers."""

    locations: dict[str, fab.Location]
    tier_keys: tuple[str, ...] | None
    pods: list[dict[str, Any]] = field(default_factory=list)


def load_view(
    fabric_file: Path | None,
    nodes: list[Path],
    nrts: list[Path],
    pods: list[Path],
    kubeconfig: Path | None,
    tier_labels: list[str],
) -> FabricView:
    """The fabric from exactly one kind of source; an `InputError` (exit 2) on bad input."""
    from rdmaplane.adapters.config.fabric import fabric_from_document
    from rdmaplane.adapters.documents import read_document
    from rdmaplane.cli.scheduler import list_cluster
    from rdmaplane.services.scheduler.cache import ClusterCache

    given = [bool(fabric_file), bool(nodes or nrts), kubeconfig is not None]
    if sum(given) != 1:
        fail("give one source: --fabric-file, --nodes/--nrt files, or --kubeconfig")
    if fabric_file is not None:
        doc = read_document(fabric_file)
        where = fabric_from_document(doc, str(fabric_file)).locations()
        pods_given = read_objects(pods, "Pod")
        return FabricView(where, tuple(tier_labels) or fab.DEFAULT_TIER_LABELS, pods_given)
    if kubeconfig is not None:
        listed = list_cluster(kubeconfig)
    else:
        listed = {
            "node": read_objects(nodes, "Node"),
            "nrt": read_objects(nrts, "NodeResourceTopology"),
            "pod": read_objects(pods, "Pod"),
        }
    schemes = [tuple(tier_labels)] if tier_labels else fab.DEFAULT_LABEL_SCHEMES
    cache = ClusterCache(tier_schemes=schemes)
    cache.replace("node", listed["node"])
    cache.replace("nrt", listed["nrt"])
    found = {fab.scheme_of(_labels(n), schemes) for n in listed["node"]} - {None}
    keys = found.pop() if len(found) == 1 else None  # Kueue levels need one scheme
    return FabricView(dict(cache.locations), keys, listed["pod"])


def resolved(view: FabricView) -> tuple[dict[str, fab.Location], fab.TierTree]:
    """The one fabric `show` and `export` both read: the tree the nodes' locations fold into,
    each contradiction warned about on stderr, and the locations of the nodes it kept (a node
    left out of the tree is left out of the table too)."""
    from rdmaplane.cli.common import err_console

    shape = fab.tree(view.locations)
    for problem in shape.problems:
        err_console.print(f"[yellow]warning:[/] {problem}", markup=True, soft_wrap=True)
    kept = {n for members in shape.nodes_under.values() for n in members}
    return {n: loc for n, loc in view.locations.items() if n in kept}, shape


def _labels(node: dict[str, Any]) -> dict[str, str]:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return {k: v for k, v in labels.items() if isinstance(v, str)}


class FabricOutput(StrEnum):
    table = "table"
    json = "json"
    dot = "dot"


@app.command("show")
def show(
    fabric_file: FabricFile = None,
    nodes: NodesFile = [],  # noqa: B006 (typer reads the default)
    nrt: NrtFile = [],  # noqa: B006
    pods: Annotated[
        list[Path], typer.Option("--pods", metavar="FILE", help="Pods, to place --job.")
    ] = [],  # noqa: B006
    kubeconfig: Kubeconfig = None,
    tier_label: TierLabel = [],  # noqa: B006
    job: Annotated[
        str | None,
        typer.Option(
            "--job",
            metavar="NAME",
            help="Mark where this job's pods are (its group: Job, JobSet, "
            "LeaderWorkerSet, rdmaplane.io/group ... name).",
        ),
    ] = None,
    output: Annotated[FabricOutput, typer.Option("-o", "--output", help="table, json or dot.")] = (
        FabricOutput.table
    ),
) -> None:
    """Where every node sits: its tier ids, closest first, and its rails. `-o dot` draws the
    tree (render with `dot -Tsvg`)."""
    from rdmaplane.cli.common import console, err_console

    if job and not pods and kubeconfig is None:
        fail(f"--job {job}: give the bound pods with --pods FILE (or --kubeconfig)")
    view = load_view(fabric_file, nodes, nrt, pods, kubeconfig, tier_label)
    locations, shape = resolved(view)
    marked = job_pods(view.pods, job) if job else {}
    if job and not marked:
        err_console.print(f"[yellow]warning:[/] no bound pod of job {job!r} found")
    if output is FabricOutput.json:
        write_json(show_document(locations, view.tier_keys, shape, marked))
    elif output is FabricOutput.dot:
        write_text(dot_text(locations, shape, marked) + "\n")
    else:
        console.print(show_table(locations, shape.depth, marked))


def job_pods(pods: list[dict[str, Any]], job: str) -> dict[str, list[str]]:
    """Node → pod names of the job's bound pods (the job named bare or as namespace/name)."""
    from rdmaplane.services.scheduler.cache import pod_key
    from rdmaplane.services.scheduler.policy.jobaware import pod_group

    out: dict[str, list[str]] = {}
    for p in pods:
        group = pod_group(p).group or ""
        node = (p.get("spec") or {}).get("nodeName")
        if node and job in (group, group.partition("/")[2]):
            out.setdefault(node, []).append(pod_key(p))
    return out


def show_document(
    locations: dict[str, fab.Location],
    tier_keys: tuple[str, ...] | None,
    shape: fab.TierTree,
    marked: dict[str, list[str]],
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "tiers": shape.depth,
        "tierLabels": list(tier_keys or ()),
        "nodes": [
            {
                "name": name,
                "tiers": list(loc.tiers),
                "rails": [{"rail": r, "switch": s} for r, s in loc.rails],
                "pods": marked.get(name, []),
            }
            for name, loc in sorted(locations.items())
        ],
        "problems": list(shape.problems),
    }


def show_table(
    locations: dict[str, fab.Location], depth: int, marked: dict[str, list[str]]
) -> Table:
    from rich.table import Table

    switches = len({loc.tier0 for loc in locations.values()})
    table = Table(title=f"{len(locations)} nodes under {switches} tier-0 switches, {depth} tiers")
    table.add_column("NODE")
    for tier in range(depth):
        table.add_column(f"TIER-{tier}")
    table.add_column("RAILS")
    if marked:
        table.add_column("PODS")
    for name, loc in sorted(locations.items(), key=lambda kv: (kv[1].tiers[::-1], kv[0])):
        tiers = [*loc.tiers, *[""] * (depth - len(loc.tiers))]
        rails = " ".join(f"{r}:{s}" for r, s in loc.rails)
        row = [name, *tiers, rails]
        if marked:
            row.append(", ".join(marked.get(name, [])))
        table.add_row(*row)
    return table


def dot_text(
    locations: dict[str, fab.Location], shape: fab.TierTree, marked: dict[str, list[str]]
) -> str:
    """Tier ids as boxes, one rank per tier, the widest on top; nodes below their tier-0 id
    (or below the rail switches they plug into, edges labelled with the rail); the job's nodes
    filled."""
    out = [
        "digraph fabric {",
        "  rankdir=TB; node [fontname=Helvetica, fontsize=10]; edge [arrowhead=none];",
    ]
    for tier in reversed(range(shape.depth)):
        ids = shape.ids(tier)
        out.append(f"  {{ rank=same; {' '.join(_id(f't{tier}', i) + ';' for i in ids)} }}")
        out += [f'  {_id(f"t{tier}", i)} [shape=box, label="{_esc(i)}"];' for i in ids]
    out += [
        f"  {_id(f't{tier + 1}', parent)} -> {_id(f't{tier}', child)};"
        for (tier, child), parent in sorted(shape.parents.items())
    ]
    rail_switches: set[tuple[str, str]] = set()
    for name, loc in sorted(locations.items()):
        pods = marked.get(name, [])
        style = ', style=filled, fillcolor="gold"' if pods else ""
        text = "\\n".join([_esc(name), *(_esc(p) for p in pods)])
        out.append(f'  {_id("n", name)} [shape=ellipse, label="{text}"{style}];')
        if loc.rails and loc.tier0 is not None:
            for rail, switch in loc.rails:
                # a rail on the node's own tier-0 switch (all its NICs on one leaf) hangs
                # from that switch's box; another rail from its own dashed box below it
                above = _id("t0", switch) if switch == loc.tier0 else _id("r", switch)
                if switch != loc.tier0:
                    rail_switches.add((loc.tier0, switch))
                out.append(f'  {above} -> {_id("n", name)} [label="{rail}"];')
        elif loc.tier0 is not None:
            out.append(f"  {_id('t0', loc.tier0)} -> {_id('n', name)};")
    for tier0, switch in sorted(rail_switches):
        out.append(f'  {_id("r", switch)} [shape=box, style=dashed, label="{_esc(switch)}"];')
        out.append(f"  {_id('t0', tier0)} -> {_id('r', switch)} [style=dotted];")
    out.append("}")
    return "\n".join(out)


def _id(kind: str, name: str) -> str:
    """A quoted DOT ID, unique per kind (a tier-0 switch and a node may share a name)."""
    return f'"{kind}:{_esc(name)}"'


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@app.command("export")
def export(
    kueue: Annotated[bool, typer.Option("--kueue", help="A Kueue Topology.")] = False,
    volcano: Annotated[bool, typer.Option("--volcano", help="Volcano HyperNodes.")] = False,
    name: Annotated[
        str, typer.Option(metavar="NAME", help="The Kueue Topology's name.")
    ] = "rdmaplane",
    api_version: Annotated[
        str,
        typer.Option("--api-version", metavar="VERSION", help="The Kueue API version to write."),
    ] = KUEUE_API_VERSION,
    fabric_file: FabricFile = None,
    nodes: NodesFile = [],  # noqa: B006
    nrt: NrtFile = [],  # noqa: B006
    kubeconfig: Kubeconfig = None,
    tier_label: TierLabel = [],  # noqa: B006
) -> None:
    """YAML for `kubectl apply -f -`: a Kueue `Topology` whose levels are the tier label keys
    (then kubernetes.io/hostname), or the Volcano `HyperNode` tree (tier 1 = tier-0 switches)."""
    if kueue == volcano:
        fail("give exactly one of --kueue and --volcano")
    if not OBJECT_NAME.fullmatch(name):
        fail(f"--name {name!r}: not a Kubernetes object name (a-z, 0-9, '-', '.'; 253 at most)")

    from rdmaplane.core.fabric_export import kueue_topology, volcano_hypernodes

    view = load_view(fabric_file, nodes, nrt, [], kubeconfig, tier_label)
    _, shape = resolved(view)
    if kueue:
        if view.tier_keys is None:
            fail("the nodes carry no single tier label scheme: name it with --tier-label")
        docs = [kueue_topology(name, view.tier_keys, shape.depth, api_version)]
    else:
        docs = volcano_hypernodes(shape)
    write_yaml(docs)
