"""The shape of the code is checked by `lint-imports` (pyproject's [tool.importlinter], run by
`make lint`): these tests keep the contracts honest — the core they name is held to mypy
--strict, and the allow-list contract type breaks when a module imports what it may not."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def contract(contract_id: str) -> dict[str, object]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c for c in contracts["contracts"] if c["id"] == contract_id)


def test_core_is_held_to_mypy_strict() -> None:
    """Every module the `core` and `settings` contracts name is in a `strict = true` override."""
    strict: set[str] = set()
    for override in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"][
        "overrides"
    ]:
        if override.get("strict"):
            strict |= set(override["module"])
    names = [*contract("core")["source_modules"], *contract("settings")["source_modules"]]  # type: ignore[misc]
    missing = [n for n in names if n not in strict]
    assert not missing, f"not under mypy --strict: {missing}"


def test_the_core_and_its_io_contract_name_the_same_modules() -> None:
    assert contract("core")["source_modules"] == contract("core-io")["source_modules"]
    assert contract("settings")["source_modules"] == contract("settings-io")["source_modules"]


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
