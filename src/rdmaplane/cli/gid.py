"""`rdmaplane env`, `rdmaplane gid explain` and `rdmaplane gid audit`."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from rdmaplane.cli.common import (
    NodeDocumentsArgument,
    SampleOption,
    SamplesOption,
    SnapshotOption,
    SnapshotsOption,
    SysfsRootOption,
    fail,
    load_nodes,
    load_rdma_node,
)
from rdmaplane.cli.output import json_text, write_json, write_text
from rdmaplane.core.gid import (
    ClusterAudit,
    GidChoice,
    GidPolicy,
    NodeGidPlan,
    audit,
    gid_note,
    plan_node,
    roce_version,
    select_gid,
)
from rdmaplane.core.selectors import PortVerdict, Selectors, classify_ports, compute_ports
from rdmaplane.core.untrusted import FieldError

if TYPE_CHECKING:
    from rich.table import Table

    from rdmaplane.core.model import Gid, NodeTopology

app = typer.Typer(
    help="The GID index NCCL should use: explain it per port, audit it across nodes.",
    no_args_is_help=True,
)


class EnvFormat(StrEnum):
    shell = "shell"
    dotenv = "dotenv"
    json = "json"


class GidFormat(StrEnum):
    table = "table"
    json = "json"


HcaOption = Annotated[
    list[str] | None,
    typer.Option(
        "--hca",
        metavar="PATTERN",
        help="Use these HCAs (name or pattern, e.g. mlx5_0 or 'mlx5_[0-3]'; repeat) instead of "
        "the default compute ports.",
    ),
]
FamilyOption = Annotated[
    int,
    typer.Option(
        "--family", metavar="4|6", help="Address family of the GID (NCCL_IB_ADDR_FAMILY)."
    ),
]
RangeOption = Annotated[
    str | None,
    typer.Option(
        "--addr-range", metavar="CIDR", help="Only GIDs in this range (NCCL_IB_ADDR_RANGE)."
    ),
]
RoceOption = Annotated[
    int,
    typer.Option(
        "--roce-version", metavar="1|2", help="Preferred RoCE version (NCCL_IB_ROCE_VERSION_NUM)."
    ),
]
TableOutput = Annotated[GidFormat, typer.Option("--output", "-o", help="table or json.")]


# The plan's fields (rdmaplane.core.gid, rdmaplane.core.nccl) as the flags that set them.
_FLAGS = {
    "family": "--family",
    "cidr": "--addr-range",
    "roce_version": "--roce-version",
    "nccl_version": "--nccl-version",
    "socket_ifname": "--socket-ifname",
    "ib_tc": "--ib-tc",
    "ib_sl": "--ib-sl",
}


def _bad_flag(e: FieldError) -> NoReturn:
    fail(f"{_FLAGS.get(e.field, e.field)}: {e.reason}")


def _policy(family: int, addr_range: str | None, roce: int) -> GidPolicy:
    try:
        return GidPolicy(family=family, cidr=addr_range, roce_version=roce)
    except FieldError as e:
        _bad_flag(e)


def _selectors(hcas: list[str] | None) -> Selectors | None:
    return Selectors(hca_names=tuple(hcas)) if hcas else None


def _ports_for(topo: NodeTopology, hcas: list[str] | None) -> list[PortVerdict]:
    """Every port's verdict; exit 2 when a --hca pattern names nothing on the node."""
    for pattern in hcas or ():
        if not compute_ports(topo, Selectors(hca_names=(pattern,))):
            names = ", ".join(h.name for h in topo.hcas) or "none"
            fail(f"--hca {pattern}: no such HCA on this node (HCAs: {names})")
    return classify_ports(topo, _selectors(hcas))


# ----------------------------------------------------------------- env


