"""Which CA signed a client certificate, and the server context over real TLS handshakes."""

from __future__ import annotations

import asyncio
import ssl
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from adapter.auth.authentication import (
    Authenticated,
    AuthenticationFailure,
    AuthMethod,
    ChainVerdict,
    PeerCertificate,
    authenticate_certificate,
    finish_authentication,
)
from adapter.auth.configuration import (
    AuthenticationConfig,
    RequestHeaderConfig,
)
from adapter.auth.users import (
    ANONYMOUS,
    UserInfo,
)
from adapter.security.tls import (
    ReloadingServerContext,
    TLSConfigError,
    build_server_context,
    certificate_identifier,
    client_ca_pems,
    ensure_self_signed_certificate,
    inspect_peer_certificate,
    load_trust_bundle,
    peer_certificate_der,
    verify_client_chain,
)
from metricscale import pki

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
YEAR = timedelta(days=365)


@dataclass(frozen=True)
class Authorities:
    front_proxy: pki.CertifiedKey
    client: pki.CertifiedKey
    other: pki.CertifiedKey


@pytest.fixture(scope="module")
def cas() -> Authorities:
    start = NOW - timedelta(days=30)
    return Authorities(
        front_proxy=pki.generate_ca(common_name="front-proxy-ca", now=start, validity=YEAR),
        client=pki.generate_ca(common_name="kubernetes-ca", now=start, validity=YEAR),
        other=pki.generate_ca(common_name="someone-else", now=start, validity=YEAR),
    )


def der(certified: pki.CertifiedKey) -> bytes:
    return certified.certificate.public_bytes(Encoding.DER)


def client_cert(ca: pki.CertifiedKey, *, user: str = "front-proxy-client",
                groups: tuple[str, ...] = (), start: datetime = NOW - timedelta(days=1),
                validity: timedelta = YEAR) -> pki.CertifiedKey:
    return pki.issue_client_certificate(ca, user=user, groups=groups, now=start,
                                        validity=validity)


def inspect(cas: Authorities, leaf: bytes, *, intermediates: tuple[bytes, ...] = (),
            now: datetime = NOW) -> PeerCertificate:
    return inspect_peer_certificate(
        leaf,
        request_header_ca=load_trust_bundle(pki.certificate_pem(cas.front_proxy.certificate)),
        client_ca=load_trust_bundle(pki.certificate_pem(cas.client.certificate)),
        now=now, intermediates_der=intermediates)


