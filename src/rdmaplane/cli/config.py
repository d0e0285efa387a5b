"""`rdmaplane config`: the documented defaults of each config kind, and checking files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rdmaplane.cli.common import console, fail, say_error

if TYPE_CHECKING:
    from rdmaplane.config import Kind

config_app = typer.Typer(
    help="Config files: print a kind's defaults, check files before deploying them.",
    no_args_is_help=True,
)


@config_app.command("defaults")
def defaults(
    kind: Annotated[
        str,
        typer.Argument(
            help="AgentConfig, DevicePluginConfig, SchedulerExtenderConfig or WebhookConfig."
        ),
    ],
) -> None:
    """Print KIND's defaults as a config file, every key explained (what the docs show)."""
    from rdmaplane.config import KINDS, render_defaults

    if kind not in KINDS:
        fail(f"unknown kind {kind!r}; one of {', '.join(sorted(KINDS))}")
    typer.echo(render_defaults(KINDS[kind]), nl=False)


@config_app.command("validate")
def validate(
    files: Annotated[list[Path], typer.Argument(help="Config files of any rdmaplane kind.")],
) -> None:
    """Check config files as the commands reading them would (the kind from the file; a bare
    configList is the shared RDMA plugin's format). Exit 2 when any is wrong, one line per
    file."""
    from rdmaplane.config import ConfigError, load
    from rdmaplane.documents import DocumentError, read_document

    bad = 0
    for path in files:
        try:
            kind = _kind_of(read_document(path), str(path))
            load(path, kind)
        except (ConfigError, DocumentError) as e:
            bad += 1
            say_error(str(e))
        else:
            console.print(f"{path}: a valid {kind.__name__}", markup=False, soft_wrap=True)
    raise typer.Exit(2 if bad else 0)


def _kind_of(doc: object, source: str) -> type[Kind]:
    """The kind a document says it is (a bare configList: the device plugin's; no mapping at
    all: any kind, loading says what is wrong with the shape)."""
    from rdmaplane.config import KINDS, ConfigError, DevicePluginConfig

    named = doc.get("kind") if isinstance(doc, dict) else None
    if named in KINDS:
        return KINDS[str(named)]
    if not isinstance(doc, dict) or ("configList" in doc and named is None):
        return DevicePluginConfig
    said = "missing" if named is None else repr(named)
    raise ConfigError(f"{source}: kind: {said}; one of {', '.join(sorted(KINDS))}")
