"""One error root: every error class rdmaplane defines is an `RdmaplaneError`, bad input an
`InputError` (the CLI's exit 2, its mapping in `rdmaplane.cli`), and each name says one thing."""

from __future__ import annotations

import ast
import importlib
from collections import Counter
from pathlib import Path

import pytest

from rdmaplane.core.errors import InputError, RdmaplaneError

SRC = Path(__file__).resolve().parents[2] / "src" / "rdmaplane"
# rdmaplane.train runs inside training pods and imports nothing else of rdmaplane; the kubelet
# API stubs are generated.
LEFT_OUT = ("train", "kubelet/api")


def error_classes() -> list[tuple[str, str]]:
    """(module, class) of every public exception class defined under src/rdmaplane."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(LEFT_OUT):
            continue
        module = "rdmaplane." + rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                cls = getattr(importlib.import_module(module), node.name)
                if isinstance(cls, type) and issubclass(cls, BaseException):
                    found.append((module, node.name))
    return found


ERRORS = error_classes()


@pytest.mark.parametrize(("module", "name"), ERRORS, ids=[f"{m}.{n}" for m, n in ERRORS])
def test_every_error_has_the_one_root(module: str, name: str) -> None:
    assert issubclass(getattr(importlib.import_module(module), name), RdmaplaneError)


def test_each_error_name_is_used_once() -> None:
    twice = [name for name, n in Counter(name for _, name in ERRORS).items() if n > 1]
    assert not twice, f"error classes sharing a name: {twice}"


def test_bad_input_is_an_input_error() -> None:
    """What the CLI answers with exit 2 (the hostile-input corpus holds the exit codes)."""
    from rdmaplane.adapters.config import ConfigError
    from rdmaplane.adapters.discovery import NodeSourceError
    from rdmaplane.adapters.kube import KubeconfigError
    from rdmaplane.core.untrusted import DocumentError, FieldError

    for cls in (ConfigError, DocumentError, FieldError, NodeSourceError, KubeconfigError):
        assert issubclass(cls, InputError), cls
    assert len(ERRORS) > 20  # the walk found them
