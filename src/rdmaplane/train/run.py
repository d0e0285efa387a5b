"""`python -m rdmaplane.train.run -- COMMAND...`: keep exit code 75 through a launcher.

torchrun reports a worker that exited 75 ("checkpoint saved, restart me") as its own exit 1,
which a Job's podFailurePolicy or a Volcano policy would count as a plain failure. This runs
COMMAND with `RDMAPLANE_RESTART_SOCKET` naming an abstract Unix socket of ours;
`exit_for_restart()` in any worker sends a datagram there; if one came and COMMAND failed, we
exit 75, else with COMMAND's code (128+N for a signal, as a shell does). SIGTERM and SIGINT are
passed on to COMMAND. An abstract socket has no file: a SIGKILLed wrapper leaves nothing behind
(a temporary folder would stay). It is seen by the processes of the pod's network namespace,
which is where the workers run.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys

from rdmaplane.train.notice import ENV_RESTART_SOCKET, EXIT_RESTART


def run(command: list[str]) -> int:
    if not command:
        print("usage: python -m rdmaplane.train.run -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    name = f"rdmaplane-run-{os.getpid()}-{secrets.token_hex(8)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as inbox:
        inbox.bind("\0" + name)
        try:
            child = subprocess.Popen(command, env={**os.environ, ENV_RESTART_SOCKET: "@" + name})
        except OSError as e:
            print(f"rdmaplane.train.run: cannot start {command[0]}: {e.strerror}", file=sys.stderr)
            return 127
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _: child.send_signal(signum))
        code = child.wait()
        inbox.setblocking(False)
        try:
            notified = bool(inbox.recv(16))
        except BlockingIOError:
            notified = False
        if code != 0 and notified:  # not when torchrun restarted the workers and they finished
            return EXIT_RESTART
        return 128 - code if code < 0 else code


def main() -> None:
    args = sys.argv[1:]
    sys.exit(run(args[1:] if args[:1] == ["--"] else args))


if __name__ == "__main__":
    main()