def env(
    sysfs_root: SysfsRootOption = None,
    snapshot: SnapshotOption = None,
    sample: SampleOption = None,
    hca: HcaOption = None,
    output: Annotated[
        EnvFormat, typer.Option("--output", "-o", help="shell, dotenv or json.")
    ] = EnvFormat.shell,
    family: FamilyOption = 4,
    addr_range: RangeOption = None,
    roce_version: RoceOption = 2,
    nccl_version: Annotated[
        str | None,
        typer.Option(
            metavar="VERSION", help="Target NCCL version, e.g. 2.18 [default: 2.21 or later]."
        ),
    ] = None,
    socket_ifname: Annotated[
        str | None,
        typer.Option(
            metavar="VALUE",
            help="NCCL_SOCKET_IFNAME verbatim; '' leaves it out [default: '=' + the first "
            "up netdev that is not a compute port, loopback or virtual].",
        ),
    ] = None,
    ib_tc: Annotated[
        int | None, typer.Option(metavar="0-255", help="NCCL_IB_TC (traffic class).")
    ] = None,
    ib_sl: Annotated[
        int | None, typer.Option(metavar="0-15", help="NCCL_IB_SL (service level).")
    ] = None,
) -> None:
    """Print the NCCL/UCX environment for this node's compute ports (or the --hca ones).

    Exit 1 when no environment can be right for them (InfiniBand and RoCE ports together, GID
    indexes an older NCCL cannot handle), 2 on bad input."""
    from rdmaplane.core.nccl import NcclPlanError, NcclSettings, default_socket_ifname, nccl_env

    policy = _policy(family, addr_range, roce_version)
    topo = load_rdma_node(sysfs_root, snapshot, sample)
    ports = [(v.hca, v.port) for v in _ports_for(topo, hca) if v.compute]
    if socket_ifname is None:
        socket_ifname = default_socket_ifname(topo, ports)
    try:
        settings = NcclSettings(
            gid_policy=policy,
            nccl_version=nccl_version,
            socket_ifname=socket_ifname or None,
            ib_tc=ib_tc,
            ib_sl=ib_sl,
        )
    except FieldError as e:
        _bad_flag(e)
    try:
        variables = nccl_env(topo, ports, settings)
    except NcclPlanError as e:
        if not e.unusable:
            raise
        usable = sorted({h.name for h, p in ports if f"{h.name}:{p.number}" not in e.unusable})
        hint = (
            "; choose the ports with --hca: " + " ".join(f"--hca {n}" for n in usable)
            if usable
            else "; no port has a routable GID: give their netdevs an IP address (RoCE v2 "
            "GIDs appear with it), or choose other HCAs with --hca"
        )
        fail(f"{e}{hint}", code=1)
    write_text(render_env(variables, output))


def render_env(variables: dict[str, str], output: EnvFormat) -> str:
    if output == EnvFormat.json:
        return json_text(variables)
    if output == EnvFormat.dotenv:
        return "".join(f"{k}={_dotenv_value(v)}\n" for k, v in variables.items())
    return "".join(f"export {k}={_shell_quote(v)}\n" for k, v in variables.items())


def _shell_quote(value: str) -> str:
    """Always single quotes (so `^`, `=`, `,` and spaces stay literal); `'` becomes `'\\''`."""
    return "'" + value.replace("'", "'\\''") + "'"


_DOTENV_PLAIN = re.compile(r"^[A-Za-z0-9_=,:./^+@%-]*$")


