"""The one `rdmaplane` command.

A command's module is imported when that command runs (or its help is shown), never at start:
`rdmaplane --version` and `rdmaplane --help` cost typer and `COMMANDS` only, and each command
loads what it uses (bench/cli.py measures it). `COMMANDS` is the root's listing: each command's
name, where it lives, and its one-line summary.

Help is click's plain text (no rich panels): it wraps to the terminal and never cuts an option
name short, and it costs no rich import.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any, Final, NoReturn

import typer
from typer.core import TyperGroup, TyperOption
from typer.models import CommandInfo, TyperInfo

from rdmaplane import __version__
from rdmaplane.core.errors import InputError, RdmaplaneError

# click's exceptions, from wherever this typer takes click (newer releases vendor it)
_errors: Any = importlib.import_module(typer.BadParameter.__module__)

# name → ("module:attribute", summary): a function is a command, a typer.Typer a group of them.
COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "inspect": (
        "rdmaplane.cli.inspect:inspect",
        "Show a node's GPUs, RDMA NICs, ports, GIDs, NUMA nodes and PCIe relations.",
    ),
    "samples": (
        "rdmaplane.cli.inspect:samples_app",
        "List the bundled sample nodes, or lay one out.",
    ),
    "snapshot": (
        "rdmaplane.cli.inspect:snapshot_app",
        "Capture a node's sysfs subset for support.",
    ),
    "env": (
        "rdmaplane.cli.gid:env",
        "Print the NCCL/UCX environment for this node's compute ports.",
    ),
    "gid": ("rdmaplane.cli.gid:app", "The GID index NCCL should use: explain it, audit it."),
    "audit": (
        "rdmaplane.cli.audit:audit_command",
        "Firmware versions and PCIe links across nodes: the outliers.",
    ),
    "nrt": (
        "rdmaplane.cli.nrt:nrt_command",
        "Print the NodeResourceTopology the node agent would publish.",
    ),
    "doctor": ("rdmaplane.cli.doctor:doctor_app", "Prove inside the pod that RDMA is really used."),
    "scheduler-extender": (
        "rdmaplane.cli.scheduler:scheduler_extender",
        "Serve /filter and /prioritize for kube-scheduler.",
    ),
    "explain-placement": (
        "rdmaplane.cli.scheduler:explain_placement",
        "Why each node would or would not get a pod, and its score (the extender's own answer).",
    ),
    "fabric": (
        "rdmaplane.cli.fabric:app",
        "The fabric between nodes; exports for gang schedulers.",
    ),
    "webhook": ("rdmaplane.cli.webhook:webhook", "Serve the mutating admission webhook."),
    "inject": ("rdmaplane.cli.webhook:inject_command", "Show what the webhook does to a manifest."),
    "config": ("rdmaplane.cli.config:config_app", "Print a config kind's defaults, check files."),
    "agent": ("rdmaplane.cli.agent:agent", "Run the node agent (one per GPU node)."),
    "dra-driver": ("rdmaplane.cli.dra:dra_driver", "Run the node agent as the DRA driver."),
    "device-plugin": (
        "rdmaplane.cli.deviceplugin:device_plugin",
        "Run the kubelet device plugin for this node's RDMA NICs.",
    ),
}


def load_command(name: str) -> Any:
    """The click command for `name` (None when there is none), its module imported now."""
    entry = COMMANDS.get(name)
    if entry is None:
        return None
    target, summary = entry
    module, _, attribute = target.partition(":")
    obj = getattr(importlib.import_module(module), attribute)
    command: Any
    if isinstance(obj, typer.Typer):
        command = typer.main.get_group_from_info(
            TyperInfo(obj, name=name),
            pretty_exceptions_short=True,
            suggest_commands=True,
            rich_markup_mode=None,
        )
    else:
        command = typer.main.get_command_from_info(
            CommandInfo(name=name, callback=obj),
            pretty_exceptions_short=True,
            rich_markup_mode=None,
        )
    command.short_help = summary
    _whole_summaries(command)
    return command


def _whole_summaries(group: Any) -> None:
    """A group's listing shows each subcommand's first sentence whole (click would cut it at
    the width left beside the names, mid-word)."""
    for sub in getattr(group, "commands", {}).values():
        if not sub.short_help and sub.help:
            first = sub.help.split("\n\n")[0]
            sub.short_help = " ".join(first.split()).partition(". ")[0].rstrip(".") + "."
        _whole_summaries(sub)


class _Rdmaplane(TyperGroup):
    """The root group: commands loaded on use; a bad flag or argument, or a flag given twice,
    is one `error:` line naming it, like every other bad input, instead of click's usage box
    (the usage is one `--help` away). The exit codes, in one place: 2 for bad input (a usage
    error, any `InputError` a command lets through), 1 for any other `RdmaplaneError`, a
    command's own `fail(message, code)` otherwise."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return load_command(cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The listing from `COMMANDS` alone: `--help` imports no command."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary) for name, (_, summary) in COMMANDS.items()])

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
        argv = list(sys.argv[1:] if args is None else args)
        try:
            argv = expand_lists(self, argv)
            result = super().main(argv, prog_name, complete_var, False, **extra)
        except _errors.NoArgsIsHelpError:
            sys.exit(2)  # the help is printed already
        except _errors.UsageError as e:
            where = f"{e.ctx.command_path}: " if e.ctx else ""
            hint = f" (see {e.ctx.command_path if e.ctx else self.name} --help)"
            _exit(f"{where}{_plain_words(e.format_message())}{hint}", e.exit_code)
        except _errors.ClickException as e:
            _exit(e.format_message(), e.exit_code)
        except typer.Abort:
            _exit("aborted", 1)
        except InputError as e:  # a file, flag or document that cannot be used
            _exit(str(e), 2)
        except RdmaplaneError as e:  # work that could not be done with good input
            _exit(str(e), 1)
        sys.exit(result if isinstance(result, int) else 0)


