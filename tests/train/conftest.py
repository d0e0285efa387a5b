"""Tests that train with PyTorch carry the `torch` marker: `make test` installs torch first
(`make torch`); `make test-fast` leaves them out (-m "not e2e and not torch")."""

from __future__ import annotations

from pathlib import Path

import pytest

TORCH_TESTS = {"test_ddp.py"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.path).name in TORCH_TESTS:
            item.add_marker(pytest.mark.torch)
