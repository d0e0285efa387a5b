"""`rdmaplane inspect`, `rdmaplane samples` and `rdmaplane snapshot create`."""

from __future__ import annotations

import itertools
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rdmaplane.cli.common import (
    SampleOption,
    SnapshotOption,
    SysfsRootOption,
    complete_sample,
    fail,
    load,
    no_rdma,
)
from rdmaplane.core import paths
from rdmaplane.core.model import Gpu, Hca, NodeTopology
from rdmaplane.core.topology import Relation, device_label, nearest_hcas, relation_label
from rdmaplane.core.untrusted import printable

if TYPE_CHECKING:
    from rich.table import Table

LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges
         within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks (only shown when NVML reports them)"""


class InspectOutput(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"
    matrix = "matrix"
    dot = "dot"


def inspect(
    sysfs_root: SysfsRootOption = None,
    snapshot_file: SnapshotOption = None,
    sample: SampleOption = None,
    output: Annotated[
        InspectOutput, typer.Option("-o", "--output", help="Output format.")
    ] = InspectOutput.table,
) -> None:
    """Show a node's GPUs, RDMA NICs, ports, GIDs, NUMA nodes and PCIe relations.

    `-o matrix` lays relations out like `nvidia-smi topo -m`; `-o dot` draws the PCIe tree
    (render with `dot -Tsvg`); `-o json` is the `rdmaplane.io/node-topology/v1` document.
    Exit 1 when the node has no RDMA device (after showing what it has), 2 on bad input.
    """
    topo = load(sysfs_root, snapshot_file, sample)
    if output is InspectOutput.json:
        from rdmaplane.cli.output import write_json
        from rdmaplane.core.serialize import to_document

        write_json(to_document(topo))
    elif output is InspectOutput.yaml:
        from rdmaplane.cli.output import write_yaml
        from rdmaplane.core.serialize import to_document

        write_yaml([to_document(topo)])
    elif output is InspectOutput.matrix:
        from rdmaplane.cli.output import write_text

        write_text(matrix_text(topo) + "\n")
    elif output is InspectOutput.dot:
        from rdmaplane.cli.output import write_text

        write_text(dot_text(topo) + "\n")
    else:
        print_summary(topo)
    if not topo.hcas:
        fail(no_rdma(topo), code=1)


# ---------------------------------------------------------------- the summary


def print_summary(topo: NodeTopology) -> None:
    from rdmaplane.cli.common import console

    numa = ", ".join(f"node{n.id}" for n in topo.numa_nodes) or "unknown"
    console.print(
        f"[bold]{topo.hostname or 'node'}[/]  ({topo.source})  "
        f"{len(topo.gpus)} GPUs · {len(topo.hcas)} RDMA devices · NUMA: {numa} · "
        f"RDMA netns: {topo.netns_mode.value}"
    )
    if topo.gpus:
        console.print(_gpu_table(topo))
    if topo.hcas:
        console.print(_hca_table(topo))
    from rdmaplane.core.pcie import node_downtrained

    for d in node_downtrained(topo):
        console.print(f"[yellow]PCIe downtrained:[/] {d.device} ({d.pci}): {d.why}")


def _gpu_table(topo: NodeTopology) -> Table:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="GPUs", title_justify="left")
    for col in ("GPU", "PCI", "Name", "NUMA", "PCIe root", "Nearest NIC", "UUID"):
        t.add_column(col)
    nearest = nearest_hcas(topo)
    for g in topo.gpus:
        t.add_row(
            f"GPU{g.index}",
            g.pci.address,
            escape(g.name or "-"),
            _numa(g.pci.numa),
            g.pci.root,
            f"{nearest[g.index][0].name} ({nearest[g.index][1].name})"
            if g.index in nearest
            else "-",
            g.uuid or "-",
        )
    return t


def _hca_table(topo: NodeTopology) -> Table:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="RDMA devices", title_justify="left")
    for col in ("HCA", "PCI", "Type", "NUMA", "PCIe root", "Port", "State", "Link", "Rate"):
        t.add_column(col)
    for col in ("Netdev", "GIDs", "Verbs"):
        t.add_column(col)
    for h in topo.hcas:
        for p in h.ports or (None,):
            state = "-"
            if p is not None:
                colour = "green" if p.is_up else "red"
                state = f"[{colour}]{p.state.name}/{p.phys_state.name}[/]"
            t.add_row(
                escape(h.name),
                h.pci.address if h.pci else "(software)",
                h.hca_type or "-",
                _numa(h.numa),
                _root(h),
                str(p.number) if p else "-",
                state,
                p.link_layer.value if p else "-",
                f"{p.rate_gbps:g} Gb/s" if p and p.rate_gbps else "-",
                escape(p.netdev or "-") if p else "-",
                f"{len(p.gids)}/{p.gid_table_len}" if p else "-",
                h.uverbs or "-",
            )
    return t


def _numa(n: int | None) -> str:
    return "N/A" if n is None else str(n)


def _root(h: Hca) -> str:
    """The root that pairs it, naming the Data Direct function when that is where it is."""
    if h.data_direct is not None:
        return f"{h.data_direct.root} (Data Direct {h.data_direct.address})"
    return h.pcie_root or "-"


# ---------------------------------------------------------------- nvidia-smi style matrix


def matrix_text(topo: NodeTopology) -> str:
    """The relations laid out like `nvidia-smi topo -m`: GPUs, then NICs named NIC<i> with a
    legend, CPU and NUMA affinity of each GPU, and the legend of the words."""
    devices: list[Gpu | Hca] = [*topo.gpus, *topo.hcas]
    nic_names = {h.name: f"NIC{i}" for i, h in enumerate(topo.hcas)}

    def label(d: Gpu | Hca) -> str:
        return device_label(d) if isinstance(d, Gpu) else nic_names[d.name]

    header = ["", *(label(d) for d in devices), "CPU Affinity", "NUMA Affinity"]
    rows = [header]
    for a in devices:
        cells = [label(a)]
        cells += [relation_label(a, b) or "-" for b in devices]
        if isinstance(a, Gpu):
            cells += [a.pci.local_cpus or "N/A", _numa(a.pci.numa)]
        else:
            cells += ["", ""]
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    legend = [f"  {nic_names[h.name]}: {h.name}" for h in topo.hcas]
    return "\n".join([*lines, "", LEGEND, "", "NIC Legend:", "", *legend])


# ---------------------------------------------------------------- Graphviz


def dot_text(topo: NodeTopology) -> str:
    """NUMA nodes as clusters holding their root complexes; switches and bridges as small
    boxes; GPUs and NICs as leaves, a NIC with a port not ACTIVE/LinkUp filled pink and its
    port states in its label; dashed edges mark each GPU's nearest NIC (PIX/PXB; equally
    near NICs shared out as NCCL pairs them: `topology.nearest_hcas`).

    Every ID is a quoted string: `node`, `edge`, `graph` and `subgraph` are DOT keywords, and
    names come from the node (a snapshot is untrusted input)."""
    out = [
        f"digraph {_q(topo.hostname or 'node')} {{",
        "  rankdir=TB; node [fontname=Helvetica, fontsize=10]; edge [arrowhead=none];",
        f"  label={_q(topo.hostname or 'node')}; labelloc=t;",
    ]
    devices: list[Gpu | Hca] = [*topo.gpus, *(h for h in topo.hcas if h.pci is not None)]
    roots: dict[str, int | None] = {}
    edges: set[tuple[str, str]] = set()
    dma = {f"{h.name} DMA": h.data_direct for h in topo.hcas if h.data_direct is not None}
    nic_of = {label: label.removesuffix(" DMA") for label in dma}
    for label, pci in [*((device_label(d), d.pci) for d in devices), *dma.items()]:
        assert pci is not None
        roots.setdefault(pci.root, pci.numa)
        chain = [pci.root, *pci.bridges]
        for parent, child in itertools.pairwise(chain):
            edges.add((parent, child))
        edges.add((chain[-1], label))
    by_numa: dict[int | None, list[str]] = {}
    for root, numa in sorted(roots.items()):
        by_numa.setdefault(numa, []).append(root)
    for numa, members in by_numa.items():
        name = f"NUMA node {numa}" if numa is not None else "NUMA unknown"
        out.append(f"  subgraph {_q(f'cluster_numa{numa}')} {{ label={_q(name)}; style=rounded;")
        out += [f"    {_q(r)} [shape=box, style=filled, fillcolor=lightgrey];" for r in members]
        out.append("  }")
    bridges = {c for _, c in edges} - {device_label(d) for d in devices} - set(dma)
    out += [f"  {_q(b)} [shape=box, fontsize=8, height=0.2];" for b in sorted(bridges)]
    out += [f"  {_q(device_label(d))} [{_dot_device(d)}];" for d in devices]
    out += [  # a NIC's Data Direct function: where its DMA to GPU memory goes through
        f"  {_q(label)} [shape=box, style=dashed, label={_q(label, pci.address)}];"
        for label, pci in sorted(dma.items())
    ]
    out += [f"  {_q(a)} -> {_q(b)};" for a, b in sorted(edges)]
    out += [f"  {_q(label)} -> {_q(nic_of[label])} [style=dotted];" for label in sorted(dma)]
    for index, (hca, r) in sorted(nearest_hcas(topo).items()):
        if r <= Relation.PXB:
            out.append(
                f"  {_q(f'GPU{index}')} -> {_q(hca.name)} "
                f"[style=dashed, color=red, label={_q(r.name)}];"
            )
    out.append("}")
    return "\n".join(out)


def _dot_device(d: Gpu | Hca) -> str:
    """The attributes of a GPU or NIC node; label lines are joined with DOT's `\\n`."""
    if isinstance(d, Gpu):
        lines = [f"GPU{d.index}", d.pci.address, d.name or ""]
        return f"shape=box3d, color=green4, label={_q(*lines)}"
    rate = next((p.rate_gbps for p in d.ports if p.rate_gbps), None)
    lines = [d.name, d.pci.address if d.pci else "", f"{rate:g}G" if rate else "?G"]
    down = [p for p in d.ports if not p.is_up]
    lines += [f"port {p.number} {p.state.name}/{p.phys_state.name}" for p in down]
    style = ", style=filled, fillcolor=mistyrose, fontcolor=red3" if down else ""
    return f"shape=component, color=blue{style}, label={_q(*lines)}"


