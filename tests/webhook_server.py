"""`rdmaplane webhook` as a real process on loopback, for the integration and e2e tests."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class WebhookProcess:
    popen: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def start_webhook(
    workdir: Path,
    config: dict[str, Any],
    ca_file: Callable[[], Path | None],
    kubeconfig: Path | None = None,
    port: int | None = None,
    timeout: float = 90.0,
) -> WebhookProcess:
    """Start the webhook with `config` (a WebhookConfig as a dict) and wait until it answers
    /readyz over TLS trusting the CA file `ca_file()` returns (None: not there yet, as when
    the webhook makes its own CA)."""
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / f"webhook-{port}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    log = workdir / f"webhook-{port}.log"
    args = [sys.executable, "-m", "rdmaplane", "webhook", "--config", str(config_file)]
    args += ["--host", "127.0.0.1", "--port", str(port)]
    if kubeconfig is not None:
        args += ["--kubeconfig", str(kubeconfig)]
    with log.open("wb") as out:
        popen = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"}
        )
    process = WebhookProcess(popen, port, log)
    deadline = time.monotonic() + timeout
    while True:
        if popen.poll() is not None:
            raise RuntimeError(f"webhook exited with {popen.returncode}:\n{process.log_text()}")
        ca = ca_file()
        if ca is not None and _ready(process.url, ca):
            return process
        if time.monotonic() > deadline:
            process.stop()
            raise TimeoutError(f"webhook not ready in {timeout:.0f} s:\n{process.log_text()}")
        time.sleep(0.2)


def _ready(url: str, ca_file: Path) -> bool:
    with contextlib.suppress(httpx.HTTPError, OSError):
        context = ssl.create_default_context(cafile=str(ca_file))
        return httpx.get(f"{url}/readyz", verify=context, timeout=2).status_code == 200
    return False