def hand_made(*, issuer: pki.CertifiedKey, cn: str, is_ca: bool,
              eku: list[x509.ObjectIdentifier] | None) -> pki.CertifiedKey:
    """A certificate pki would not make: an intermediate CA, or a leaf without EKU."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(issuer.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - timedelta(days=1))
        .not_valid_after(NOW + YEAR)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if eku is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(eku), critical=False)
    certificate = builder.sign(issuer.private_key, hashes.SHA256())
    return pki.CertifiedKey(certificate=certificate, private_key=key)


# --------------------------------------------------------------------- which CA (contract §2)

def test_front_proxy_cert_chains_to_the_request_header_ca_only(cas: Authorities) -> None:
    peer = inspect(cas, der(client_cert(cas.front_proxy)))
    assert peer.common_name == "front-proxy-client"
    assert peer.request_header_ca.verdict is ChainVerdict.VERIFIED
    assert peer.client_ca.verdict is ChainVerdict.FAILED
    assert peer.client_ca.error == "x509: certificate signed by unknown authority"


def test_client_ca_cert_chains_to_the_client_ca_only_with_cn_and_groups(
        cas: Authorities) -> None:
    peer = inspect(cas, der(client_cert(cas.client, user="jane", groups=("dev", "ops"))))
    assert (peer.common_name, peer.organizations) == ("jane", ("dev", "ops"))
    assert peer.client_ca.verdict is ChainVerdict.VERIFIED
    assert peer.request_header_ca.verdict is ChainVerdict.FAILED


def test_unknown_ca_cert_verifies_against_neither(cas: Authorities) -> None:
    peer = inspect(cas, der(client_cert(cas.other)))
    assert peer.request_header_ca.verdict is ChainVerdict.FAILED
    assert peer.client_ca.verdict is ChainVerdict.FAILED


@pytest.mark.parametrize(("start", "validity", "word"), [
    (NOW - timedelta(days=10), timedelta(days=5), "after"),
    (NOW + timedelta(days=1), timedelta(days=5), "before"),
])
def test_expired_or_not_yet_valid_cert_fails(cas: Authorities, start: datetime,
                                             validity: timedelta, word: str) -> None:
    peer = inspect(cas, der(client_cert(cas.front_proxy, start=start, validity=validity)))
    assert peer.request_header_ca.verdict is ChainVerdict.FAILED
    assert "expired or is not yet valid" in peer.request_header_ca.error
    assert f" is {word} " in peer.request_header_ca.error


def test_cert_without_client_auth_usage_fails(cas: Authorities) -> None:
    serving = pki.issue_serving_certificate(
        cas.front_proxy, common_name="front-proxy-client", dns_names=["x"],
        now=NOW - timedelta(days=1), validity=YEAR)
    peer = inspect(cas, der(serving))
    assert peer.request_header_ca.verdict is ChainVerdict.FAILED
    assert peer.request_header_ca.error == "x509: certificate specifies an incompatible key usage"


@pytest.mark.parametrize("eku", [None, [ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE]])
def test_cert_without_eku_or_with_any_usage_is_accepted_as_go_does(
        cas: Authorities, eku: list[x509.ObjectIdentifier] | None) -> None:
    leaf = hand_made(issuer=cas.front_proxy, cn="front-proxy-client", is_ca=False, eku=eku)
    assert inspect(cas, der(leaf)).request_header_ca.verdict is ChainVerdict.VERIFIED


def test_expired_ca_fails_the_chain(cas: Authorities) -> None:
    old = pki.generate_ca(common_name="old", now=NOW - timedelta(days=400), validity=YEAR)
    leaf = client_cert(old, start=NOW - timedelta(days=399), validity=timedelta(days=500))
    check = verify_client_chain(leaf.certificate, now=NOW,
                                bundle=load_trust_bundle(pki.certificate_pem(old.certificate)))
    assert check.verdict is ChainVerdict.FAILED
    assert "expired" in check.error


def test_rotation_bundle_trusts_the_old_and_the_new_ca(cas: Authorities) -> None:
    bundle = load_trust_bundle(pki.certificate_pem(cas.other.certificate)
                               + pki.certificate_pem(cas.front_proxy.certificate))
    for ca in (cas.other, cas.front_proxy):
        check = verify_client_chain(client_cert(ca).certificate, bundle=bundle, now=NOW)
        assert check.verdict is ChainVerdict.VERIFIED


def test_intermediate_sent_by_the_peer_completes_the_chain(cas: Authorities) -> None:
    intermediate = hand_made(issuer=cas.front_proxy, cn="intermediate", is_ca=True, eku=None)
    leaf = hand_made(issuer=intermediate, cn="front-proxy-client", is_ca=False,
                     eku=[ExtendedKeyUsageOID.CLIENT_AUTH])
    with_intermediate = inspect(cas, der(leaf), intermediates=(der(intermediate),))
    assert with_intermediate.request_header_ca.verdict is ChainVerdict.VERIFIED
    assert inspect(cas, der(leaf)).request_header_ca.verdict is ChainVerdict.FAILED


def test_non_ca_intermediate_cannot_sign(cas: Authorities) -> None:
    not_a_ca = hand_made(issuer=cas.front_proxy, cn="leafy", is_ca=False, eku=None)
    leaf = hand_made(issuer=not_a_ca, cn="front-proxy-client", is_ca=False, eku=None)
    peer = inspect(cas, der(leaf), intermediates=(der(not_a_ca),))
    assert peer.request_header_ca.verdict is ChainVerdict.FAILED


def test_no_bundle_means_no_ca_not_failure(cas: Authorities) -> None:
    peer = inspect_peer_certificate(der(client_cert(cas.front_proxy)), request_header_ca=None,
                                    client_ca=None, now=NOW)
    assert peer.request_header_ca.verdict is ChainVerdict.NO_CA
    assert peer.client_ca.verdict is ChainVerdict.NO_CA


def test_malformed_certificate_fails_where_a_ca_is_configured(cas: Authorities) -> None:
    peer = inspect_peer_certificate(
        b"not der", request_header_ca=load_trust_bundle(
            pki.certificate_pem(cas.front_proxy.certificate)), client_ca=None, now=NOW)
    assert peer.request_header_ca.verdict is ChainVerdict.FAILED
    assert peer.client_ca.verdict is ChainVerdict.NO_CA


def test_identifier_names_serial_and_key_ids(cas: Authorities) -> None:
    leaf = client_cert(cas.front_proxy).certificate
    identifier = certificate_identifier(leaf)
    assert identifier.startswith(f"SN={leaf.serial_number}, SKID=")
    skid = leaf.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    assert ":".join(f"{b:02X}" for b in skid) in identifier


@pytest.mark.parametrize("pem", [None, b"", b"  \n"])
def test_blank_bundle_is_no_ca(pem: bytes | None) -> None:
    assert load_trust_bundle(pem) is None


def test_garbage_bundle_is_a_config_error() -> None:
    with pytest.raises(TLSConfigError):
        load_trust_bundle(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")


@pytest.mark.parametrize(("config", "expected"), [
    (AuthenticationConfig(), ()),
    (AuthenticationConfig(client_ca_pem=b"client"), (b"client",)),
    (AuthenticationConfig(client_ca_pem=b"client",
                          request_header=RequestHeaderConfig(ca_pem=b"proxy")),
     (b"proxy", b"client")),
    (AuthenticationConfig(request_header=RequestHeaderConfig(ca_pem=b"proxy")), (b"proxy",)),
])
def test_handshake_trusts_both_configured_cas(config: AuthenticationConfig,
                                             expected: tuple[bytes, ...]) -> None:
    assert client_ca_pems(config) == expected


# --------------------------------------------------------------------- into the auth chain

PROXY = RequestHeaderConfig(ca_pem=b"x", allowed_names=("front-proxy-client",))


def authenticate(cas: Authorities, leaf: pki.CertifiedKey,
                 headers: list[tuple[str, str]]) -> Authenticated | AuthenticationFailure:
    config = AuthenticationConfig(client_ca_pem=b"x", request_header=PROXY)
    return finish_authentication(authenticate_certificate(
        config=config, peer=inspect(cas, der(leaf)), headers=headers))


def test_aggregator_identity_from_a_front_proxy_cert(cas: Authorities) -> None:
    result = authenticate(cas, client_cert(cas.front_proxy), [
        ("X-Remote-User", "system:kube-aggregator"), ("X-Remote-Group", "system:masters")])
    assert result == Authenticated(
        UserInfo(name="system:kube-aggregator", groups=("system:masters", "system:authenticated")),
        AuthMethod.FRONT_PROXY)


def test_client_ca_cert_asserting_remote_user_is_itself_not_the_header(
        cas: Authorities) -> None:
    result = authenticate(cas, client_cert(cas.client, user="jane"),
                          [("X-Remote-User", "system:admin")])
    assert isinstance(result, Authenticated)
    assert (result.user.name, result.method) == ("jane", AuthMethod.CLIENT_CERTIFICATE)


@pytest.mark.parametrize("which", ["disallowed-cn", "other-ca"])
def test_untrusted_proxy_certs_are_401(cas: Authorities, which: str) -> None:
    leaf = (client_cert(cas.front_proxy, user="intruder") if which == "disallowed-cn"
            else client_cert(cas.other))
    result = authenticate(cas, leaf, [("X-Remote-User", "system:kube-aggregator")])
    assert isinstance(result, AuthenticationFailure)


def test_no_certificate_and_spoofed_headers_is_anonymous(cas: Authorities) -> None:
    config = AuthenticationConfig(client_ca_pem=b"x", request_header=PROXY)
    result = finish_authentication(authenticate_certificate(
        config=config, peer=None, headers=[("X-Remote-User", "system:kube-aggregator")]))
    assert result == Authenticated(ANONYMOUS, AuthMethod.ANONYMOUS)


# --------------------------------------------------------------------- real handshakes

@dataclass(frozen=True)
class Files:
    directory: Path
    serving_ca: pki.CertifiedKey

    def write_pair(self, name: str, *, common_name: str) -> tuple[Path, Path]:
        serving = pki.issue_serving_certificate(
            self.serving_ca, common_name=common_name, dns_names=["localhost"],
            ip_addresses=["127.0.0.1"], now=datetime.now(UTC) - timedelta(hours=1),
            validity=timedelta(days=2))
        cert = pki.write_certificate(self.directory / f"{name}.crt", serving.certificate)
        key = pki.write_private_key(self.directory / f"{name}.key", serving.private_key)
        return cert, key

    def write_client(self, name: str, ca: pki.CertifiedKey, *, user: str) -> tuple[Path, Path]:
        client = pki.issue_client_certificate(
            ca, user=user, now=datetime.now(UTC) - timedelta(hours=1), validity=timedelta(days=2))
        cert = pki.write_certificate(self.directory / f"{name}.crt", client.certificate)
        key = pki.write_private_key(self.directory / f"{name}.key", client.private_key)
        return cert, key


def live_ca(name: str) -> pki.CertifiedKey:
    return pki.generate_ca(common_name=name, now=datetime.now(UTC) - timedelta(hours=1),
                           validity=timedelta(days=2))


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(directory=tmp_path, serving_ca=live_ca("serving-ca"))


def client_context(files: Files, *, cert: tuple[Path, Path] | None = None,
                   alpn: list[str] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(
        cadata=pki.certificate_pem(files.serving_ca.certificate).decode())
    if cert is not None:
        context.load_cert_chain(*cert)
    if alpn:
        context.set_alpn_protocols(alpn)
    return context


@dataclass
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def ask(self) -> str:
        """The server answers with the client CN it saw (or "-") and the serving cert's CN."""
        self.writer.write(b"who\n")
        await self.writer.drain()
        return (await asyncio.wait_for(self.reader.readline(), 5)).decode().strip()

    def served_cn(self) -> str:
        certificate = x509.load_der_x509_certificate(
            self.writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
        return str(certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)

    async def close(self) -> None:
        self.writer.close()
        with suppress(ssl.SSLError, ConnectionError):
            await self.writer.wait_closed()


async def _echo_identity(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while await reader.readline():
            leaf = peer_certificate_der(writer.get_extra_info("ssl_object"))
            cn = "-"
            if leaf is not None:
                subject = x509.load_der_x509_certificate(leaf).subject
                cn = str(subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)
            writer.write(f"{cn}\n".encode())
            await writer.drain()
    except (ssl.SSLError, ConnectionError):
        pass
    finally:
        writer.close()


@asynccontextmanager
async def serving(context: ssl.SSLContext) -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo_identity, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def connect(port: int, context: ssl.SSLContext) -> Connection:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="localhost")
    return Connection(reader, writer)


async def identity_or_failure(port: int, context: ssl.SSLContext) -> str:
    """What the server saw, or "handshake-failed" (TLS 1.3 reports a rejected client cert late)."""
    try:
        connection = await connect(port, context)
    except (ssl.SSLError, ConnectionError):
        return "handshake-failed"
    try:
        answer = await connection.ask()
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError):
        answer = ""
    finally:
        await connection.close()
    return answer or "handshake-failed"