def _q(*lines: str) -> str:
    """A quoted DOT string of `lines` (joined with DOT's line break `\\n`): quotes and
    backslashes escaped, characters a terminal acts on written as escapes."""
    text = "\\n".join(printable(s).replace("\\", "\\\\").replace('"', '\\"') for s in lines)
    return f'"{text}"'


# ---------------------------------------------------------------- samples and snapshots


class ListFormat(StrEnum):
    table = "table"
    json = "json"


samples_app = typer.Typer(
    help="The bundled sample nodes: list them, or lay one out as a sysfs tree.",
    invoke_without_command=True,
)


@samples_app.callback()
def list_samples(
    ctx: typer.Context,
    output: Annotated[
        ListFormat, typer.Option("-o", "--output", help="table or json.")
    ] = ListFormat.table,
) -> None:
    """List the bundled sample nodes (use one with `--sample NAME`)."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.table import Table

    from rdmaplane.adapters.discovery import samples
    from rdmaplane.cli.common import console

    found = samples.all_samples()
    if output is ListFormat.json:
        from rdmaplane.cli.output import write_json

        write_json([{"name": s.name, "description": s.description} for s in found], indent=None)
        return
    t = Table("Sample", "What it models")
    for s in found:
        t.add_row(s.name, s.description)
    console.print(t)


@samples_app.command("materialize")
def materialize(
    name: Annotated[
        str,
        typer.Argument(metavar="NAME", help="A sample name.", autocompletion=complete_sample),
    ],
    dest: Annotated[Path, typer.Argument(metavar="DIR", help="A new or empty directory to write.")],
) -> None:
    """Write a sample's sysfs tree to DIR, to read with `--sysfs-root DIR` or edit by hand."""
    from rich.markup import escape

    from rdmaplane.adapters.discovery import samples
    from rdmaplane.cli.common import console

    try:
        samples.materialise(name, dest)
    except OSError as e:
        fail(f"cannot write {dest}: {e.strerror or e}", code=1)
    where = escape(str(dest))
    console.print(
        f"wrote sample {name} to {where}; read it with --sysfs-root {where}", soft_wrap=True
    )


