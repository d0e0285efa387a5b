"""What every command that reads a node shares: the three node sources and error reporting."""

from __future__ import annotations

import os
import sys
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from rdmaplane.discovery import NodeSourceError, load_node
from rdmaplane.model import NodeTopology


def _console(stderr: bool = False) -> Console:
    """Rich output without emoji codes or guessed highlighting; wide when piped (tables of
    HCAs do not fit rich's 80-column default for non-terminals)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", "160"))
    return Console(stderr=stderr, highlight=False, emoji=False, width=width)


console = _console()
err_console = _console(stderr=True)

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
        "--sample", metavar="NAME", help="Read a bundled sample node (see `rdmaplane samples`)."
    ),
]


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr and the exit code: 2 for usage errors, 1 for failed checks."""
    err_console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def load(sysfs_root: str | None, snapshot: str | None, sample: str | None) -> NodeTopology:
    try:
        return load_node(sysfs_root=sysfs_root, snapshot_file=snapshot, sample=sample)
    except NodeSourceError as e:
        fail(str(e))
