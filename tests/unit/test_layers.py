"""The shape of the code: a pure core, the components' settings, a config layer that reads
files into them, adapters, services that never import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "rdmaplane"
# The pure core, by dotted name: a module that moves or goes must be renamed here, not dropped.
# A pure module used by one package lives in that package (alloc in the device plugin,
# placement in the scheduler) and is held to the same rules.
CORE = [
    "rdmaplane.model",
    "rdmaplane.topology",
    "rdmaplane.gid",
    "rdmaplane.nccl",
    "rdmaplane.serialize",
    "rdmaplane.selectors",
    "rdmaplane.nrt",
    "rdmaplane.resources",
    "rdmaplane.decoding",
    "rdmaplane.counters",
    "rdmaplane.porthealth",
    "rdmaplane.netns",
    "rdmaplane.usability",
    "rdmaplane.deviceplugin.alloc",
    "rdmaplane.deviceplugin.settings",
    "rdmaplane.scheduler.placement",
    "rdmaplane.agent.health",
    "rdmaplane.agent.desired",
    "rdmaplane.agent.allocation",
    "rdmaplane.agent.inventory",
    "rdmaplane.untrusted",
    "rdmaplane.errors",
    "rdmaplane.setting",
    "rdmaplane.workloads",
    "rdmaplane.fabric",
    "rdmaplane.fabric_export",
    "rdmaplane.scheduler.jobaware",
    "rdmaplane.webhook.inject",
    "rdmaplane.webhook.review",
    "rdmaplane.webhook.certs",
    "rdmaplane.faults",
    "rdmaplane.dra.devices",
    "rdmaplane.dra.slices",
    "rdmaplane.dra.readiness",
    "rdmaplane.dra.claims",
    "rdmaplane.breaker",
    "rdmaplane.repeat",
    "rdmaplane.kernellog",
    "rdmaplane.pcie",
    "rdmaplane.audit",
]
# Each component's settings, defined once (frozen dataclasses): the core and the stdlib's value
# types (a `Path` setting) only, never I/O, so the core reads them and the config layer fills
# them without importing a service.
SETTINGS = [
    "rdmaplane.deviceplugin.settings",
    "rdmaplane.agent.settings",
    "rdmaplane.dra.settings",
    "rdmaplane.scheduler.settings",
    "rdmaplane.webhook.settings",
]
SERVICES = ["agent", "scheduler", "doctor", "webhook"]
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


def module_path(dotted: str) -> Path:
    """The file of a module or package named `rdmaplane.x.y`."""
    rel = Path(*dotted.split(".")[1:])
    package = SRC / rel / "__init__.py"
    return package if package.exists() else SRC / rel.with_suffix(".py")


def imports(path: Path) -> set[str]:
    """Every module `path` imports; `from rdmaplane import x` counts as `rdmaplane.x`."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module == "rdmaplane":  # a module of the package, not a name of its root
                found |= {
                    f"rdmaplane.{a.name}"
                    for a in node.names
                    if module_path(f"rdmaplane.{a.name}").exists()
                }
    return found


def calls_open(path: Path) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "open"
        for n in ast.walk(ast.parse(path.read_text()))
    )


@pytest.mark.parametrize("name", CORE)
def test_core_does_no_io(name: str) -> None:
    path = module_path(name)
    assert path.exists(), f"{name} is listed as core but does not exist: update CORE"
    found = imports(path)
    bad = {m for m in found if m.split(".")[0] in IO_MODULES}
    bad |= {m for m in found if _ours(m) and m not in CORE and m not in SETTINGS}
    assert not bad, f"{name} imports {bad}"
    assert not calls_open(path)


def _ours(module: str) -> bool:
    return module.startswith("rdmaplane") and module != "rdmaplane"


@pytest.mark.parametrize("name", SETTINGS)
def test_settings_import_only_the_core(name: str) -> None:
    import sys

    path = module_path(name)
    found = imports(path)
    bad = {m for m in found if _ours(m) and m not in CORE and m not in SETTINGS}
    foreign = {m for m in found if m.split(".")[0] not in {*sys.stdlib_module_names, "rdmaplane"}}
    bad |= foreign
    bad |= {m for m in found if m.split(".")[0] in IO_MODULES - {"pathlib"}}
    assert not bad, f"{name} imports {bad}"
    assert not calls_open(path)


def test_the_config_layer_imports_no_service() -> None:
    """`rdmaplane.config` reads files into the settings: it imports them, the core and the
    document reader, never a service or an adapter (which import it)."""
    allowed = {*CORE, *SETTINGS, "rdmaplane.documents"}
    for path in (SRC / "config").rglob("*.py"):
        ours = {m for m in imports(path) if _ours(m) and not m.startswith("rdmaplane.config")}
        assert ours <= allowed, f"{path.relative_to(SRC)} imports {ours - allowed}"


def test_core_is_held_to_mypy_strict() -> None:
    """Every core module is in pyproject's `strict = true` override."""
    pyproject = (SRC.parents[1] / "pyproject.toml").read_text()
    missing = [name for name in CORE if f'"{name}"' not in pyproject]
    assert not missing, f"not under mypy --strict: {missing}"


@pytest.mark.parametrize("service", SERVICES)
def test_services_do_not_import_each_other(service: str) -> None:
    assert (SRC / service).is_dir(), f"service package rdmaplane.{service} does not exist"
    others = {f"rdmaplane.{s}" for s in SERVICES if s != service}
    for path in (SRC / service).rglob("*.py"):
        bad = {m for m in imports(path) if any(m == o or m.startswith(o + ".") for o in others)}
        assert not bad, f"{path.relative_to(SRC)} imports {bad}"


def test_train_is_standalone() -> None:
    """`rdmaplane.train` runs inside training pods: the standard library (and torch in its
    PyTorch helpers) only, nothing else of rdmaplane, no third-party package."""
    import sys

    allowed = set(sys.stdlib_module_names) | {"torch", "rdmaplane"}
    for path in (SRC / "train").rglob("*.py"):
        found = imports(path)
        bad = {m for m in found if m.split(".")[0] not in allowed}
        ours = {m for m in found if m.startswith("rdmaplane.")}
        bad |= {m for m in ours if not m.startswith("rdmaplane.train")}
        assert not bad, f"{path.relative_to(SRC)} imports {bad}"
