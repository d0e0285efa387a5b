"""The shape of the code: a pure core, adapters, services that never import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "rdmaplane"
CORE = ["model", "topology", "gid", "nccl", "alloc", "placement", "serialize", "selectors", "nrt"]
SERVICES = ["agent", "scheduler", "webhook", "doctor", "resilience"]
IO_MODULES = {
    "os",
    "io",
    "pathlib",
    "shutil",
    "socket",
    "subprocess",
    "tempfile",
    "tarfile",
    "asyncio",
    "grpc",
    "lightkube",
    "httpx",
    "fastapi",
    "uvicorn",
    "prometheus_client",
    "pynvml",
    "requests",
}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def calls_open(path: Path) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "open"
        for n in ast.walk(ast.parse(path.read_text()))
    )


@pytest.mark.parametrize("name", [c for c in CORE if (SRC / f"{c}.py").exists()])
def test_core_does_no_io(name: str) -> None:
    path = SRC / f"{name}.py"
    bad = {m for m in imports(path) if m.split(".")[0] in IO_MODULES}
    bad |= {m for m in imports(path) if m.startswith("rdmaplane.") and m.split(".")[1] not in CORE}
    assert not bad, f"{name} imports {bad}"
    assert not calls_open(path)


@pytest.mark.parametrize("service", [s for s in SERVICES if (SRC / s).exists()])
def test_services_do_not_import_each_other(service: str) -> None:
    others = {f"rdmaplane.{s}" for s in SERVICES if s != service}
    for path in (SRC / service).rglob("*.py"):
        bad = {m for m in imports(path) if any(m == o or m.startswith(o + ".") for o in others)}
        assert not bad, f"{path.relative_to(SRC)} imports {bad}"
