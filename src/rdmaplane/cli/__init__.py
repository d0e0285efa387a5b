"""The one `rdmaplane` command. Each command group lives in its own module and is added here.

The command groups are imported when the app is built, not when this package is: the device
plugin runs for months on every node, and `rdmaplane device-plugin` loads only its own
command (`main` takes that path), which keeps the other groups' imports out of its memory and
its start time.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

import typer

from rdmaplane import __version__

HELP = "RDMA for GPU pods on Kubernetes: discover, plan, schedule, validate."


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rdmaplane {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """RDMA for GPU pods on Kubernetes: discover, plan, schedule, validate."""


def _typer() -> typer.Typer:
    app = typer.Typer(
        name="rdmaplane",
        help=HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback()(_root)
    return app


def _device_plugin_only() -> typer.Typer:
    from rdmaplane.cli.deviceplugin import device_plugin

    app = _typer()
    app.command("device-plugin")(device_plugin)
    return app


@cache
def build_app() -> typer.Typer:
    """Every command group."""
    from rdmaplane.cli import agent as _agent
    from rdmaplane.cli import doctor as _doctor
    from rdmaplane.cli import fabric as _fabric
    from rdmaplane.cli import gid as _gid
    from rdmaplane.cli import inspect as _inspect
    from rdmaplane.cli import scheduler as _scheduler
    from rdmaplane.cli.deviceplugin import device_plugin

    app = _typer()
    app.command("device-plugin")(device_plugin)
    app.command("inspect")(_inspect.inspect)
    app.command("samples")(_inspect.list_samples)
    app.add_typer(_inspect.snapshot_app, name="snapshot")
    app.command("env")(_gid.env)
    app.add_typer(_gid.app, name="gid")
    app.add_typer(_doctor.doctor_app, name="doctor")
    app.add_typer(_scheduler.app)  # scheduler-extender, explain-placement
    app.command("agent")(_agent.agent)
    app.add_typer(_fabric.app, name="fabric")
    return app


def __getattr__(name: str) -> Any:
    """`from rdmaplane.cli import app` (the tests' CliRunner) gets the whole command."""
    if name == "app":
        return build_app()
    raise AttributeError(name)


def main() -> None:
    if sys.argv[1:2] == ["device-plugin"]:
        _device_plugin_only()()
    else:
        build_app()()
