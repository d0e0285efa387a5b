"""The one `rdmaplane` command. Each command group lives in its own module and is added here."""

from __future__ import annotations

import typer

from rdmaplane import __version__
from rdmaplane.cli.deviceplugin import device_plugin

app = typer.Typer(
    name="rdmaplane",
    help="RDMA for GPU pods on Kubernetes: discover, plan, schedule, validate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("device-plugin")(device_plugin)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rdmaplane {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """RDMA for GPU pods on Kubernetes: discover, plan, schedule, validate."""


from rdmaplane.cli import gid as _gid  # noqa: E402
from rdmaplane.cli import inspect as _inspect  # noqa: E402

app.command("inspect")(_inspect.inspect)
app.command("samples")(_inspect.list_samples)
app.add_typer(_inspect.snapshot_app, name="snapshot")
app.command("env")(_gid.env)
app.add_typer(_gid.app, name="gid")

from rdmaplane.cli import doctor as _doctor  # noqa: E402

app.add_typer(_doctor.doctor_app, name="doctor")

from rdmaplane.cli import scheduler as _scheduler  # noqa: E402

app.add_typer(_scheduler.app)  # scheduler-extender, explain-placement

from rdmaplane.cli import agent as _agent  # noqa: E402

app.command("agent")(_agent.agent)

from rdmaplane.cli import config as _config  # noqa: E402

app.add_typer(_config.config_app, name="config")

from rdmaplane.cli import fabric as _fabric  # noqa: E402

app.add_typer(_fabric.app, name="fabric")

from rdmaplane.cli import webhook as _webhook  # noqa: E402

app.add_typer(_webhook.app)  # webhook, inject


def main() -> None:
    app()
