"""Default node paths are written once (`rdmaplane.core.paths`), and `--sysfs-root` is declared
once (`rdmaplane.cli.common.SysfsRootOption`, one help text) for every command that takes it."""

from __future__ import annotations

import ast
import importlib
import inspect
import typing
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rdmaplane.cli import COMMANDS, app
from rdmaplane.cli.common import SysfsRootOption
from rdmaplane.core import paths

SRC = Path(__file__).resolve().parents[2] / "src" / "rdmaplane"
GENERATED = SRC / "adapters" / "kubelet" / "api"
# What a default path or a folder below the kubelet's is spelled as (a `/dev` literal is also
# what a hostPath names in the webhook's checks, so it is not searched for).
DEFAULTS = {"/sys", "/var/lib/kubelet", "/var/run/cdi"}
KUBELET_NAMES = {"device-plugins", "plugins_registry", "pod-resources", "kubelet.sock"}


def test_the_defaults_keep_their_values() -> None:
    assert (paths.SYSFS, paths.DEV, paths.KUBELET_DIR, paths.CDI_DIR) == (
        "/sys",
        "/dev",
        "/var/lib/kubelet",
        "/var/run/cdi",
    )


def test_src_takes_its_default_paths_from_the_one_module() -> None:
    stray = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "core" / "paths.py" or GENERATED in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in DEFAULTS | KUBELET_NAMES:
                stray.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value}")
    assert not stray, stray


def _commands() -> dict[str, object]:
    """Every command's function, by its name (`rdmaplane snapshot create`: `snapshot create`)."""
    out: dict[str, object] = {}
    for name, (where, _) in COMMANDS.items():
        module, _, attribute = where.partition(":")
        target = getattr(importlib.import_module(module), attribute)
        if isinstance(target, typer.Typer):
            for info in target.registered_commands:
                out[f"{name} {info.name or info.callback.__name__}"] = info.callback
        else:
            out[name] = target
    return out


def test_every_sysfs_root_is_the_one_option() -> None:
    taking = []
    for name, function in _commands().items():
        hints = typing.get_type_hints(function, include_extras=True)
        for parameter in inspect.signature(function).parameters:  # type: ignore[arg-type]
            hint = hints.get(parameter)
            options = [m for m in getattr(hint, "__metadata__", ()) if hasattr(m, "param_decls")]
            # Annotated, typer takes the first name as the `default` it used to be
            if any("--sysfs-root" in (o.default, *(o.param_decls or ())) for o in options):
                assert hint == SysfsRootOption, name
                taking.append(name)
    assert {"inspect", "agent", "dra-driver", "device-plugin", "snapshot create"} <= set(taking)


def test_sysfs_root_is_declared_once_in_the_cli() -> None:
    declared = [
        path.name
        for path in sorted((SRC / "cli").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "Option"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "--sysfs-root"
    ]
    assert declared == ["common.py"]


@pytest.mark.parametrize(
    "command",
    [
        ["inspect"],
        ["gid", "explain"],
        ["snapshot", "create", "-o", "x.tar.gz"],
        ["agent"],
        ["dra-driver"],
        ["device-plugin", "--config", "x.yaml"],
    ],
)
def test_an_empty_sysfs_root_is_refused_alike(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--sysfs-root", ""])
    assert result.exit_code == 2
    assert result.output == "error: --sysfs-root: empty value (leave the flag out to read /sys)\n"
