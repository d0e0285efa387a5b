"""Tests that train with PyTorch carry the `torch` marker: `make test` installs torch first
(`make torch`); `make test-fast` leaves them out (-m "not e2e and not torch")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TORCH_TESTS = {"test_resume.py", "test_state.py"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.path).name in TORCH_TESTS:
            item.add_marker(pytest.mark.torch)


@pytest.fixture(autouse=True)
def torch_installed(request: pytest.FixtureRequest) -> None:
    """Fail (never skip) a torch test without torch and numpy, saying how to get them."""
    missing = [m for m in ("torch", "numpy") if importlib.util.find_spec(m) is None]
    if request.node.get_closest_marker("torch") and missing:
        pytest.fail(f"{' and '.join(missing)} not installed: run `make torch`", pytrace=False)
