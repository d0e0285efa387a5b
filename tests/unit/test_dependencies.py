"""Every third-party package the code under src/ imports is declared in pyproject: the product's
dependencies, or an extra that names the feature (`nvml`, `torch`), never only the dev tools.
A package that merely arrives through another (httpx2 through lightkube) is one release away
from an ImportError."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "rdmaplane"


def normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {k: v for k, v in project["optional-dependencies"].items() if k != "dev"}
    requirements = [*project["dependencies"], *(r for v in extras.values() for r in v)]
    return {normalized(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in requirements}


def third_party_imports() -> dict[str, set[str]]:
    """Each imported top-level module that is neither stdlib nor ours, with its importers."""
    found: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.split(".")[0] not in {*sys.stdlib_module_names, "rdmaplane"}:
                    found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


@functools.cache
def owners() -> dict[Path, str]:
    """Every installed file, by the distribution that installed it."""
    return {
        Path(str(d.locate_file(f))).resolve(): normalized(d.metadata["Name"])
        for d in importlib.metadata.distributions()
        for f in d.files or []
        if f.suffix == ".py"
    }


def distribution(module: str) -> str:
    """The distribution that installed `module`'s file (lightkube.resources comes from
    lightkube-models, not lightkube); a package not installed here (torch) by its own name."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        spec = None
    if spec is None or spec.origin is None:
        return normalized(module.split(".")[0])
    return owners().get(Path(spec.origin).resolve(), normalized(module.split(".")[0]))


def test_every_imported_package_is_declared() -> None:
    wanted = declared()
    missing = {
        module: sorted(importers)
        for module, importers in third_party_imports().items()
        if distribution(module) not in wanted
    }
    assert not missing, f"imported but not declared in pyproject: {missing}"


def test_a_module_is_owned_by_the_distribution_that_installed_it() -> None:
    assert distribution("lightkube.resources.core_v1") == "lightkube-models"
    assert distribution("lightkube.core.exceptions") == "lightkube"
    assert distribution("google.protobuf.descriptor") == "protobuf"
