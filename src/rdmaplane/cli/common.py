"""What the commands share: the three node sources, error reporting, and the options of the
long-running services (logging)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from rdmaplane.core import paths

if TYPE_CHECKING:
    from rich.console import Console

    from rdmaplane.core.model import NodeTopology

    console: Console  # stdout
    err_console: Console  # stderr


def _console(stderr: bool = False) -> Console:
    """Rich output without emoji codes or guessed highlighting; wide when piped (tables of
    HCAs do not fit rich's 80-column default for non-terminals)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", "160"))
    return Console(stderr=stderr, highlight=False, emoji=False, width=width)


_consoles: dict[str, Console] = {}


def __getattr__(name: str) -> Console:
    """`console` and `err_console`, made when first used: rich loads only when something is
    printed through it (`rdmaplane device-plugin` checks its input and becomes the serving
    process without it)."""
    if name not in ("console", "err_console"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _consoles:
        _consoles[name] = _console(stderr=name == "err_console")
    return _consoles[name]


def complete_sample(incomplete: str) -> list[str]:
    """Shell completion of `--sample NAME`."""
    from rdmaplane.adapters.discovery import samples

    return [n for n in samples.names() if n.startswith(incomplete)]


def _a_sysfs_root(value: str | None) -> str | None:
    """'' is refused, by every command alike: it names no folder (as a path, the working
    directory), and reading this machine's /sys is leaving the flag out."""
    if value == "":
        fail(f"--sysfs-root: empty value (leave the flag out to read {paths.SYSFS})")
    return value


# The one `--sysfs-root` of every command that reads a node (inspect, gid, nrt, snapshot, agent,
# dra-driver, device-plugin); not given, the command's default is this machine's /sys.
SysfsRootOption = Annotated[
    str | None,
    typer.Option(
        "--sysfs-root",
        metavar="DIR",
        help=f"Read a tree laid out like /sys [default: {paths.SYSFS}].",
        callback=_a_sysfs_root,
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
    """One line on stderr and the exit code: 2 for bad input, 1 for a failure or failed check."""
    say_error(message)
    raise typer.Exit(code)


def say_error(message: str) -> None:
    """`error: message` on stderr as one line, however long (never wrapped), taken literally
    whatever it holds: brackets in key paths such as `pools[0]` are not markup, and escape
    sequences or line breaks from file names and snapshot values are shown escaped."""
    from rich.markup import escape

    from rdmaplane.core.untrusted import printable

    __getattr__("err_console").print(
        f"[bold red]error:[/] {escape(printable(message))}", soft_wrap=True
    )


def load(sysfs_root: str | None, snapshot: str | None, sample: str | None) -> NodeTopology:
    """The node from the one source given (this machine's /sys without one), its reader's
    warnings said on stderr; `NodeSourceError` (exit 2) when the source is unusable (discovery
    loads only for the commands that read a node)."""
    from rdmaplane.adapters.discovery import load_node

    topo = load_node(sysfs_root=sysfs_root, snapshot_file=snapshot, sample=sample)
    say_warnings(topo)
    return topo


def say_warnings(topo: NodeTopology, where: str | None = None) -> None:
    """The one rule for what a reader could not read or believe: a `warning:` line on stderr
    per item, naming the file (and `where`, the node document or source it came from, when
    several nodes are read), whatever the command prints on stdout."""
    if topo.warnings:
        from rich.markup import escape

        for w in topo.warnings:
            said = str(w)
            if where and not said.startswith(where):
                said = f"{where}: {said}"
            __getattr__("err_console").print(f"[yellow]warning:[/] {escape(said)}", soft_wrap=True)


def no_rdma(topo: NodeTopology) -> str:
    """What every command says about a node without RDMA devices, whatever its source."""
    source = topo.source or "this node"
    if source == paths.SYSFS:
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


def read_objects(paths: Iterable[Path], kind: str) -> list[dict[str, Any]]:
    """The Kubernetes objects of `kind` in files (one per YAML document, the items of a List,
    or a YAML list of them), read like every document; exit 2 naming the file and the object
    when one lacks the envelope every reader of it relies on."""
    from rdmaplane.adapters.documents import read_documents

    found: list[dict[str, Any]] = []
    for path in paths:
        for i, doc in enumerate(read_documents(path)):
            items = doc.get("items") if isinstance(doc, dict) else doc
            batch = items if isinstance(items, list) else [doc]
            for j, obj in enumerate(batch):
                where = f"{path}: document {i + 1}" + (f", items[{j}]" if batch is items else "")
                found.append(_kube_object(obj, kind, where))
    return found


def _kube_object(obj: object, kind: str, where: str) -> dict[str, Any]:
    """`obj` when it is an object of `kind` (if it names one) with `metadata.name`, and with
    objects, lists and strings where readers take them for such."""
    from rdmaplane.core.untrusted import type_word, what_it_is

    if not isinstance(obj, dict):
        fail(f"{where}: expected a {kind} object, got {what_it_is(obj)}")
    if obj.get("kind", kind) != kind:
        fail(f"{where}: kind is {obj.get('kind')!r}, expected {kind}")
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        fail(f"{where}: metadata.name: expected a non-empty string")
    shapes = {
        "metadata.namespace": (meta.get("namespace"), str),
        "metadata.creationTimestamp": (meta.get("creationTimestamp"), str),
        "metadata.labels": (meta.get("labels"), dict),
        "metadata.annotations": (meta.get("annotations"), dict),
        "spec": (obj.get("spec"), dict),
        "status": (obj.get("status"), dict),
    }
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if isinstance(spec, dict):
        shapes["spec.nodeName"] = (spec.get("nodeName"), str)
    if isinstance(status, dict):
        shapes["status.conditions"] = (status.get("conditions"), list)
    for key, (value, expected) in shapes.items():
        if value is not None and not isinstance(value, expected):
            fail(f"{where}: {key}: expected {type_word(expected)}")
    return obj


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


def log_options(fmt: str | None, verbose: bool, level: str = "INFO") -> tuple[str, str]:
    """(format, level) of the flags, as plain strings: text unless json is asked for; `-v` is
    DEBUG."""
    return str(fmt or "text"), "DEBUG" if verbose else level


def start_logging(fmt: str | None, verbose: bool, level: str = "INFO") -> None:
    """The services' one log format (see `rdmaplane.adapters.logs`)."""
    from rdmaplane.adapters import logs

    logs.configure(*log_options(fmt, verbose, level))


def existing_dir(flag: str, path: str | Path) -> None:
    """Exit 2 unless `path` is a directory: folders that belong to someone else (sysfs, the
    kubelet's root) are never created, so a wrong path is said at once."""
    if not str(path) or not Path(path).is_dir():  # Path("") is ".", the working directory
        fail(f"{flag} {str(path) or repr('')}: not a directory")


def read_node_document(path: str) -> NodeTopology:
    """A node document (`rdmaplane inspect -o json`); its DocumentError (exit 2) when it
    cannot be read, exit 1 when it has no RDMA device."""
    from rdmaplane.adapters.documents import read_document
    from rdmaplane.core.serialize import from_document

    topo = from_document(read_document(path), where=path)
    say_warnings(topo, where=path)
    if not topo.hcas:
        fail(f"no RDMA device in node document {path}", code=1)
    return topo


# The nodes of a fleet-wide check (`gid audit`, `audit`): node documents, snapshots, samples.
NodeDocumentsArgument = Annotated[
    list[str] | None,
    typer.Argument(metavar="FILE...", help="Node documents (`rdmaplane inspect -o json`)."),
]
SnapshotsOption = Annotated[
    list[str] | None, typer.Option("--snapshot", metavar="FILE", help="A snapshot (repeat).")
]
SamplesOption = Annotated[
    list[str] | None, typer.Option("--sample", metavar="NAME", help="A sample node (repeat).")
]


def load_nodes(
    files: list[str] | None, snapshots: list[str] | None, samples: list[str] | None
) -> list[NodeTopology]:
    """The nodes given as node documents, snapshots and samples, in that order."""
    from rdmaplane.adapters.discovery import load_node

    nodes = [read_node_document(f) for f in files or ()]
    sources = [(s, None) for s in snapshots or ()] + [(None, s) for s in samples or ()]
    for snapshot, sample in sources:
        topo = load_node(snapshot_file=snapshot, sample=sample)
        say_warnings(topo, where=topo.source)  # several nodes: each warning names its node
        if not topo.hcas:
            fail(no_rdma(topo), code=1)
        nodes.append(topo)
    return nodes
