"""The driver's files: CDI specs and the checkpoint, each replaced atomically.

A reader (the container runtime's CDI cache, the driver after a crash) sees the old file or the
new one, never a torn one: the data goes to a temporary file in the same folder, is flushed to
disk, and renamed over the target; the folder is flushed too, so the rename survives a power
loss. Temporary files left by a crash start with `.rdmaplane-` and are removed at start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("rdmaplane.dra")
TEMP_PREFIX = ".rdmaplane-"


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` (see the module docstring); creates the folder if missing."""
    folder = path.parent
    if not folder.is_dir():
        folder.mkdir(parents=True)
        log.info("created %s", folder)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=TEMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def write_json(path: Path, obj: Mapping[str, Any]) -> None:
    write_atomically(path, json.dumps(obj, indent=1, sort_keys=True).encode())


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