snapshot_app = typer.Typer(help="Support snapshots of a node's sysfs subset.", no_args_is_help=True)


@snapshot_app.command("create")
def snapshot_create(
    output: Annotated[
        str,
        typer.Option(
            "-o", "--output", metavar="FILE", help="Where to write the .tar.gz; - for stdout."
        ),
    ],
    sysfs_root: SysfsRootOption = None,
    snapshot_file: SnapshotOption = None,
    sample: SampleOption = None,
    redact: Annotated[
        bool, typer.Option("--redact", help="Replace GUIDs, MACs, IPs and the hostname.")
    ] = False,
) -> None:
    """Capture what rdmaplane reads from this node's sysfs into a small .tar.gz.

    Attach it to a support request; every command that reads a node takes `--snapshot FILE`.
    Like them it reads this node, `--sysfs-root DIR`, `--snapshot FILE` (again: to redact
    one) or `--sample NAME`. Exit 1 when the node has no RDMA device (nothing to capture;
    nothing is written).
    """
    from rich.markup import escape

    from rdmaplane.adapters.discovery import nvml, snapshot
    from rdmaplane.cli.common import console, err_console, say_warnings

    to_stdout = output == "-"
    if to_stdout and sys.stdout.isatty():
        fail("-o -: refusing to write a binary archive to a terminal; redirect it to a file")
    if not to_stdout:
        _check_target(output)
    given = [
        f
        for f, v in (
            ("--sysfs-root", sysfs_root),
            ("--snapshot", snapshot_file),
            ("--sample", sample),
        )
        if v is not None
    ]
    if len(given) > 1:
        fail("give only one of --sysfs-root, --snapshot and --sample")
    if sample is not None or snapshot_file is not None:
        snap = _capture_of_tree(snapshot_file, sample, redact)
    else:
        root = paths.SYSFS if sysfs_root is None else sysfs_root
        if not os.path.isdir(root):
            fail(f"--sysfs-root {root!r} is not a directory")
        live = os.path.realpath(root) == paths.SYSFS
        snap = snapshot.capture(root, redact=redact, gpu_info=nvml.gpu_info() if live else None)
    say_warnings(snap.topology)
    if not snap.topology.hcas:
        fail(f"nothing to capture: {no_rdma(snap.topology)}", code=1)
    if to_stdout:
        typer.get_binary_stream("stdout").write(snap.archive)
    else:
        try:
            Path(output).write_bytes(snap.archive)
        except OSError as e:
            fail(f"cannot write {output}: {e.strerror or e}", code=1)
    (err_console if to_stdout else console).print(
        f"wrote {'stdout' if to_stdout else escape(output)}: {snap.files} files, "
        f"{snap.links} links, {len(snap.archive) / 1024:.1f} KiB{' (redacted)' if redact else ''}"
    )


