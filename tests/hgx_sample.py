"""One materialised hgx-h100-roce tree per test process (building it takes seconds).

Tests that change the tree must put it back."""

from __future__ import annotations

import atexit
import contextlib
import functools
from pathlib import Path

from rdmaplane.discovery import read_node, samples
from rdmaplane.model import NodeTopology

SAMPLE = "hgx-h100-roce"
_cleanup = contextlib.ExitStack()
atexit.register(_cleanup.close)


@functools.cache
def hgx_tree() -> Path:
    return _cleanup.enter_context(samples.materialised(SAMPLE))


@functools.cache
def hgx_topology() -> NodeTopology:
    return read_node(str(hgx_tree()))