def _dotenv_value(value: str) -> str:
    """Plain when safe (docker's --env-file takes values literally), else double-quoted."""
    if _DOTENV_PLAIN.match(value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


# ----------------------------------------------------------------- explain


@app.command()
def explain(
    sysfs_root: SysfsRootOption = None,
    snapshot: SnapshotOption = None,
    sample: SampleOption = None,
    hca: HcaOption = None,
    family: FamilyOption = 4,
    addr_range: RangeOption = None,
    roce_version: RoceOption = 2,
    output: TableOutput = GidFormat.table,
) -> None:
    """Show every GID like show_gids, the row NCCL picks per port, and why."""
    policy = _policy(family, addr_range, roce_version)
    topo = load_rdma_node(sysfs_root, snapshot, sample)
    verdicts = _ports_for(topo, hca)
    choices = [select_gid(v.hca, v.port, policy) for v in verdicts]
    plan = plan_node(topo, [(v.hca, v.port) for v in verdicts if v.compute], policy)
    if output == GidFormat.json:
        doc = _explain_doc(topo, policy, verdicts, choices, plan.uniform_index)
        write_json(doc)
        return
    from rich.markup import escape

    from rdmaplane.cli.common import console as out

    out.print(_gid_table(verdicts, choices, policy))
    for v, c in zip(verdicts, choices, strict=True):
        index = "-" if c.index is None else str(c.index)
        out.print(f"{c.name:<16} index {index:<3} {escape(c.reason)}  [dim]({escape(v.reason)})[/]")
    out.print(_plan_summary(plan))


def _gid_table(verdicts: list[PortVerdict], choices: list[GidChoice], policy: GidPolicy) -> Table:
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("", "DEV", "PORT", "INDEX", "GID", "IPv4", "VER", "DEV", "NOTE"):
        table.add_column(col, no_wrap=True)
    for v, c in zip(verdicts, choices, strict=True):
        if not v.port.gids:
            table.add_row("", v.hca.name, str(v.port.number), "-", "(no GIDs)", "", "", "", "")
        for g in v.port.gids:
            chosen = g.index == c.index
            style = "bold green" if chosen else ("dim" if not v.compute else "")
            table.add_row(
                "→" if chosen else "",
                v.hca.name,
                str(v.port.number),
                str(g.index),
                g.raw,
                g.ip if g.is_ipv4_mapped and g.ip else "",
                _ver(g),
                g.netdev or "",
                gid_note(g, c, policy),
                style=style,
            )
    return table


def _ver(g: Gid) -> str:
    v = roce_version(g)
    return f"v{v}" if v else "?"


def _plan_summary(plan: NodeGidPlan) -> str:
    if not plan.choices:
        return "[yellow]no compute ports[/]"
    names = ", ".join(c.name for c in plan.choices)
    if not plan.roce_choices:
        return f"compute ports {names}: InfiniBand only, no GID index to set"
    if plan.uniform_index is not None:
        return f"compute ports {names}: [green]uniform GID index {plan.uniform_index}[/]"
    each = ", ".join(f"{c.name} → {'-' if c.index is None else c.index}" for c in plan.roce_choices)
    return f"compute ports {names}: [yellow]not uniform[/] ({each})"


def _explain_doc(
    topo: NodeTopology,
    policy: GidPolicy,
    verdicts: list[PortVerdict],
    choices: list[GidChoice],
    uniform: int | None,
) -> dict[str, Any]:
    return {
        "node": topo.hostname,
        "source": topo.source,
        "policy": {
            "family": policy.family,
            "cidr": policy.cidr,
            "roce_version": policy.roce_version,
        },
        "ports": [_port_doc(v, c, policy) for v, c in zip(verdicts, choices, strict=True)],
        "compute": [c.name for v, c in zip(verdicts, choices, strict=True) if v.compute],
        "uniform_index": uniform,
    }


def _port_doc(v: PortVerdict, c: GidChoice, policy: GidPolicy) -> dict[str, Any]:
    return {
        "hca": c.hca,
        "port": c.port,
        "link_layer": v.port.link_layer.value,
        "state": v.port.state.name,
        "compute": v.compute,
        "compute_reason": v.reason,
        "index": c.index,
        "reason": c.reason,
        "gids": [_gid_doc(g, c, policy) for g in v.port.gids],
    }


def _gid_doc(g: Gid, c: GidChoice, policy: GidPolicy) -> dict[str, Any]:
    return {
        "index": g.index,
        "gid": g.raw,
        "ip": g.ip,
        "version": roce_version(g),
        "netdev": g.netdev,
        "error": g.attrs_error,
        "chosen": g.index == c.index,
        "note": gid_note(g, c, policy),
    }


# ----------------------------------------------------------------- audit


@app.command("audit")
def audit_command(
    files: NodeDocumentsArgument = None,
    snapshot: SnapshotsOption = None,
    sample: SamplesOption = None,
    hca: HcaOption = None,
    family: FamilyOption = 4,
    addr_range: RangeOption = None,
    roce_version: RoceOption = 2,
    output: TableOutput = GidFormat.table,
) -> None:
    """Is one GID index right for every compute port of every node? Exit 1 when not (or when a
    node has no RDMA device), 2 on bad input."""
    policy = _policy(family, addr_range, roce_version)
    nodes = load_nodes(files, snapshot, sample)
    if not nodes:
        fail("give node documents, --snapshot FILE or --sample NAME")
    result = audit(nodes, _selectors(hca), policy)
    if output == GidFormat.json:
        write_json(_audit_doc(result))
    else:
        _print_audit(result)
    if not result.uniform:
        raise typer.Exit(1)


def _print_audit(result: ClusterAudit) -> None:
    from rich.markup import escape
    from rich.table import Table

    from rdmaplane.cli.common import console as out

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("NODE", "PORTS", "GID INDEX", "NOTE"):
        table.add_column(col)
    for n in result.nodes:
        indexes = sorted({c.index for c in n.plan.roce_choices}, key=lambda i: (i is None, i))
        shown = ",".join("-" if i is None else str(i) for i in indexes) or "-"
        ports = ",".join(c.name for c in n.plan.choices) or "-"
        table.add_row(n.node, ports, shown, "; ".join(n.notes))
    out.print(table)
    for d in result.deviations:
        out.print(f"[yellow]deviates:[/] {escape(d.why)}")
    if result.cluster_index is not None:
        out.print(f"[green]cluster-wide GID index {result.cluster_index}[/]")
    elif result.uniform:
        out.print("no RoCE compute ports: no GID index to unify")
    else:
        out.print(
            f"[red]not uniform[/]: {len(result.deviations)} port(s) differ from the majority "
            f"index {result.majority_index if result.majority_index is not None else '-'}"
        )


def _audit_doc(result: ClusterAudit) -> dict[str, Any]:
    return {
        "uniform": result.uniform,
        "cluster_index": result.cluster_index,
        "majority_index": result.majority_index,
        "nodes": [
            {
                "node": n.node,
                "ports": [
                    {"port": c.name, "index": c.index, "reason": c.reason} for c in n.plan.choices
                ],
                "uniform_index": n.plan.uniform_index,
                "notes": list(n.notes),
            }
            for n in result.nodes
        ],
        "deviations": [
            {
                "node": d.node,
                "port": d.choice.name,
                "index": d.choice.index,
                "expected": d.expected,
                "why": d.why,
            }
            for d in result.deviations
        ],
    }
