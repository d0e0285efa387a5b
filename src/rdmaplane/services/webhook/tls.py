"""Where the serving certificate comes from, and keeping it fresh while the webhook serves.

Two sources, one interface (`fetch()` → the files to serve and a fingerprint of their content):

- `FileCerts`: `certFile`/`keyFile` mounted from a Secret that cert-manager (or the operator)
  keeps; cert-manager's CA injector writes `caBundle`. Re-read at every check: the kubelet
  swaps a Secret volume's files when the Secret changes.
- `SecretCerts`: the webhook's own CA and serving certificate in a Secret
  (`rdmaplane.services.webhook.policy.certs`), created on first start, renewed near the end of
  their life, and
  the CA written into the MutatingWebhookConfiguration's `caBundle`. Safe with several replicas
  without a leader: the Secret is created with `create` (one wins, the others get 409 and read
  the winner's) and replaced with its resourceVersion (a conflict means another replica renewed
  first: read again); every replica then writes the same caBundle, which converges.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration
from lightkube.resources.core_v1 import Secret

from rdmaplane.adapters.atomicfile import write_atomically
from rdmaplane.core.errors import RdmaplaneError
from rdmaplane.core.settings.webhook import Tls
from rdmaplane.services.webhook.policy import certs

log = logging.getLogger("rdmaplane.services.webhook.tls")
CONFLICT_RETRIES = 5


@dataclass(frozen=True)
class Served:
    cert_file: Path
    key_file: Path
    fingerprint: str


class TlsError(RdmaplaneError):
    """The certificate cannot be had right now; the message says why (the service retries)."""


def _fingerprint(*parts: bytes) -> str:
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


class FileCerts:
    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file, self.key_file = cert_file, key_file

    async def fetch(self) -> Served:
        try:
            content = self.cert_file.read_bytes(), self.key_file.read_bytes()
        except OSError as exc:
            raise TlsError(f"cannot read the certificate: {exc}") from None
        return Served(self.cert_file, self.key_file, _fingerprint(*content))


class SecretCerts:
    def __init__(
        self,
        client: AsyncClient,
        tls: Tls,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.client, self.tls, self.clock = client, tls, clock

    async def fetch(self) -> Served:
        bundle = await self.sync_secret()
        await self.write_ca_bundle(bundle.ca_crt)
        return self._write_files(bundle)

    async def sync_secret(self) -> certs.Bundle:
        """The bundle in the Secret, made or renewed first when it must be."""
        for _ in range(CONFLICT_RETRIES):
            secret = await self._read()
            current = certs.Bundle.from_data(_decode(secret.data or {})) if secret else None
            fresh = certs.renew(current, self.tls.hosts, self.clock())
            if fresh is None and current is not None:
                return current
            assert fresh is not None
            why = (
                "none yet"
                if current is None
                else certs.problem(current, self.tls.hosts, self.clock())
            )
            try:
                await self._store(secret, fresh)
            except ApiError as exc:
                if exc.status.code in (409,):  # another replica stored one first: use theirs
                    continue
                raise TlsError(f"cannot write Secret {self._where}: {exc.status.message}") from None
            log.info("stored a new serving certificate in Secret %s (%s)", self._where, why)
            return fresh
        raise TlsError(f"Secret {self._where} kept changing under us; will retry")

    async def write_ca_bundle(self, ca_crt: bytes) -> None:
        """Every webhook of the configuration trusts `ca_crt` (a conflict: read again)."""
        want = base64.b64encode(ca_crt).decode()
        name = self.tls.webhook_configuration
        for _ in range(CONFLICT_RETRIES):
            try:
                mwc = await self.client.get(MutatingWebhookConfiguration, name)
                stale = [w for w in mwc.webhooks or [] if w.clientConfig.caBundle != want]
                if not stale:
                    return
                for w in stale:
                    w.clientConfig.caBundle = want
                await self.client.replace(mwc)
                log.info("wrote caBundle into MutatingWebhookConfiguration %s", name)
                return
            except ApiError as exc:
                if exc.status.code == 409:
                    continue
                raise TlsError(
                    f"cannot write caBundle of MutatingWebhookConfiguration {name}: "
                    f"{exc.status.message}"
                ) from None
        raise TlsError(f"MutatingWebhookConfiguration {name} kept changing under us; will retry")

    @property
    def _where(self) -> str:
        return f"{self.tls.secret_namespace}/{self.tls.secret_name}"

    async def _read(self) -> Secret | None:
        try:
            return await self.client.get(
                Secret, self.tls.secret_name, namespace=self.tls.secret_namespace
            )
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise TlsError(f"cannot read Secret {self._where}: {exc.status.message}") from None

    async def _store(self, secret: Secret | None, bundle: certs.Bundle) -> None:
        data = {k: base64.b64encode(v).decode() for k, v in bundle.as_data().items()}
        if secret is None:
            meta = ObjectMeta(
                name=self.tls.secret_name,
                namespace=self.tls.secret_namespace,
                labels={"app.kubernetes.io/managed-by": "rdmaplane-webhook"},
            )
            await self.client.create(Secret(metadata=meta, type="kubernetes.io/tls", data=data))
        else:
            secret.data = data  # resourceVersion kept: a concurrent change is a 409
            await self.client.replace(secret)

    def _write_files(self, bundle: certs.Bundle) -> Served:
        """tls.crt/tls.key in certDir, each written whole and renamed into place."""
        directory = self.tls.cert_dir
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        paths = []
        for name, content in (("tls.crt", bundle.tls_crt), ("tls.key", bundle.tls_key)):
            path = directory / name
            write_atomically(path, content)  # 0600, as the key must be
            paths.append(path)
        return Served(paths[0], paths[1], _fingerprint(bundle.tls_crt, bundle.tls_key))


def _decode(data: dict[str, str]) -> dict[str, bytes]:
    out = {}
    for key, value in data.items():
        try:
            out[key] = base64.b64decode(value, validate=True)
        except ValueError:
            continue  # a garbled key is as good as a missing one: the bundle is renewed
    return out
