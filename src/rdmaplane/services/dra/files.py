"""The driver's files: CDI specs and the checkpoint, each replaced atomically.

A reader (the container runtime's CDI cache, the driver after a crash) sees the old file or the
new one, never a torn one (`rdmaplane.adapters.atomicfile`). Temporary files left by a crash start
with
`.rdmaplane-` and are removed at start.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rdmaplane.adapters import atomicfile
from rdmaplane.adapters.atomicfile import TEMP_PREFIX

log = logging.getLogger("rdmaplane.services.dra")


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` (see `rdmaplane.adapters.atomicfile`); creates the folder if
    missing."""
    folder = path.parent
    if not folder.is_dir():
        folder.mkdir(parents=True)
        log.info("created %s", folder)
    atomicfile.write_atomically(path, data)


def write_json(path: Path, obj: Mapping[str, Any]) -> None:
    write_atomically(path, json.dumps(obj, indent=1, sort_keys=True).encode())


def remove(path: Path) -> bool:
    """Delete `path`; False when it was not there."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def leftovers(folder: Path) -> Iterator[Path]:
    """Temporary files a crash left in `folder`."""
    if folder.is_dir():
        yield from (p for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX))
