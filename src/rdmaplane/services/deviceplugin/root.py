"""The standalone device plugin's serving process: what `rdmaplane device-plugin` becomes once
its command line and config file are checked.

The plugin runs for months on every node, so what it holds in memory counts. The CLI (typer,
click) and the config validator (pydantic, with errors naming the key) are needed for a few
hundred milliseconds at the start and would stay resident for good, ~25 MB. So the command
checks everything, then replaces itself (`os.execv`: the same process, one at a time, no
child) with `python -m rdmaplane.services.deviceplugin.root FD`, handing over the checked
`Standalone` settings as a pickle in an anonymous memory file inherited as FD. This process
loads asyncio, gRPC, the kubelet stubs, discovery and the plugin, nothing else. It is not an
interface of its own: run `rdmaplane device-plugin`.

Python's `ssl` is kept out too: asyncio imports it when it can, for TLS transports this
process never opens (it serves and dials unix sockets in the clear; gRPC carries its own TLS
library, unused here), and loading it costs ~4 MB resident and ~30 ms at the start.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import NoReturn

from rdmaplane.adapters import logs
from rdmaplane.core.settings.deviceplugin import Standalone
from rdmaplane.core.untrusted import printable


def exec_standalone(launch: Standalone) -> NoReturn:
    """Replace this process with the serving one (called by the CLI once all is checked)."""
    fd = os.memfd_create("rdmaplane-device-plugin", 0)
    os.write(fd, pickle.dumps(launch))
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", __name__, str(fd)])


def _fail(message: str, code: int) -> NoReturn:
    """The CLI's error line (`error: ...`, one line, escapes shown escaped), without rich."""
    print(f"error: {printable(message)}", file=sys.stderr, flush=True)
    sys.exit(code)


def main(argv: list[str]) -> None:
    if len(argv) != 2 or not argv[1].isdigit():
        _fail("run `rdmaplane device-plugin`; this module serves what it hands over", 2)
    try:
        with os.fdopen(int(argv[1]), "rb") as f:
            launch = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError) as e:
        _fail(f"fd {argv[1]}: cannot read the handed-over settings: {e}", 2)
    if not isinstance(launch, Standalone):
        _fail(f"fd {argv[1]} holds no device plugin settings", 2)
    sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]  # asyncio goes without it
    import asyncio

    from rdmaplane.adapters.kubelet.sockets import ServeError
    from rdmaplane.services.deviceplugin.plugin import run_standalone

    logs.configure(launch.log_format, launch.log_level)
    try:
        asyncio.run(
            run_standalone(
                launch.settings,
                sysfs_root=launch.sysfs_root,
                kubelet_dir=launch.kubelet_dir,
                dev_root=launch.dev_root,
            )
        )
    except ServeError as e:
        _fail(str(e), 1)


if __name__ == "__main__":
    main(sys.argv)
