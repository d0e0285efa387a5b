"""The one `rdmaplane` command. Each command group lives in its own module and is added here.

The command groups are imported when the app is built, not when this package is: the device
plugin runs for months on every node, and `rdmaplane device-plugin` loads only its own command
(`main` takes that path), which keeps the other groups' imports out of its memory and its
start time.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from functools import cache
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from rdmaplane import __version__
from rdmaplane.cli.common import say_error
from rdmaplane.cli.deviceplugin import device_plugin

# click's exceptions, from wherever this typer takes click (newer releases vendor it)
_errors = importlib.import_module(typer.BadParameter.__module__)


class _Rdmaplane(TyperGroup):
    """The root group: a bad flag or argument is one `error:` line naming it, like every other
    bad input, instead of click's usage box (the usage is one `--help` away)."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        extra["windows_expand_args"] = windows_expand_args
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, False, **extra)
        except _errors.NoArgsIsHelpError:
            sys.exit(2)  # the help is printed already
        except _errors.UsageError as e:
            where = f"{e.ctx.command_path}: " if e.ctx else ""
            hint = f" (see {e.ctx.command_path if e.ctx else self.name} --help)"
            _exit(f"{where}{e.format_message()}{hint}", e.exit_code)
        except _errors.ClickException as e:
            _exit(e.format_message(), e.exit_code)
        except typer.Abort:
            _exit("aborted", 1)
        sys.exit(result if isinstance(result, int) else 0)


def _exit(message: str, code: int) -> NoReturn:
    say_error(message)
    sys.exit(code)


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
    """The root command with `device-plugin` only."""
    app = typer.Typer(
        name="rdmaplane",
        cls=_Rdmaplane,
        help="RDMA for GPU pods on Kubernetes: discover, plan, schedule, validate.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
    )
    app.callback()(_root)
    app.command("device-plugin")(device_plugin)
    return app


@cache
def build_app() -> typer.Typer:
    """Every command group."""
    from rdmaplane.cli import agent as _agent
    from rdmaplane.cli import config as _config
    from rdmaplane.cli import doctor as _doctor
    from rdmaplane.cli import fabric as _fabric
    from rdmaplane.cli import gid as _gid
    from rdmaplane.cli import inspect as _inspect
    from rdmaplane.cli import scheduler as _scheduler
    from rdmaplane.cli import webhook as _webhook
    from rdmaplane.cli.nrt import nrt_command

    app = _typer()
    app.command("inspect")(_inspect.inspect)
    app.add_typer(_inspect.samples_app, name="samples")
    app.add_typer(_inspect.snapshot_app, name="snapshot")
    app.command("env")(_gid.env)
    app.add_typer(_gid.app, name="gid")
    app.command("nrt")(nrt_command)
    app.add_typer(_doctor.doctor_app, name="doctor")
    app.add_typer(_scheduler.app)  # scheduler-extender, explain-placement
    app.command("agent")(_agent.agent)
    app.add_typer(_config.config_app, name="config")
    app.add_typer(_fabric.app, name="fabric")
    app.add_typer(_webhook.app)  # webhook, inject
    return app


def __getattr__(name: str) -> Any:
    """`from rdmaplane.cli import app` (the tests' CliRunner) gets the whole command."""
    if name == "app":
        return build_app()
    raise AttributeError(name)


def main() -> None:
    (_typer() if sys.argv[1:2] == ["device-plugin"] else build_app())()
