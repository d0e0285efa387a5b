"""The webhook's own CA and serving certificate, when cert-manager does not issue them.

Pure: bytes and a clock reading in, bytes out (no files, no API calls). A `Bundle` is what the
Secret holds: `ca.crt` (the trust bundle the API server gets as `caBundle`: the signing CA
first, then a previous CA while it is still valid, so a rotation never leaves a replica's
certificate untrusted), `ca.key`, `tls.crt`, `tls.key`. `renew` says whether a bundle must be
replaced, and replaces only what must be: a serving certificate near its end is reissued by the
same CA; a CA near its end is replaced and the old one stays in the trust bundle.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS: Final = 3650
SERVING_DAYS: Final = 365
# Replace a certificate when less than this share of its life is left.
RENEW_AT: Final = 1 / 3
KEYS: Final = ("ca.crt", "ca.key", "tls.crt", "tls.key")


@dataclass(frozen=True)
class Bundle:
    ca_crt: bytes  # PEM, one or more certificates; the first signs tls.crt
    ca_key: bytes
    tls_crt: bytes
    tls_key: bytes

    def as_data(self) -> dict[str, bytes]:
        return dict(zip(KEYS, (self.ca_crt, self.ca_key, self.tls_crt, self.tls_key), strict=True))

    @classmethod
    def from_data(cls, data: Mapping[str, bytes]) -> Bundle | None:
        if not all(data.get(k) for k in KEYS):
            return None
        return cls(*(data[k] for k in KEYS))


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def new_ca(now: dt.datetime, common_name: str = "rdmaplane-webhook-ca") -> tuple[bytes, bytes]:
    """A self-signed CA (EC P-256) that signs leaf certificates only: certificate and key, PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def issue(
    ca_crt: bytes, ca_key: bytes, hosts: Sequence[str], now: dt.datetime
) -> tuple[bytes, bytes]:
    """A serving certificate for `hosts` (DNS names or IPs) signed by the first CA in `ca_crt`."""
    ca = x509.load_pem_x509_certificates(ca_crt)[0]
    signer = serialization.load_pem_private_key(ca_key, password=None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0][:64]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + dt.timedelta(days=SERVING_DAYS), ca.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
        )
        .sign(signer, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def create(hosts: Sequence[str], now: dt.datetime) -> Bundle:
    ca_crt, ca_key = new_ca(now)
    return Bundle(ca_crt, ca_key, *issue(ca_crt, ca_key, hosts, now))


def _ending(cert: x509.Certificate, now: dt.datetime) -> bool:
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= end - (end - start) * RENEW_AT


def problem(bundle: Bundle, hosts: Sequence[str], now: dt.datetime) -> str | None:
    """Why the serving certificate cannot stay (None when it can): unreadable, not the key's,
    not signed by the CA, missing a host, or near its end."""
    try:
        ca = x509.load_pem_x509_certificates(bundle.ca_crt)[0]
        cert = x509.load_pem_x509_certificate(bundle.tls_crt)
        key = serialization.load_pem_private_key(bundle.tls_key, password=None)
        serialization.load_pem_private_key(bundle.ca_key, password=None)
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as exc:
        return f"unusable ({type(exc).__name__}: {exc})"
    if _public(key.public_key()) != _public(cert.public_key()):
        return "tls.key does not belong to tls.crt"
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "no subjectAltName"
    have = {str(n) for n in names.get_values_for_type(x509.DNSName)}
    have |= {str(n) for n in names.get_values_for_type(x509.IPAddress)}
    missing = [h for h in hosts if str(_san(h).value) not in have]
    if missing:
        return f"not valid for {', '.join(missing)}"
    if _ending(cert, now):
        return f"expires {cert.not_valid_after_utc:%Y-%m-%d}"
    return None


def _public(key: object) -> bytes:
    """The DER of a key's public half (private or public key given)."""
    public: Any = getattr(key, "public_key", lambda: key)()
    der: bytes = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def renew(bundle: Bundle | None, hosts: Sequence[str], now: dt.datetime) -> Bundle | None:
    """The bundle to store instead of `bundle`, or None when `bundle` is good as it is."""
    if bundle is None:
        return create(hosts, now)
    if problem(bundle, hosts, now) is None:
        return None
    try:
        cas = x509.load_pem_x509_certificates(bundle.ca_crt)
        serialization.load_pem_private_key(bundle.ca_key, password=None)
    except ValueError:
        return create(hosts, now)
    if _ending(cas[0], now):
        ca_crt, ca_key = new_ca(now)
        trusted = ca_crt + b"".join(_cert_pem(c) for c in cas[:1] if c.not_valid_after_utc > now)
        return Bundle(trusted, ca_key, *issue(ca_crt, ca_key, hosts, now))
    return Bundle(bundle.ca_crt, bundle.ca_key, *issue(bundle.ca_crt, bundle.ca_key, hosts, now))
