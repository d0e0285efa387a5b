"""Shared fixtures: the bundled sample nodes, materialised once per session."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from rdmaplane.adapters.discovery import samples
from rdmaplane.adapters.discovery.sysfs import read_node
from rdmaplane.core.model import NodeTopology

# No per-example deadline: property tests check behaviour, not speed (that is bench/'s job), and
# a loaded CI machine must not turn a slow example into a failure.
settings.register_profile("rdmaplane", deadline=None, print_blob=True)
settings.load_profile("rdmaplane")


@pytest.fixture(scope="session")
def sample_trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Read-only sysfs trees of every sample. Tests that modify a tree build their own."""
    base = tmp_path_factory.mktemp("samples")
    trees = {}
    for name in samples.names():
        root = base / name
        samples.build(samples.load(name).spec, root)
        trees[name] = root
    return trees


@pytest.fixture(scope="session")
def sample_nodes(sample_trees: dict[str, Path]) -> dict[str, NodeTopology]:
    return {name: read_node(str(root)) for name, root in sample_trees.items()}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: unix socket paths are limited to 107 bytes, and pytest's
    tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="rp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
