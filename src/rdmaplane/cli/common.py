"""What the commands share: the three node sources, error reporting, and the options of the
long-running services (logging, config files)."""

from __future__ import annotations

import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from rdmaplane.discovery import NodeSourceError, load_node
from rdmaplane.model import NodeTopology

if TYPE_CHECKING:
    from rdmaplane.config import Kind

K = TypeVar("K", bound="Kind")


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
    say_error(message)
    raise typer.Exit(code)


def say_error(message: str) -> None:
    """`error: message` on stderr as one line, however long (never wrapped), taken literally
    (brackets in key paths such as `pools[0]` are not markup)."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def load(sysfs_root: str | None, snapshot: str | None, sample: str | None) -> NodeTopology:
    try:
        return load_node(sysfs_root=sysfs_root, snapshot_file=snapshot, sample=sample)
    except NodeSourceError as e:
        fail(str(e))


class LogFormat(StrEnum):
    text = "text"
    json = "json"


LogFormatOption = Annotated[
    LogFormat | None,
    typer.Option(
        "--log-format", help="text (for people) or json (one object per line). Default: text."
    ),
]
VerboseOption = Annotated[
    bool,
    typer.Option("--verbose", "-v", help="rdmaplane's debug lines (never the libraries')."),
]


def start_logging(fmt: str | None, verbose: bool, level: str = "INFO") -> None:
    """The services' one log format (see `rdmaplane.logs`)."""
    from rdmaplane import logs

    logs.configure(fmt or "text", "DEBUG" if verbose else level)


def config_file(path: str | Path | None, kind: type[K], **overrides: object) -> K:
    """A config file of `kind` (None: its defaults) with flags on top; exit 2 naming the file
    and the key when it cannot be used (the config models load only for the commands that
    read one)."""
    from rdmaplane.config import ConfigError, load

    try:
        return load(path, kind, **overrides)
    except ConfigError as e:
        fail(str(e))


def existing_dir(flag: str, path: str | Path) -> None:
    """Exit 2 unless `path` is a directory: folders that belong to someone else (sysfs, the
    kubelet's root) are never created, so a wrong path is said at once."""
    if not Path(path).is_dir():
        fail(f"{flag} {path}: not a directory")
