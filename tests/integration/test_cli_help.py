"""Every `--help` page, rendered at 80 columns as a terminal shows it, and what the root
command imports before it runs one."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from rdmaplane.cli import COMMANDS, app, load_command

runner = CliRunner()


def _paths(command: Any, path: tuple[str, ...]) -> list[tuple[str, ...]]:
    found = [path]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        found += _paths(sub, (*path, name))
    return found


PATHS = [()] + [p for name in COMMANDS for p in _paths(load_command(name), (name,))]

# What a help page must never show: a type placeholder instead of a word for the value, a
# space before a full stop (what rich left of a `[default: x]` it took for markup), an option
# name or summary cut short, Python's None.
PROBLEMS = {
    "type placeholder": re.compile(r"<(str|int|float|path|text)>|\b(TEXT|PATH|INTEGER|FLOAT)\b"),
    "stray ' .'": re.compile(r"\S \.(\s|$)"),
    "cut short": re.compile(r"…|[a-z,]\.\.\.(\s|$)"),
    "None": re.compile(r"\bNone\b"),
}


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "rdmaplane")
def test_help_at_80_columns(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0 and result.stdout.startswith("Usage: rdmaplane"), result.output
    for line in result.stdout.splitlines():
        assert len(line) <= 80, line
        for what, pattern in PROBLEMS.items():
            assert not pattern.search(line), f"{what}: {line!r}"


def test_every_command_of_the_listing_loads_with_its_summary() -> None:
    root = typer.main.get_command(app)
    ctx = typer.Context(root)
    assert root.list_commands(ctx) == list(COMMANDS)
    for name, (_, summary) in COMMANDS.items():
        command = root.get_command(ctx, name)
        assert command.name == name and command.get_short_help_str(200) == summary


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_the_root_imports_no_command(args: list[str]) -> None:
    """`--version` and `--help` load typer and the listing, not a command module nor what the
    commands use (bench/cli.py measures the time this saves)."""
    code = (
        "import sys; from rdmaplane.cli import main; sys.argv = ['rdmaplane', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = ('rdmaplane.cli.', 'rich', 'pydantic', 'yaml', 'rdmaplane.core.model')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["inspect", "--sample", "dgx-a100", "--sample", "workstation"], "--sample given twice"),
        (["inspect", "--sample", "dgx-a100", "-o", "json", "-o", "yaml"], "-o given twice"),
        (["inspect", "-o", "json", "--output", "yaml"], "-o and --output are one option"),
        (["doctor", "-o", "json", "-o", "table"], "-o given twice"),
        (["snapshot", "create", "-o", "a", "-o", "b"], "-o given twice"),
        (["gid", "explain", "--family", "4", "--family=6"], "--family given twice"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else "",
)
def test_a_flag_given_twice_is_refused(args: list[str], said: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: ") and said in result.stderr
    assert result.stderr.count("\n") == 1


def test_repeatable_flags_stay_repeatable() -> None:
    result = runner.invoke(
        app, ["env", "--sample", "hgx-h100-roce", "--hca", "mlx5_0", "--hca", "mlx5_1"]
    )
    assert result.exit_code == 0 and "mlx5_0" in result.stdout and "mlx5_1" in result.stdout


def test_config_defaults_names_every_kind() -> None:
    """The help names the kinds without loading them (pydantic); this keeps it whole."""
    from rdmaplane.adapters.config.kinds import KINDS

    shown = " ".join(runner.invoke(app, ["config", "defaults", "--help"]).stdout.split())
    assert all(kind in shown for kind in KINDS), shown
