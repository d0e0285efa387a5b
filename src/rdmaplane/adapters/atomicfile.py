"""Files replaced whole, for every service that writes one (CDI specs, the DRA checkpoint, the
webhook's certificates): a reader sees the old file or the new one, never a torn one.

The data goes to a temporary file in the same folder (created 0600, as `tempfile.mkstemp`
does), is flushed to disk and renamed over the target; the folder is flushed too, so the rename
survives a power loss. A temporary file left by a crash starts with `TEMP_PREFIX`.
(`rdmaplane.train` keeps its own copy: it runs in training pods and imports nothing of ours.)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

TEMP_PREFIX = ".rdmaplane-"


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data`; its folder must exist. On failure the target is untouched and
    the temporary file is gone."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX)
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
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
