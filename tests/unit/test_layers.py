"""The shape of the code: a folder is its layer. `lint-imports` (pyproject's
[tool.importlinter], run by `make lint`) checks the imports; these tests keep the contracts
about folders, the pure layers under mypy --strict, every module on docs/architecture.md's
map, one name per public class, and the allow-list contract type honest."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "rdmaplane"
GENERATED = PACKAGE / "adapters" / "kubelet" / "api"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def modules() -> list[str]:
    """Every module of ours, dotted, the generated kubelet stubs aside."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def matches(pattern: str, module: str) -> bool:
    """import-linter's module expressions: `*` one name, `**` any names below."""
    regex = re.escape(pattern).replace(r"\*\*", ".+").replace(r"\*", r"[^.]+")
    return re.fullmatch(regex, module) is not None


def mypy_matches(pattern: str, module: str) -> bool:
    """mypy's override patterns: a trailing `.*` takes the module and all below it."""
    if pattern.endswith(".*"):
        return matches(pattern[:-2], module) or matches(pattern[:-2] + ".**", module)
    return matches(pattern, module)


def contracts() -> list[dict[str, object]]:
    return PYPROJECT["tool"]["importlinter"]["contracts"]  # type: ignore[no-any-return]


def contract(contract_id: str) -> dict[str, object]:
    return next(c for c in contracts() if c["id"] == contract_id)


def test_contracts_name_folders_and_ignore_nothing() -> None:
    """A contract names packages (folders) or patterns, never one module: a new file in a
    layer needs no edit of pyproject; and no contract has exceptions."""
    for c in contracts():
        assert "ignore_imports" not in c, c["id"]
        named = [
            *c.get("source_modules", []),  # type: ignore[misc]
            *c.get("modules", []),  # type: ignore[misc]
            *c.get("containers", []),  # type: ignore[misc]
        ]
        for name in named:
            if "*" in name:
                continue
            folder = ROOT / "src" / Path(*name.split("."))
            assert folder.is_dir(), f"contract {c['id']} names {name}, not a folder"


@pytest.mark.parametrize("contract_id", ["pure", "pure-io"])
def test_the_pure_layers_match_modules(contract_id: str) -> None:
    sources = contract(contract_id)["source_modules"]
    for pattern in sources:  # type: ignore[attr-defined]
        assert any(matches(pattern, m) for m in modules()), f"{pattern} matches no module"


def test_the_pure_layers_are_held_to_mypy_strict() -> None:
    strict = [
        p
        for override in PYPROJECT["tool"]["mypy"]["overrides"]
        if override.get("strict")
        for p in override["module"]
    ]
    pure = contract("pure")["source_modules"]
    assert pure == contract("pure-io")["source_modules"]
    for module in modules():
        if any(matches(p, module) for p in pure):  # type: ignore[attr-defined]
            assert any(mypy_matches(p, module) for p in strict), (
                f"{module}: not under mypy --strict"
            )


def drawn(tree: str) -> set[str]:
    """The paths a tree drawing (`├── name`, `│   ` per level) names, relative to its root."""
    paths: set[str] = set()
    stack: list[str] = []
    for line in tree.splitlines():
        found = re.match(r"^([│ ]*)[├└]── (\S+)", line)
        if found:
            depth = len(found.group(1)) // 4
            del stack[depth:]
            stack.append(found.group(2).rstrip("/"))
            paths.add("/".join(stack))
    return paths


def test_the_architecture_map_draws_the_tree_as_it_is() -> None:
    """docs/architecture.md's drawing of src/rdmaplane names every package and module (the
    packages' `__init__.py` and the generated stubs aside), and nothing that is not there."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    tree = doc[doc.index("<!-- tree -->") : doc.index("<!-- /tree -->")]
    there = {GENERATED.relative_to(PACKAGE).as_posix()}  # drawn as one folder
    for path in PACKAGE.rglob("*.py"):
        if GENERATED in path.parents or path.name == "__init__.py":
            continue
        relative = path.relative_to(PACKAGE)
        there.add(relative.as_posix())
        there.update(parent.as_posix() for parent in relative.parents if parent.name)
    assert sorted(there - drawn(tree)) == [], "modules missing from docs/architecture.md's tree"
    assert sorted(drawn(tree) - there) == [], "docs/architecture.md draws what is not there"


def test_public_class_names_are_unique() -> None:
    """One name, one thing: a public class is defined once in the package."""
    where: dict[str, list[str]] = defaultdict(list)
    for module in modules():
        path = PACKAGE.parent / Path(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(module)
    twice = {name: found for name, found in where.items() if len(found) > 1}
    assert not twice, twice


def lint(tmp_path: Path, module_text: str) -> subprocess.CompletedProcess[str]:
    """`lint-imports` over a two-module package `toy` whose `toy.pure` may import only the
    standard library, `toy.values` and `msgspec`."""
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "values.py").write_text("X = 1\n")
    (package / "shell.py").write_text("import os\n")
    (package / "pure.py").write_text(module_text)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.importlinter]\nroot_package = "toy"\ninclude_external_packages = true\n'
        'contract_types = ["allowed: tests.import_contracts.AllowedImportsContract"]\n'
        '[[tool.importlinter.contracts]]\nname = "pure"\ntype = "allowed"\n'
        'source_modules = ["toy.pure"]\nallowed_modules = ["toy.values", "msgspec"]\n'
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True
    )


def test_the_allow_list_keeps_what_it_allows(tmp_path: Path) -> None:
    done = lint(tmp_path, "import re\nimport msgspec\nfrom toy import values\n")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_allow_list_names_each_import_it_does_not_allow(tmp_path: Path) -> None:
    done = lint(tmp_path, "import re\nimport httpx2\nfrom toy import shell\n")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "toy.pure imports httpx2 (l.2), not on the allow-list" in done.stdout
    assert "toy.pure imports toy.shell (l.3), not on the allow-list" in done.stdout
