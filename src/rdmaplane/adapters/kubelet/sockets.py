"""Serving gRPC on the kubelet's unix sockets, and seeing those folders change.

Shared by the device plugin and the DRA driver. A socket is served by binding a hidden, uniquely
named socket in the same folder and renaming it into place: the rename is atomic (no moment
without a socket, a stale one from an earlier run is replaced), and gRPC, which unlinks the path
it bound when its server stops, can never take away the socket of the server that replaced it.
The kubelet's plugin watcher ignores names starting with a dot.

Changes in a folder (our socket deleted, a new `kubelet.sock`) wake the caller through inotify,
at once; what changed is then looked at (`rdmaplane.adapters.kubelet.registration`). Our own
socket's identity is exact: no other file can take its inode while our listening socket holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Callable
from pathlib import Path

import grpc
from asyncinotify import Event, Inotify, Mask

from rdmaplane.core.errors import RdmaplaneError

log = logging.getLogger("rdmaplane.adapters.kubelet")

# What happens in a socket folder that can concern us: sockets appearing and going, the folder
# itself going (then its parent is watched for its return).
_FOLDER_EVENTS = (
    Mask.CREATE | Mask.MOVED_TO | Mask.DELETE | Mask.MOVED_FROM | Mask.DELETE_SELF | Mask.MOVE_SELF
)
_serial = itertools.count()


class ServeError(RdmaplaneError):
    """A socket cannot be created (kubelet folder missing, not writable, path too long, …)."""


def inode(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a path, None when it is not there."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


async def serve(
    path: Path, add_servicers: Callable[[grpc.aio.Server], None], owner: str
) -> tuple[grpc.aio.Server, tuple[int, int] | None]:
    """A started gRPC server on `path` (see the module docstring) and the socket's identity;
    the folder is created when missing. `ServeError` names the path and why."""
    folder = path.parent
    hidden = folder / f".{os.getpid()}-{next(_serial)}.sock"
    try:
        if not folder.is_dir():  # the kubelet makes its folders at its start
            folder.mkdir(parents=True)
            log.info("%s: created %s", owner, folder)
    except OSError as e:
        raise ServeError(f"cannot serve on {path}: {e.strerror or e}") from e
    server = grpc.aio.server()
    add_servicers(server)
    try:
        server.add_insecure_port(f"unix://{hidden}")
    except RuntimeError as e:  # grpc: "Failed to bind to address ..."
        raise ServeError(f"cannot serve on {path}: {e}") from e
    await server.start()
    try:
        os.rename(hidden, path)
    except OSError as e:  # e.g. the kubelet wiped the folder between bind and rename
        await server.stop(grace=None)
        raise ServeError(f"cannot serve on {path}: {e.strerror or e}") from e
    return server, inode(path)


class FolderEvents:
    """inotify on a socket folder (or, while it is missing, on its parent).

    One read of the inotify descriptor stays pending across waits: cancelling it at a timeout
    could drop events it had just read."""

    def __init__(self, folder: Path, parent: Path) -> None:
        self.folder = folder
        self.parent = parent
        self._inotify = Inotify(sync_timeout=0)
        self._pending: asyncio.Task[Event] | None = None

    def __enter__(self) -> FolderEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pending is not None:
            self._pending.cancel()
            # the cancelled read's reader callback must not run on a closed descriptor
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(self._inotify.fd)
        self._inotify.close()

    def watch(self) -> None:
        """(Re-)add the watch; adding one that exists already changes nothing."""
        for path, mask in ((self.folder, _FOLDER_EVENTS), (self.parent, Mask.CREATE)):
            with contextlib.suppress(OSError):
                self._inotify.add_watch(path, mask)
                return

    async def changed(self, within: float | None) -> bool:
        """Wait until something changed in the watched folder (True; every event queued is read
        and dropped: the caller looks at the files themselves) or `within` s passed (False;
        None: no limit)."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._inotify.get())
        done, _ = await asyncio.wait({self._pending}, timeout=within)
        if not done:
            return False
        self._pending.result()
        self._pending = None
        while self._inotify.sync_get() is not None:
            pass
        return True
