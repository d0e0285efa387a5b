"""What every command that reads a node shares: the three node sources and error reporting."""

from __future__ import annotations

import os
import sys
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from rdmaplane.discovery import NodeSourceError, load_node, samples
from rdmaplane.documents import printable
from rdmaplane.model import NodeTopology


def _console(stderr: bool = False) -> Console:
    """Rich output without emoji codes or guessed highlighting; wide when piped (tables of
    HCAs do not fit rich's 80-column default for non-terminals)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", "160"))
    return Console(stderr=stderr, highlight=False, emoji=False, width=width)


console = _console()
err_console = _console(stderr=True)


def complete_sample(incomplete: str) -> list[str]:
    """Shell completion of `--sample NAME`."""
    return [n for n in samples.names() if n.startswith(incomplete)]


SysfsRootOption = Annotated[
    str | None,
    typer.Option(
        "--sysfs-root", metavar="DIR", help="Read a tree laid out like /sys [default: /sys]."
    ),
]
SnapshotOption = Annotated[
    str | None,
    typer.Option(
        "--snapshot", metavar="FILE", help="Read a snapshot made by `rdmaplane snapshot create`."
    ),
]
SampleOption = Annotated[
    str | None,
    typer.Option(
        "--sample",
        metavar="NAME",
        help="Read a bundled sample node (see `rdmaplane samples`).",
        autocompletion=complete_sample,
    ),
]


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr and the exit code: 2 for bad input, 1 for a failure or failed check.

    The message is shown as plain text on one line whatever it holds (file names and values
    from the user or from a snapshot: markup brackets, escape sequences, line breaks)."""
    err_console.print(f"[bold red]error:[/] {escape(printable(message))}", soft_wrap=True)
    raise typer.Exit(code)


def load(sysfs_root: str | None, snapshot: str | None, sample: str | None) -> NodeTopology:
    """The node from the one source given (this machine's /sys without one); exit 2 when the
    source is unusable."""
    try:
        return load_node(sysfs_root=sysfs_root, snapshot_file=snapshot, sample=sample)
    except NodeSourceError as e:
        fail(str(e))


def no_rdma(topo: NodeTopology) -> str:
    """What every command says about a node without RDMA devices, whatever its source."""
    source = topo.source or "this node"
    if source == "/sys":
        return (
            "no RDMA device found in /sys/class/infiniband on this machine; try "
            "`rdmaplane inspect --sample hgx-h100-roce` (`rdmaplane samples` lists them)"
        )
    kind, _, name = source.partition(":")
    if kind in ("snapshot", "sample") and name:
        return f"no RDMA device in {kind} {name}"
    return f"no RDMA device in {os.path.join(source, 'class/infiniband')}"


def load_rdma_node(
    sysfs_root: str | None, snapshot: str | None, sample: str | None
) -> NodeTopology:
    """`load`, then exit 1 when the node has no RDMA device: the one rule for every command
    whose answer is about RDMA devices."""
    topo = load(sysfs_root, snapshot, sample)
    if not topo.hcas:
        fail(no_rdma(topo), code=1)
    return topo
