"""What every command that reads a node shares: the three node sources and error reporting."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from rdmaplane.discovery import NodeSourceError, load_node, samples
from rdmaplane.documents import DocumentError, printable, read_documents
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


def read_objects(paths: Iterable[Path], kind: str) -> list[dict[str, Any]]:
    """The Kubernetes objects of `kind` in files (one per YAML document, the items of a List,
    or a YAML list of them), read like every document; exit 2 naming the file and the object
    when one lacks the envelope every reader of it relies on."""
    found: list[dict[str, Any]] = []
    for path in paths:
        try:
            docs = read_documents(path)
        except DocumentError as e:
            fail(str(e))
        for i, doc in enumerate(docs):
            items = doc.get("items") if isinstance(doc, dict) else doc
            batch = items if isinstance(items, list) else [doc]
            for j, obj in enumerate(batch):
                where = f"{path}: document {i + 1}" + (f", items[{j}]" if batch is items else "")
                found.append(_kube_object(obj, kind, where))
    return found


def _kube_object(obj: object, kind: str, where: str) -> dict[str, Any]:
    """`obj` when it is an object of `kind` (if it names one) with `metadata.name`, and with
    objects, lists and strings where readers take them for such."""
    if not isinstance(obj, dict):
        fail(f"{where}: expected a {kind} object, got {type(obj).__name__}")
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
            fail(f"{where}: {key}: expected {_WORDS[expected]}")
    return obj


_WORDS = {str: "a string", dict: "an object", list: "a list"}