def test_server_context_is_tls12_plus_and_requests_client_certs(files: Files) -> None:
    cert, key = files.write_pair("serving", common_name="one")
    context = build_server_context(cert_file=cert, key_file=key, client_ca_pems=[
        pki.certificate_pem(files.serving_ca.certificate)])
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2
    assert context.verify_mode is ssl.CERT_OPTIONAL


def test_server_context_without_any_ca_does_not_request_certs(files: Files) -> None:
    cert, key = files.write_pair("serving", common_name="one")
    assert build_server_context(cert_file=cert, key_file=key).verify_mode is ssl.CERT_NONE


def test_server_context_unloadable_pair_is_a_config_error(files: Files) -> None:
    with pytest.raises(TLSConfigError, match="serving certificate"):
        build_server_context(cert_file=files.directory / "no.crt",
                             key_file=files.directory / "no.key")


def test_server_context_bad_ca_is_a_config_error(files: Files) -> None:
    cert, key = files.write_pair("serving", common_name="one")
    with pytest.raises(TLSConfigError, match="client CA"):
        build_server_context(cert_file=cert, key_file=key, client_ca_pems=[b"garbage"])


async def test_alpn_never_selects_h2(files: Files) -> None:
    cert, key = files.write_pair("serving", common_name="one")
    async with serving(build_server_context(cert_file=cert, key_file=key)) as port:
        connection = await connect(port, client_context(files, alpn=["h2", "http/1.1"]))
        try:
            ssl_object = connection.writer.get_extra_info("ssl_object")
            assert ssl_object.selected_alpn_protocol() == "http/1.1"
            assert ssl_object.version() in {"TLSv1.2", "TLSv1.3"}
        finally:
            await connection.close()


