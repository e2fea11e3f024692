"""TLS for the adapter: the server context, certificate reload, and which CA signed a client.

Python's ``ssl`` has no "request a client certificate but do not verify it" mode: with
``CERT_OPTIONAL`` OpenSSL verifies a presented certificate against *every* loaded CA and aborts
the handshake when it does not verify. The context therefore trusts the union of the
request-header CA and the client CA, and :func:`inspect_peer_certificate` then tells which of the
two the certificate really chains to, as the Go server's two authenticators each do.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from adapter.auth.authentication import (
    NO_CA,
    ChainCheck,
    ChainVerdict,
    PeerCertificate,
)
from adapter.auth.configuration import AuthenticationConfig
from metricscale import pki
from metricscale.core.errors import ConfigError
from metricscale.files import FileError, read_bytes

logger = logging.getLogger(__name__)

# Longest issuer path searched through intermediates the peer sent (Go has no fixed limit; real
# front-proxy certificates are signed straight by the CA).
_MAX_CHAIN_DEPTH = 5
_CLIENT_USAGES = frozenset(
    {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE})

SELF_SIGNED_CERT_NAME = "apiserver.crt"
SELF_SIGNED_KEY_NAME = "apiserver.key"
_BACKDATE = timedelta(hours=1)


class TLSConfigError(ConfigError):
    """A certificate, key or CA bundle cannot be used."""


# --------------------------------------------------------------------------------------------
# Which CA signed the peer


@dataclass(frozen=True)
class TrustBundle:
    """A parsed PEM bundle of CA certificates (every one is a trust anchor, as in Go's pool)."""

    certificates: tuple[x509.Certificate, ...]
    pem: bytes


def load_trust_bundle(pem: bytes | None) -> TrustBundle | None:
    """Parse a PEM CA bundle; None or blank means "no CA configured"."""
    if pem is None or not pem.strip():
        return None
    try:
        certificates = tuple(pki.load_certificates_pem(pem))
    except pki.PKIError as error:
        raise TLSConfigError(f"CA bundle holds no usable PEM certificate: {error}") from error
    return TrustBundle(certificates=certificates, pem=pem)


def _validity_error(certificate: x509.Certificate, now: datetime) -> str:
    if now < certificate.not_valid_before_utc:
        return (f"x509: certificate has expired or is not yet valid: current time "
                f"{now.isoformat()} is before {certificate.not_valid_before_utc.isoformat()}")
    if now > certificate.not_valid_after_utc:
        return (f"x509: certificate has expired or is not yet valid: current time "
                f"{now.isoformat()} is after {certificate.not_valid_after_utc.isoformat()}")
    return ""


def _allows_client_auth(certificate: x509.Certificate) -> bool:
    # No EKU extension means "any usage", as in Go's checkChainForKeyUsage.
    try:
        usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return True
    return any(usage in _CLIENT_USAGES for usage in usages)


def _is_ca(certificate: x509.Certificate) -> bool:
    try:
        return certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def _issued_by(child: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        child.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _find_path(
    certificate: x509.Certificate,
    *,
    roots: Sequence[x509.Certificate],
    intermediates: Sequence[x509.Certificate],
    now: datetime,
    depth: int,
) -> str:
    """Empty string when ``certificate`` chains to a root; else the most telling error."""
    error = "x509: certificate signed by unknown authority"
    for root in roots:
        if _issued_by(certificate, root):
            if (expired := _validity_error(root, now)):
                error = expired
            elif not _allows_client_auth(root):
                error = "x509: certificate specifies an incompatible key usage"
            else:
                return ""
    if depth >= _MAX_CHAIN_DEPTH:
        return error
    for intermediate in intermediates:
        if intermediate == certificate or not _issued_by(certificate, intermediate):
            continue
        usable = (_is_ca(intermediate) and not _validity_error(intermediate, now)
                  and _allows_client_auth(intermediate))
        if not usable:
            continue
        if not _find_path(intermediate, roots=roots, intermediates=intermediates, now=now,
                          depth=depth + 1):
            return ""
    return error


def verify_client_chain(
    leaf: x509.Certificate,
    *,
    bundle: TrustBundle | None,
    now: datetime,
    intermediates: Sequence[x509.Certificate] = (),
) -> ChainCheck:
    """Verify ``leaf`` for client authentication against one bundle, at ``now`` (timezone-aware)."""
    if bundle is None:
        return NO_CA
    if (expired := _validity_error(leaf, now)):
        return ChainCheck(ChainVerdict.FAILED, expired)
    if not _allows_client_auth(leaf):
        return ChainCheck(ChainVerdict.FAILED,
                          "x509: certificate specifies an incompatible key usage")
    if leaf in bundle.certificates:
        return ChainCheck(ChainVerdict.VERIFIED)
    error = _find_path(leaf, roots=bundle.certificates, intermediates=intermediates, now=now,
                       depth=0)
    return ChainCheck(ChainVerdict.FAILED, error) if error else ChainCheck(ChainVerdict.VERIFIED)


def _hex_colons(data: bytes) -> str:
    return ":".join(f"{byte:02X}" for byte in data)


def certificate_identifier(certificate: x509.Certificate) -> str:
    """``SN=…, SKID=…, AKID=…`` as upstream logs a certificate that failed to verify."""
    try:
        skid = certificate.extensions.get_extension_for_class(
            x509.SubjectKeyIdentifier).value.digest
    except x509.ExtensionNotFound:
        skid = b""
    try:
        akid = certificate.extensions.get_extension_for_class(
            x509.AuthorityKeyIdentifier).value.key_identifier or b""
    except x509.ExtensionNotFound:
        akid = b""
    return f"SN={certificate.serial_number}, SKID={_hex_colons(skid)}, AKID={_hex_colons(akid)}"


def _name_values(name: x509.Name, oid: x509.ObjectIdentifier) -> tuple[str, ...]:
    return tuple(str(attribute.value) for attribute in name.get_attributes_for_oid(oid))


def inspect_peer_certificate(
    leaf_der: bytes,
    *,
    request_header_ca: TrustBundle | None,
    client_ca: TrustBundle | None,
    now: datetime,
    intermediates_der: Sequence[bytes] = (),
) -> PeerCertificate:
    """The facts authentication needs about a TLS client certificate (DER, as ``getpeercert``)."""
    try:
        leaf = x509.load_der_x509_certificate(leaf_der)
        intermediates = tuple(x509.load_der_x509_certificate(der) for der in intermediates_der)
    except ValueError as error:
        failed = ChainCheck(ChainVerdict.FAILED, f"x509: malformed certificate: {error}")
        return PeerCertificate(
            common_name="", organizations=(),
            request_header_ca=failed if request_header_ca is not None else NO_CA,
            client_ca=failed if client_ca is not None else NO_CA)
    common_names = _name_values(leaf.subject, NameOID.COMMON_NAME)
    return PeerCertificate(
        # Go's pkix.Name keeps the last CN when there are several.
        common_name=common_names[-1] if common_names else "",
        organizations=_name_values(leaf.subject, NameOID.ORGANIZATION_NAME),
        request_header_ca=verify_client_chain(
            leaf, bundle=request_header_ca, now=now, intermediates=intermediates),
        client_ca=verify_client_chain(leaf, bundle=client_ca, now=now,
                                      intermediates=intermediates),
        identifier=certificate_identifier(leaf),
    )


def client_ca_pems(config: AuthenticationConfig) -> tuple[bytes, ...]:
    """Every CA bundle the handshake must accept: the request-header CA and the client CA."""
    pems = [config.request_header.ca_pem if config.request_header else None, config.client_ca_pem]
    return tuple(pem for pem in pems if pem is not None and pem.strip())


def peer_certificate_der(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> bytes | None:
    """The DER of the client's leaf certificate on a TLS connection, None without one."""
    if ssl_object is None:
        return None
    return ssl_object.getpeercert(binary_form=True) or None


# --------------------------------------------------------------------------------------------
# Server context


def build_server_context(
    *, cert_file: Path, key_file: Path, client_ca_pems: Sequence[bytes] = ()
) -> ssl.SSLContext:
    """TLS ≥ 1.2, HTTP/1.1 only, client certificates requested and checked against the CAs given.

    With no CA at all no certificate is requested (``CERT_NONE``): ``CERT_OPTIONAL`` without
    trust anchors would fail every client that presents one.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # Offer only http/1.1 so a Go client never switches to h2, which aiohttp does not serve.
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(certfile=str(cert_file), keyfile=str(key_file))
    except (OSError, ssl.SSLError) as error:
        raise TLSConfigError(
            f"cannot load the serving certificate {cert_file} / key {key_file}: {error}") from error
    bundle = b"\n".join(pem.strip() for pem in client_ca_pems if pem.strip())
    if bundle:
        try:
            context.load_verify_locations(cadata=bundle.decode())
        except (ssl.SSLError, UnicodeDecodeError) as error:
            raise TLSConfigError(f"cannot load the client CA bundles: {error}") from error
        context.verify_mode = ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


@dataclass(frozen=True)
class _Fingerprint:
    digests: tuple[str, ...]


def _files_fingerprint(paths: Sequence[Path]) -> _Fingerprint:
    # Content digests, not mtimes alone: a Secret volume swaps files through a symlink and can keep
    # an old mtime, and a rewrite within one mtime tick must still be seen.
    try:
        return _Fingerprint(tuple(hashlib.sha256(read_bytes(str(path))).hexdigest()
                                  for path in paths))
    except FileError as error:
        raise TLSConfigError(f"cannot read the serving certificate files: {error}") from error


class ReloadingServerContext:
    """The server's SSLContext, swapped for new connections when certificates or CAs change.

    Give :attr:`listening_context` to the server once. Its SNI callback, which OpenSSL runs for
    every ClientHello (with or without SNI), hands each new connection the current context;
    connections already established keep the one they started with.
    """

    def __init__(
        self, *, cert_file: Path, key_file: Path, client_ca_pems: Sequence[bytes] = ()
    ) -> None:
        self._cert_file = cert_file
        self._key_file = key_file
        self._client_ca_pems = tuple(client_ca_pems)
        self._fingerprint = _files_fingerprint((cert_file, key_file))
        self._current = build_server_context(
            cert_file=cert_file, key_file=key_file, client_ca_pems=self._client_ca_pems)
        # The listening context holds no CAs: after the swap OpenSSL verifies with the selected
        # context's trust store, but the *verify mode* stays the one of the context a connection
        # started with, so it is kept in step with the current one.
        self._listening = build_server_context(cert_file=cert_file, key_file=key_file)
        self._listening.verify_mode = self._current.verify_mode
        self._listening.sni_callback = self._select_context

    @property
    def listening_context(self) -> ssl.SSLContext:
        return self._listening

    @property
    def current(self) -> ssl.SSLContext:
        return self._current

    def _select_context(
        self, ssl_object: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext
    ) -> None:
        if ssl_object.context is not self._current:
            ssl_object.context = self._current

    def reload_if_changed(self) -> bool:
        """Re-read the certificate files; swap in a new context if their content changed.

        A pair that does not load (e.g. caught half-written) keeps the previous context and
        raises :class:`TLSConfigError`, so the caller can log it and try again later.
        """
        fingerprint = _files_fingerprint((self._cert_file, self._key_file))
        if fingerprint == self._fingerprint:
            return False
        self._current = build_server_context(
            cert_file=self._cert_file, key_file=self._key_file,
            client_ca_pems=self._client_ca_pems)
        self._fingerprint = fingerprint
        logger.info("serving certificate reloaded from %s", self._cert_file)
        return True

    def set_client_cas(self, client_ca_pems: Sequence[bytes]) -> bool:
        """Trust a new set of client CA bundles (e.g. a rotated front-proxy CA) from now on."""
        pems = tuple(client_ca_pems)
        if pems == self._client_ca_pems:
            return False
        self._current = build_server_context(
            cert_file=self._cert_file, key_file=self._key_file, client_ca_pems=pems)
        self._listening.verify_mode = self._current.verify_mode
        self._client_ca_pems = pems
        logger.info("client CA bundles replaced for new connections")
        return True


# --------------------------------------------------------------------------------------------
# Self-signed serving pair

def self_signed_paths(cert_dir: Path) -> tuple[Path, Path]:
    """Where the self-signed pair lives in ``--cert-dir`` (the generic apiserver's file names)."""
    return cert_dir / SELF_SIGNED_CERT_NAME, cert_dir / SELF_SIGNED_KEY_NAME


def ensure_self_signed_certificate(
    cert_dir: Path,
    *,
    now: datetime,
    dns_names: Sequence[str] = ("localhost",),
    ip_addresses: Sequence[str] = ("127.0.0.1",),
    validity: timedelta = timedelta(days=365),
) -> tuple[Path, Path]:
    """A serving pair in ``cert_dir`` for when no ``--tls-cert-file`` is given; reused if present.

    As the Go server does, a throw-away CA signs the certificate and the file holds both, so a
    client can pin that CA. Validity starts an hour early to tolerate clock skew.
    """
    cert_path, key_path = self_signed_paths(cert_dir)
    if cert_path.is_file() and key_path.is_file():
        return cert_path, key_path
    start = now - _BACKDATE
    stamp = int(now.timestamp())
    ca = pki.generate_ca(common_name=f"metricscale-ca@{stamp}", now=start,
                         validity=validity + _BACKDATE)
    serving = pki.issue_serving_certificate(
        ca, common_name=f"metricscale@{stamp}", dns_names=dns_names, ip_addresses=ip_addresses,
        now=start, validity=validity + _BACKDATE)
    pki.write_private_key(key_path, serving.private_key)
    pki.write_certificate(cert_path, [serving.certificate, ca.certificate])
    logger.info("generated a self-signed serving certificate in %s", cert_dir)
    return cert_path, key_path
