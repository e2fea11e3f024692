"""Certificates for Kubernetes-style PKI: CAs, serving and client certificates, PEM files.

Keys are EC P-256 (fast to generate, accepted by Go and OpenSSL). Every function that stamps a
validity window takes `now` and a `validity` so callers (and tests) decide the clock. The
certificates carry the extensions strict verifiers (Go, OpenSSL's X509_STRICT) insist on:
critical BasicConstraints and KeyUsage on CAs, SubjectKeyIdentifier, AuthorityKeyIdentifier on
leaves, and an ExtendedKeyUsage that says what the leaf is for.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CertifiedKey",
    "PKIError",
    "certificate_expiry",
    "certificate_pem",
    "generate_ca",
    "issue_client_certificate",
    "issue_serving_certificate",
    "load_certificate_pem",
    "load_certificates_pem",
    "load_private_key_pem",
    "private_key_pem",
    "read_certificate_expiry",
    "write_certificate",
    "write_private_key",
]

_PEM_CERTIFICATE_BEGIN = b"-----BEGIN CERTIFICATE-----"


class PKIError(ValueError):
    """PEM data that is not what it should be (no certificate, not an EC key, ...)."""


@dataclass(frozen=True)
class CertifiedKey:
    """A certificate and the private key that goes with it (a CA or a leaf)."""

    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey

    @property
    def certificate_pem(self) -> bytes:
        return certificate_pem(self.certificate)

    @property
    def private_key_pem(self) -> bytes:
        return private_key_pem(self.private_key)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    # Go reads groups from every O attribute, in order; one RDN per attribute keeps that order.
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _check_validity(now: datetime, validity: timedelta) -> None:
    if now.tzinfo is None:
        raise PKIError("now must be timezone-aware")
    if validity <= timedelta(0):
        raise PKIError("validity must be positive")


def generate_ca(*, common_name: str, now: datetime, validity: timedelta) -> CertifiedKey:
    """A self-signed certificate authority."""
    _check_validity(now, validity)
    key = _new_key()
    subject = _name(common_name)
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertifiedKey(certificate=certificate, private_key=key)


def _issue_leaf(
    ca: CertifiedKey,
    *,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: Sequence[x509.GeneralName],
    now: datetime,
    validity: timedelta,
) -> CertifiedKey:
    _check_validity(now, validity)
    key = _new_key()
    public = key.public_key()
    ca_ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.certificate.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    certificate = builder.sign(ca.private_key, hashes.SHA256())
    return CertifiedKey(certificate=certificate, private_key=key)


def issue_serving_certificate(
    ca: CertifiedKey,
    *,
    common_name: str,
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
    now: datetime,
    validity: timedelta,
) -> CertifiedKey:
    """A TLS server certificate (EKU serverAuth). Go matches only the SANs, never the CN."""
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans.extend(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses)
    if not sans:
        raise PKIError("a serving certificate needs at least one DNS name or IP address")
    return _issue_leaf(
        ca, subject=_name(common_name), usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=sans,
        now=now, validity=validity,
    )


def issue_client_certificate(
    ca: CertifiedKey,
    *,
    user: str,
    groups: Sequence[str] = (),
    now: datetime,
    validity: timedelta,
) -> CertifiedKey:
    """A TLS client certificate as Kubernetes reads it: CN is the user, each O is a group."""
    return _issue_leaf(
        ca, subject=_name(user, groups), usage=ExtendedKeyUsageOID.CLIENT_AUTH, sans=(),
        now=now, validity=validity,
    )


def certificate_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # PKCS#8 is what Go's tls.X509KeyPair, OpenSSL and aiohttp all accept.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_certificate_pem(data: bytes) -> x509.Certificate:
    """The first certificate of a PEM bundle."""
    return load_certificates_pem(data)[0]


def load_certificates_pem(data: bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle (CA bundles are concatenations)."""
    if _PEM_CERTIFICATE_BEGIN not in data:
        raise PKIError("no PEM certificate found")
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as error:
        raise PKIError(f"malformed PEM certificate: {error}") from error


def load_private_key_pem(data: bytes) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise PKIError(f"malformed PEM private key: {error}") from error
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PKIError(f"expected an EC private key, got {type(key).__name__}")
    return key


def write_certificate(
    path: Path, certificate: x509.Certificate | Sequence[x509.Certificate]
) -> Path:
    """Write one certificate or a bundle as PEM (mode 0644)."""
    certificates = [certificate] if isinstance(certificate, x509.Certificate) else certificate
    data = b"".join(certificate_pem(c) for c in certificates)
    return _write(path, data, mode=0o644)


def write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    """Write a private key as PEM, readable by the owner only (mode 0600)."""
    return _write(path, private_key_pem(key), mode=0o600)


def _write(path: Path, data: bytes, *, mode: int) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Create with the final mode so a key is never readable by others, even for an instant.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode is ignored when the file already exists
        os.write(fd, data)
    finally:
        os.close(fd)
    return path


def certificate_expiry(certificate: x509.Certificate) -> datetime:
    """The certificate's notAfter, timezone-aware (UTC)."""
    return certificate.not_valid_after_utc


def read_certificate_expiry(path: Path) -> datetime:
    """The notAfter of the first certificate in a PEM file."""
    return certificate_expiry(load_certificate_pem(Path(path).read_bytes()))