async def test_tls_1_1_client_is_refused(files: Files) -> None:
    cert, key = files.write_pair("serving", common_name="one")
    old = client_context(files)
    # Security level 0 lets this client speak TLS 1.1 at all, so only the server can refuse.
    old.set_ciphers("ALL:@SECLEVEL=0")
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    with pytest.warns(DeprecationWarning):
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    async with serving(build_server_context(cert_file=cert, key_file=key)) as port:
        assert await identity_or_failure(port, old) == "handshake-failed"


async def test_cert_from_either_ca_is_seen_and_unknown_ca_fails_the_handshake(
        files: Files) -> None:
    proxy_ca, client_ca, other_ca = live_ca("proxy"), live_ca("client"), live_ca("other")
    cert, key = files.write_pair("serving", common_name="one")
    context = build_server_context(cert_file=cert, key_file=key, client_ca_pems=[
        pki.certificate_pem(proxy_ca.certificate), pki.certificate_pem(client_ca.certificate)])
    async with serving(context) as port:
        assert await identity_or_failure(port, client_context(
            files, cert=files.write_client("p", proxy_ca, user="front-proxy-client"))) == \
            "front-proxy-client"
        assert await identity_or_failure(port, client_context(
            files, cert=files.write_client("c", client_ca, user="jane"))) == "jane"
        assert await identity_or_failure(port, client_context(files)) == "-"
        # The documented difference from Go: a certificate no CA vouches for ends the
        # handshake instead of getting a 401.
        assert await identity_or_failure(port, client_context(
            files, cert=files.write_client("o", other_ca, user="mallory"))) == "handshake-failed"


