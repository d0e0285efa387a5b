"""The webhook's own CA and serving certificate: made, kept while good, renewed near the end
of their life, never left untrusted during a CA rotation."""

from __future__ import annotations

import datetime as dt

from cryptography import x509

from rdmaplane.services.webhook.policy import certs

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HOSTS = ["rdmaplane-webhook.rdmaplane.svc", "127.0.0.1"]


def test_a_fresh_bundle_is_good_and_kept() -> None:
    bundle = certs.create(HOSTS, NOW)
    assert certs.problem(bundle, HOSTS, NOW) is None
    assert certs.renew(bundle, HOSTS, NOW + dt.timedelta(days=200)) is None
    cert = x509.load_pem_x509_certificate(bundle.tls_crt)
    ca = x509.load_pem_x509_certificate(bundle.ca_crt)
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [HOSTS[0]]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_serving_certificate_near_its_end_is_reissued_by_the_same_ca() -> None:
    bundle = certs.create(HOSTS, NOW)
    later = NOW + dt.timedelta(days=300)
    assert "expires" in (certs.problem(bundle, HOSTS, later) or "")
    renewed = certs.renew(bundle, HOSTS, later)
    assert renewed is not None
    assert renewed.ca_crt == bundle.ca_crt and renewed.ca_key == bundle.ca_key
    assert renewed.tls_crt != bundle.tls_crt
    assert certs.problem(renewed, HOSTS, later) is None


def test_a_new_host_reissues() -> None:
    bundle = certs.create(HOSTS, NOW)
    assert certs.problem(bundle, [*HOSTS, "other.svc"], NOW) == "not valid for other.svc"
    renewed = certs.renew(bundle, [*HOSTS, "other.svc"], NOW)
    assert renewed is not None and renewed.ca_crt == bundle.ca_crt


def test_ca_rotation_keeps_the_old_ca_trusted() -> None:
    bundle = certs.create(HOSTS, NOW)
    late = NOW + dt.timedelta(days=certs.CA_DAYS - 100)
    renewed = certs.renew(bundle, HOSTS, late)
    assert renewed is not None
    trusted = x509.load_pem_x509_certificates(renewed.ca_crt)
    assert len(trusted) == 2
    assert trusted[1] == x509.load_pem_x509_certificate(bundle.ca_crt)
    x509.load_pem_x509_certificate(renewed.tls_crt).verify_directly_issued_by(trusted[0])
    assert certs.problem(renewed, HOSTS, late) is None


def test_garbage_or_foreign_secrets_are_replaced() -> None:
    good = certs.create(HOSTS, NOW)
    other = certs.create(HOSTS, NOW)
    assert certs.Bundle.from_data({"tls.crt": b"x"}) is None
    junk = certs.Bundle(b"junk", b"junk", b"junk", b"junk")
    assert "unusable" in (certs.problem(junk, HOSTS, NOW) or "")
    assert certs.renew(junk, HOSTS, NOW) is not None
    wrong_key = certs.Bundle(good.ca_crt, good.ca_key, good.tls_crt, other.tls_key)
    assert certs.problem(wrong_key, HOSTS, NOW) == "tls.key does not belong to tls.crt"
    wrong_ca = certs.Bundle(other.ca_crt, other.ca_key, good.tls_crt, good.tls_key)
    assert "unusable" in (certs.problem(wrong_ca, HOSTS, NOW) or "")
    assert certs.Bundle.from_data(good.as_data()) == good
