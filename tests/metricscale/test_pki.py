"""metricscale.pki: CAs, serving and client certificates, PEM round trips, file modes."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from metricscale import pki

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
DAY = timedelta(days=1)


@pytest.fixture(scope="module")
def ca() -> pki.CertifiedKey:
    return pki.generate_ca(common_name="test-ca", now=NOW, validity=DAY * 10)


def _eku(certificate: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_ca_is_self_signed_ca_with_the_given_window(ca: pki.CertifiedKey) -> None:
    cert = ca.certificate
    assert cert.subject == cert.issuer
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert cert.not_valid_before_utc == NOW
    assert pki.certificate_expiry(cert) == NOW + DAY * 10
    assert isinstance(ca.private_key.curve, ec.SECP256R1)
    cert.verify_directly_issued_by(cert)


def test_serving_certificate_has_sans_and_server_auth(ca: pki.CertifiedKey) -> None:
    leaf = pki.issue_serving_certificate(
        ca, common_name="adapter", dns_names=["adapter.metrics.svc", "localhost"],
        ip_addresses=["127.0.0.1", "::1"], now=NOW, validity=DAY,
    )
    san = leaf.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["adapter.metrics.svc", "localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    assert _eku(leaf.certificate) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not leaf.certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    leaf.certificate.verify_directly_issued_by(ca.certificate)


def test_serving_certificate_without_any_name_is_refused(ca: pki.CertifiedKey) -> None:
    with pytest.raises(pki.PKIError):
        pki.issue_serving_certificate(ca, common_name="x", now=NOW, validity=DAY)


def test_client_certificate_carries_user_as_cn_and_groups_as_o(ca: pki.CertifiedKey) -> None:
    leaf = pki.issue_client_certificate(
        ca, user="alice", groups=["system:masters", "team-a"], now=NOW, validity=DAY,
    )
    subject = leaf.certificate.subject
    assert [a.value for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == ["alice"]
    assert [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:masters", "team-a",
    ]
    assert _eku(leaf.certificate) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    leaf.certificate.verify_directly_issued_by(ca.certificate)


def test_naive_now_is_refused(ca: pki.CertifiedKey) -> None:
    with pytest.raises(pki.PKIError):
        pki.generate_ca(common_name="x", now=datetime(2026, 1, 1), validity=DAY)


def test_pem_round_trip_and_bundles(ca: pki.CertifiedKey) -> None:
    other = pki.generate_ca(common_name="other", now=NOW, validity=DAY)
    bundle = ca.certificate_pem + other.certificate_pem
    assert pki.load_certificates_pem(bundle) == [ca.certificate, other.certificate]
    assert pki.load_certificate_pem(bundle) == ca.certificate
    key = pki.load_private_key_pem(ca.private_key_pem)
    assert key.private_numbers() == ca.private_key.private_numbers()


def test_garbage_pem_raises_pki_error() -> None:
    with pytest.raises(pki.PKIError):
        pki.load_certificates_pem(b"not a certificate")
    with pytest.raises(pki.PKIError):
        pki.load_private_key_pem(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")


def test_files_keys_are_private_and_expiry_is_readable(
    ca: pki.CertifiedKey, tmp_path: Path
) -> None:
    key_path = pki.write_private_key(tmp_path / "sub" / "ca.key", ca.private_key)
    cert_path = pki.write_certificate(tmp_path / "ca.crt", ca.certificate)
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(cert_path.stat().st_mode) == 0o644
    assert pki.read_certificate_expiry(cert_path) == NOW + DAY * 10
    # Rewriting an existing, too-open key file tightens it.
    key_path.chmod(0o644)
    pki.write_private_key(key_path, ca.private_key)
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600


async def test_python_ssl_serves_the_pair_and_verifies_both_sides_with_the_ca(
    tmp_path: Path,
) -> None:
    # A CA valid now (the module's `ca` is dated NOW, long past): a real handshake checks dates.
    start = datetime.now(UTC) - timedelta(hours=1)
    live = pki.generate_ca(common_name="live-ca", now=start, validity=DAY)
    leaf = pki.issue_serving_certificate(
        live, common_name="x", dns_names=["localhost"], now=start, validity=DAY,
    )
    client_pair = pki.issue_client_certificate(live, user="alice", now=start, validity=DAY)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(
        pki.write_certificate(tmp_path / "tls.crt", leaf.certificate),
        pki.write_private_key(tmp_path / "tls.key", leaf.private_key),
    )
    server_context.load_verify_locations(cadata=live.certificate_pem.decode())
    server_context.verify_mode = ssl.CERT_REQUIRED
    client_context = ssl.create_default_context(cadata=live.certificate_pem.decode())
    client_context.load_cert_chain(
        pki.write_certificate(tmp_path / "client.crt", client_pair.certificate),
        pki.write_private_key(tmp_path / "client.key", client_pair.private_key),
    )

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        user = str(x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(
            NameOID.COMMON_NAME)[0].value)
        writer.write(f"{user}\n".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_context)
    async with server:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context, server_hostname="localhost")
        try:
            served = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            assert x509.load_der_x509_certificate(served) == leaf.certificate
            assert await asyncio.wait_for(reader.readline(), 30) == b"alice\n"
        finally:
            writer.close()
            with contextlib.suppress(ssl.SSLError, ConnectionError):
                await writer.wait_closed()