async def test_expired_or_server_only_client_cert_fails_the_handshake(files: Files) -> None:
    """OpenSSL checks validity and the clientAuth usage itself: neither reaches the adapter."""
    ca = live_ca("proxy")
    cert, key = files.write_pair("serving", common_name="one")
    context = build_server_context(cert_file=cert, key_file=key,
                                   client_ca_pems=[pki.certificate_pem(ca.certificate)])
    expired = pki.issue_client_certificate(ca, user="old", now=datetime.now(UTC) - YEAR,
                                           validity=timedelta(days=1))
    server_only = pki.issue_serving_certificate(
        ca, common_name="front-proxy-client", dns_names=["x"],
        now=datetime.now(UTC) - timedelta(hours=1), validity=timedelta(days=1))
    async with serving(context) as port:
        for name, pair in (("expired", expired), ("server-only", server_only)):
            cert_path = pki.write_certificate(files.directory / f"{name}.crt", pair.certificate)
            key_path = pki.write_private_key(files.directory / f"{name}.key", pair.private_key)
            client = client_context(files, cert=(cert_path, key_path))
            assert await identity_or_failure(port, client) == "handshake-failed", name


async def test_serving_cert_reload_swaps_new_connections_and_keeps_old_ones(
        files: Files) -> None:
    cert, key = files.write_pair("serving", common_name="one")
    holder = ReloadingServerContext(cert_file=cert, key_file=key)
    assert holder.reload_if_changed() is False
    async with serving(holder.listening_context) as port:
        old = await connect(port, client_context(files))
        try:
            assert old.served_cn() == "one"
            files.write_pair("serving", common_name="two")
            assert holder.reload_if_changed() is True
            assert holder.reload_if_changed() is False
            fresh = await connect(port, client_context(files))
            assert fresh.served_cn() == "two"
            await fresh.close()
            assert await old.ask() == "-"  # the established connection still answers
        finally:
            await old.close()


