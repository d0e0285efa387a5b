"""`rdmaplane webhook`: the certificate first, then HTTPS, then a loop that keeps it fresh.

Until a certificate can be had (the API server unreachable, RBAC missing) the service retries
with backoff and says why; it starts serving once it has one. Afterwards each check that finds
new content (renewed here, by another replica, or by cert-manager) loads it into the running
server's TLS context: new connections get it, nothing restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from pathlib import Path
from typing import Protocol

import uvicorn

from rdmaplane.adapters.kube import async_client
from rdmaplane.core.settings.webhook import WebhookSettings
from rdmaplane.services.webhook.http import create_app
from rdmaplane.services.webhook.tls import FileCerts, SecretCerts, Served, TlsError

log = logging.getLogger("rdmaplane.services.webhook")
BACKOFF_MAX_S = 30.0


class CertSource(Protocol):
    async def fetch(self) -> Served: ...


class _State:
    def __init__(self) -> None:
        self.problem: str | None = "no certificate yet"

    def ready(self) -> str | None:
        return self.problem


async def _first(source: CertSource, state: _State) -> Served:
    delay = 1.0
    while True:
        try:
            return await source.fetch()
        except (TlsError, OSError) as exc:
            state.problem = str(exc)
            log.warning("no certificate yet: %s; retrying in %.0f s", exc, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_S)


async def _keep_fresh(
    source: CertSource, context: ssl.SSLContext, served: Served, interval: float
) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            latest = await source.fetch()
            if latest.fingerprint != served.fingerprint:
                context.load_cert_chain(latest.cert_file, latest.key_file)
                log.info("serving a new certificate")
                served = latest
        except (TlsError, OSError, ssl.SSLError) as exc:
            # Keep serving the certificate we have (it is valid for months): going unready
            # here would take every replica out of the Service at once and refuse every
            # opted-in pod over a problem the next check may not have.
            log.warning("certificate check failed (still serving the current one): %s", exc)


async def serve(
    config: WebhookSettings, host: str, port: int, kubeconfig: Path | None, access_log: bool
) -> None:
    state = _State()
    tls = config.tls
    client = None
    source: CertSource
    if tls.cert_file is not None and tls.key_file is not None:
        source = FileCerts(tls.cert_file, tls.key_file)
    else:
        client = async_client(kubeconfig)
        source = SecretCerts(client, tls)
    try:
        served = await _first(source, state)
        state.problem = None
        app = create_app(config, config.max_request_bytes, state.ready)
        server_config = uvicorn.Config(
            app,
            host=host,
            port=port,
            ssl_certfile=served.cert_file,
            ssl_keyfile=served.key_file,
            log_config=None,  # uvicorn logs through rdmaplane's handler
            access_log=access_log,
            timeout_keep_alive=30,  # the API server keeps its connections to webhooks open
        )
        server_config.load()
        assert server_config.ssl is not None
        refresh = asyncio.create_task(
            _keep_fresh(source, server_config.ssl, served, tls.check_interval_s)
        )
        try:
            await uvicorn.Server(server_config).serve()
        finally:
            refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresh
    finally:
        if client is not None:
            await client.close()