def expand_lists(root: Any, argv: list[str]) -> list[str]:
    """`argv` with each list option's values spelled out (`--nrt a.yaml b.yaml` → `--nrt
    a.yaml --nrt b.yaml`, for options whose metavar ends in `...`), after refusing an option
    given twice that takes one value: the last would silently win.

    Walks the command path as click will (a group's options, then its subcommand's); where
    click's own parse will fail, it leaves the arguments as they are, for click to say what is
    wrong."""
    out: list[str] = []
    command, ctx, rest = root, None, argv
    while True:
        ctx = typer.Context(command, parent=ctx, info_name=command.name, resilient_parsing=True)
        try:
            _, left, order = command.make_parser(ctx).parse_args(list(rest))
        except _errors.UsageError:
            return out + rest
        _refuse_repeats(order, rest, ctx)
        if not isinstance(command, TyperGroup):
            return out + _spelled_out(command, rest)
        out += rest[: len(rest) - len(left)]  # a group stops at its subcommand's name
        sub = command.get_command(ctx, left[0]) if left else None
        if sub is None:
            return [*out, *left]
        out.append(left[0])
        command, rest = sub, left[1:]


def _refuse_repeats(order: list[Any], args: list[str], ctx: Any) -> None:
    """A usage error for an option that takes one value given twice, naming it as typed."""
    seen: set[str] = set()
    for param in order:
        if not isinstance(param, TyperOption) or param.multiple or param.count:
            continue
        if param.name in seen:
            typed = dict.fromkeys(
                a.partition("=")[0] for a in args if a.partition("=")[0] in param.opts
            )
            said = (
                f"{' and '.join(typed)} are one option"
                if len(typed) > 1
                else f"{next(iter(typed), param.opts[0])} given twice"
            )
            raise _errors.UsageError(f"{said}; give it once", ctx)
        seen.add(str(param.name))


def _spelled_out(command: Any, args: list[str]) -> list[str]:
    """Each value after a list option (metavar `X...`) up to the next flag, as its own
    occurrence of the option."""
    lists = {
        name
        for p in getattr(command, "params", ())
        if isinstance(p, TyperOption) and p.multiple and str(p.metavar or "").endswith("...")
        for name in p.opts
    }
    out: list[str] = []
    current: str | None = None
    spelled: list[int] = []  # where a repeated option name was put in
    for arg in args:
        if arg.startswith("-") and arg != "-":
            current = arg if arg in lists else None
            out.append(arg)
        elif current is not None and out[-1] != current:
            spelled.append(len(out))
            out += [current, arg]
        else:
            out.append(arg)
    # `--nrt A B pod.yaml`: the last values go back to the arguments the command still lacks
    missing = _required_arguments(command) - _positionals(command, out)
    for at in reversed(spelled[len(spelled) - max(missing, 0) :] if missing > 0 else []):
        out.append(out.pop(at + 1))
        del out[at]
    return out


def _required_arguments(command: Any) -> int:
    return sum(
        1
        for p in getattr(command, "params", ())
        if not isinstance(p, TyperOption) and p.required and p.nargs == 1
    )


def _positionals(command: Any, args: list[str]) -> int:
    """How many of `args` are arguments, not options or their values."""
    takes_value = {
        name
        for p in getattr(command, "params", ())
        if isinstance(p, TyperOption) and not p.is_flag and not p.count
        for name in p.opts
    }
    count, skip = 0, False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--":
            break
        elif arg.startswith("-") and arg != "-":
            skip = arg in takes_value
        else:
            count += 1
    return count


# click names a value's type as Python does; users read the words of their input
_TYPE_NAMES = (
    ("is not a valid int.", "is not a whole number."),
    ("is not a valid integer.", "is not a whole number."),
    ("is not a valid float.", "is not a number."),
    ("is not a valid boolean.", "is not true or false."),
)


def _plain_words(message: str) -> str:
    for python, plain in _TYPE_NAMES:
        message = message.replace(python, plain)
    return message


def _exit(message: str, code: int) -> NoReturn:
    from rdmaplane.cli.common import say_error

    say_error(message)
    sys.exit(code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rdmaplane {__version__}")
        raise typer.Exit()


app = typer.Typer(
    name="rdmaplane",
    cls=_Rdmaplane,
    help="RDMA for GPU pods on Kubernetes: discover, plan, schedule, validate.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """RDMA for GPU pods on Kubernetes: discover, plan, schedule, validate."""


def main() -> None:
    # rdmaplane uses no pydantic plugin; looking for them costs ~15 ms of every command that
    # reads a config file (importlib.metadata over every installed distribution)
    import os

    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    app()