async def test_broken_replacement_pair_keeps_the_previous_certificate(files: Files) -> None:
    cert, key = files.write_pair("serving", common_name="one")
    holder = ReloadingServerContext(cert_file=cert, key_file=key)
    key.write_bytes(b"half-written")
    with pytest.raises(TLSConfigError):
        holder.reload_if_changed()
    async with serving(holder.listening_context) as port:
        connection = await connect(port, client_context(files))
        assert connection.served_cn() == "one"
        await connection.close()


async def test_rotated_client_ca_applies_to_new_connections(files: Files) -> None:
    ca_a, ca_b = live_ca("a"), live_ca("b")
    cert, key = files.write_pair("serving", common_name="one")
    holder = ReloadingServerContext(cert_file=cert, key_file=key, client_ca_pems=[
        pki.certificate_pem(ca_a.certificate)])
    with_a = client_context(files, cert=files.write_client("ca", ca_a, user="from-a"))
    with_b = client_context(files, cert=files.write_client("cb", ca_b, user="from-b"))
    async with serving(holder.listening_context) as port:
        assert await identity_or_failure(port, with_a) == "from-a"
        assert holder.set_client_cas([pki.certificate_pem(ca_b.certificate)]) is True
        assert holder.set_client_cas([pki.certificate_pem(ca_b.certificate)]) is False
        assert await identity_or_failure(port, with_a) == "handshake-failed"
        assert await identity_or_failure(port, with_b) == "from-b"


async def test_client_ca_arriving_after_start_makes_the_server_ask_for_certs(
        files: Files) -> None:
    ca = live_ca("late")
    cert, key = files.write_pair("serving", common_name="one")
    holder = ReloadingServerContext(cert_file=cert, key_file=key)
    with_cert = client_context(files, cert=files.write_client("late", ca, user="late-user"))
    async with serving(holder.listening_context) as port:
        assert await identity_or_failure(port, with_cert) == "-"
        holder.set_client_cas([pki.certificate_pem(ca.certificate)])
        assert await identity_or_failure(port, with_cert) == "late-user"


# --------------------------------------------------------------------- self-signed pair

def test_self_signed_pair_is_made_once_with_a_private_key_file(tmp_path: Path) -> None:
    cert_path, key_path = ensure_self_signed_certificate(tmp_path / "certs", now=NOW)
    assert (cert_path.name, key_path.name) == ("apiserver.crt", "apiserver.key")
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    chain = pki.load_certificates_pem(cert_path.read_bytes())
    assert len(chain) == 2
    leaf = chain[0]
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert leaf.not_valid_before_utc == NOW - timedelta(hours=1)
    before = cert_path.read_bytes()
    assert ensure_self_signed_certificate(tmp_path / "certs", now=NOW + YEAR) == (
        cert_path, key_path)
    assert cert_path.read_bytes() == before


async def test_self_signed_pair_serves_tls_its_own_ca_verifies_for_its_names_only(
        tmp_path: Path) -> None:
    name = "metricscale.metricscale.svc"
    cert_path, key_path = ensure_self_signed_certificate(
        tmp_path, now=datetime.now(UTC), dns_names=[name], ip_addresses=[])
    leaf, ca = pki.load_certificates_pem(cert_path.read_bytes())
    trusting = ssl.create_default_context(cadata=pki.certificate_pem(ca).decode())
    async with serving(build_server_context(cert_file=cert_path, key_file=key_path)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=trusting,
                                                       server_hostname=name)
        connection = Connection(reader, writer)
        try:
            assert connection.served_cn() == \
                leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
            assert await connection.ask() == "-"  # no client CA: no client certificate asked
        finally:
            await connection.close()
        with pytest.raises(ssl.SSLCertVerificationError, match="localhost"):
            await asyncio.open_connection("127.0.0.1", port, ssl=trusting,
                                          server_hostname="localhost")
