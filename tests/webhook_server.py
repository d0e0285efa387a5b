"""`rdmaplane webhook` as a real process on loopback, for the integration, e2e and bench code."""

from __future__ import annotations

import contextlib
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.e2e.controlplane import Process, free_port

__all__ = ["WebhookProcess", "free_port", "start_webhook"]


@dataclass
class WebhookProcess:
    process: Process
    port: int

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.process.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.process.stop()


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
    the webhook makes its own CA). It dies with the test process."""
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / f"webhook-{port}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    args = ["-m", "rdmaplane", "webhook", "--config", str(config_file)]
    args += ["--host", "127.0.0.1", "--port", str(port)]
    if kubeconfig is not None:
        args += ["--kubeconfig", str(kubeconfig)]
    process = Process.start(Path(sys.executable), args, workdir / f"webhook-{port}.log")
    webhook = WebhookProcess(process, port)

    def ready() -> bool:
        ca = ca_file()
        return ca is not None and _ready(webhook.url, ca)

    process.wait_ready(ready, timeout)
    return webhook


def _ready(url: str, ca_file: Path) -> bool:
    with contextlib.suppress(httpx.HTTPError, OSError, ssl.SSLError):
        context = ssl.create_default_context(cafile=str(ca_file))
        return httpx.get(f"{url}/readyz", verify=context, timeout=2).status_code == 200
    return False
