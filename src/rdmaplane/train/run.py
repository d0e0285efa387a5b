"""`python -m rdmaplane.train.run -- COMMAND...`: keep exit code 75 through a launcher.

torchrun reports a worker that exited 75 ("checkpoint saved, restart me") as its own exit 1,
which a Job's podFailurePolicy or a Volcano policy would count as a plain failure. This runs
COMMAND with `RDMAPLANE_RESTART_FILE` set; `exit_for_restart()` in any worker creates that
file; if it exists when COMMAND ends, we exit 75, else with COMMAND's code (128+N for a signal,
as a shell does). SIGTERM and SIGINT are passed on to COMMAND.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from rdmaplane.train.notice import ENV_RESTART_FILE, EXIT_RESTART


def run(command: list[str]) -> int:
    if not command:
        print("usage: python -m rdmaplane.train.run -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="rdmaplane-run-") as folder:
        marker = Path(folder) / "restart"
        try:
            child = subprocess.Popen(command, env={**os.environ, ENV_RESTART_FILE: str(marker)})
        except OSError as e:
            print(f"rdmaplane.train.run: cannot start {command[0]}: {e.strerror}", file=sys.stderr)
            return 127
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _: child.send_signal(signum))
        code = child.wait()
        if marker.exists():
            return EXIT_RESTART
        return 128 - code if code < 0 else code


def main() -> None:
    args = sys.argv[1:]
    sys.exit(run(args[1:] if args[:1] == ["--"] else args))


if __name__ == "__main__":
    main()