def _capture_of_tree(snapshot_file: str | None, sample: str | None, redact: bool) -> Any:
    """A capture of a sample's or a snapshot's tree: laid out in a scratch folder, read like
    a node's /sys (so the archive is what `snapshot create` on that node would write)."""
    import tempfile

    from rdmaplane.adapters.discovery import NodeSourceError, samples, snapshot

    try:
        if sample is not None:
            tree = samples.sample_tree(sample)
        else:
            assert snapshot_file is not None
            if not os.path.isfile(snapshot_file):
                raise NodeSourceError(f"snapshot {snapshot_file!r} is not a file")
            tree = snapshot.read_archive(snapshot_file)
    except (samples.SampleError, snapshot.SnapshotError) as e:
        raise NodeSourceError(str(e)) from e
    with tempfile.TemporaryDirectory(prefix="rdmaplane-snapshot-") as tmp:
        root = Path(tmp) / "sys"
        samples.write_tree(tree, root)
        return snapshot.capture(str(root), redact=redact)


def _check_target(output: str) -> None:
    """Refuse an output path that cannot take a file before reading the node."""
    if not output:
        fail("-o: empty; give a file name, or - for stdout")
    if os.path.isdir(output):
        fail(
            f"-o {output}: is a directory; give a file name, e.g. {output.rstrip('/')}/node.tar.gz"
        )
    parent = os.path.dirname(output) or "."
    if not os.path.isdir(parent):
        fail(f"-o {output}: directory {parent} does not exist")
