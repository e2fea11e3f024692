"""Authentication decisions: the front proxy's identity headers, client certificates, bearer
tokens through TokenReview, and the union of them all, as Kubernetes API servers decide.

The HTTP shell hands in the peer certificate facts (from adapter.security.tls) and the request
headers as `(name, value)` pairs in arrival order; nothing here does I/O.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from string import hexdigits
from typing import Any

from adapter.auth.configuration import AuthenticationConfig, RequestHeaderConfig
from adapter.auth.reviews import ReviewResponseError
from adapter.auth.users import (
    ANONYMOUS,
    ANONYMOUS_USER,
    AUTHENTICATED_GROUP,
    UNAUTHENTICATED_GROUP,
    UserInfo,
)

Headers = Sequence[tuple[str, str]]


# --------------------------------------------------------------------------------------------
# Peer certificate facts (computed by adapter.security.tls)


class ChainVerdict(enum.Enum):
    """Whether the peer's certificate chains to one CA bundle (with EKU clientAuth, in validity)."""

    VERIFIED = "verified"
    FAILED = "failed"
    NO_CA = "no-ca"  # no bundle configured: that authenticator cannot apply


@dataclass(frozen=True)
class ChainCheck:
    verdict: ChainVerdict
    error: str = ""


NO_CA = ChainCheck(ChainVerdict.NO_CA)


@dataclass(frozen=True)
class PeerCertificate:
    """What authentication needs to know about a TLS client certificate."""

    common_name: str
    organizations: tuple[str, ...]
    request_header_ca: ChainCheck
    client_ca: ChainCheck
    identifier: str = ""  # "SN=…, SKID=…, AKID=…", for log lines


# --------------------------------------------------------------------------------------------
# Who the request is from


class AuthMethod(enum.Enum):
    FRONT_PROXY = "front-proxy"
    CLIENT_CERTIFICATE = "client-certificate"
    TOKEN = "token"
    ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Authenticated:
    user: UserInfo
    method: AuthMethod


@dataclass(frozen=True)
class Unauthenticated:
    """An authenticator did not succeed: no credentials for it (no errors), or bad ones (errors)."""

    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class AuthenticationFailure:
    """The chain failed: answer 401. ``errors`` are for the log, never for the client."""

    errors: tuple[str, ...]


AuthenticatorResult = Authenticated | Unauthenticated


def _header_values(headers: Headers, name: str) -> list[str]:
    wanted = name.lower()
    return [value for key, value in headers if key.lower() == wanted]


def first_header_value(headers: Headers, names: Sequence[str]) -> str:
    """The first value of the first listed header whose first value is non-empty (Go's ``Get``)."""
    for name in names:
        values = _header_values(headers, name)
        if values and values[0]:
            return values[0]
    return ""


def all_header_values(headers: Headers, names: Sequence[str]) -> tuple[str, ...]:
    """Every non-empty value of every listed header, in order; values are never split on commas."""
    values: list[str] = []
    for name in names:
        values.extend(value for value in _header_values(headers, name) if value)
    return tuple(values)


def unescape_extra_key(encoded: str) -> str:
    """Percent-decode an extra key as Go's ``url.PathUnescape``; malformed input is kept as is."""
    if "%" not in encoded:
        return encoded
    out = bytearray()
    index = 0
    while index < len(encoded):
        char = encoded[index]
        if char == "%":
            pair = encoded[index + 1:index + 3]
            if len(pair) != 2 or not all(c in hexdigits for c in pair):
                return encoded
            out.append(int(pair, 16))
            index += 3
        else:
            out.extend(char.encode())
            index += 1
    # Go keeps raw bytes and its JSON encoder later turns invalid UTF-8 into U+FFFD: same here.
    return out.decode("utf-8", errors="replace")


def _has_prefix_fold(name: str, prefix: str) -> bool:
    return len(name) >= len(prefix) and name[:len(prefix)].lower() == prefix.lower()


def extra_from_headers(
    headers: Headers, prefixes: Sequence[str]
) -> dict[str, tuple[str, ...]]:
    """Extra from prefixed headers: key = rest of the name lower-cased, then percent-decoded."""
    extra: dict[str, list[str]] = {}
    for prefix in prefixes:
        for name, value in headers:
            if not _has_prefix_fold(name, prefix):
                continue
            key = unescape_extra_key(name[len(prefix):].lower())
            extra.setdefault(key, []).append(value)
    return {key: tuple(values) for key, values in extra.items()}


def is_identity_header(name: str, config: RequestHeaderConfig) -> bool:
    """Whether a header carries front-proxy identity (removed once the proxy is trusted)."""
    lowered = name.lower()
    exact = {header.lower() for header in
             (*config.username_headers, *config.uid_headers, *config.group_headers)}
    return lowered in exact or any(
        _has_prefix_fold(name, prefix) for prefix in config.extra_headers_prefixes)


def strip_identity_headers(
    headers: Headers, config: RequestHeaderConfig
) -> tuple[tuple[str, str], ...]:
    return tuple((name, value) for name, value in headers if not is_identity_header(name, config))


def authenticate_front_proxy(
    *, config: RequestHeaderConfig | None, peer: PeerCertificate | None, headers: Headers
) -> AuthenticatorResult:
    """The request-header authenticator: trust identity headers only from a verified proxy cert."""
    if config is None or peer is None:
        return Unauthenticated()
    check = peer.request_header_ca
    if check.verdict is ChainVerdict.NO_CA:
        return Unauthenticated()
    if check.verdict is ChainVerdict.FAILED:
        return Unauthenticated((check.error or "x509: certificate signed by unknown authority",))
    if config.allowed_names and peer.common_name not in config.allowed_names:
        return Unauthenticated(
            (f"x509: subject with cn={peer.common_name} is not in the allowed list",))
    name = first_header_value(headers, config.username_headers)
    if not name:
        return Unauthenticated()
    return Authenticated(
        UserInfo(
            name=name,
            uid=first_header_value(headers, config.uid_headers),
            groups=all_header_values(headers, config.group_headers),
            extra=extra_from_headers(headers, config.extra_headers_prefixes),
        ),
        AuthMethod.FRONT_PROXY,
    )


def authenticate_client_certificate(peer: PeerCertificate | None) -> AuthenticatorResult:
    """The x509 authenticator: a client-CA certificate names the user (CN) and groups (O)."""
    if peer is None:
        return Unauthenticated()
    check = peer.client_ca
    if check.verdict is ChainVerdict.NO_CA:
        return Unauthenticated()
    if check.verdict is ChainVerdict.FAILED:
        detail = check.error or "x509: certificate signed by unknown authority"
        return Unauthenticated((f"verifying certificate {peer.identifier} failed: {detail}",))
    if not peer.common_name:
        return Unauthenticated()
    return Authenticated(
        UserInfo(name=peer.common_name, groups=peer.organizations), AuthMethod.CLIENT_CERTIFICATE)


def authenticate_certificate(
    *, config: AuthenticationConfig, peer: PeerCertificate | None, headers: Headers
) -> AuthenticatorResult:
    """Front proxy, then client certificate: the part of the chain that needs no network call."""
    return union_authenticators(
        authenticate_front_proxy(config=config.request_header, peer=peer, headers=headers),
        authenticate_client_certificate(peer),
    )


def extract_bearer_token(headers: Headers) -> str | None:
    """The token of ``Authorization: Bearer <token>`` (scheme case-insensitive), or None."""
    values = _header_values(headers, "authorization")
    if not values:
        return None
    auth = values[0].strip()
    if not auth:
        return None
    parts = auth.split(" ", 2)
    if len(parts) < 2 or parts[0].lower() != "bearer":
        return None
    return parts[1] or None


def token_cache_key(token: str) -> str:
    """Cache key for a token: a digest, so the token itself is never held as a key or logged."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_review_body(token: str) -> dict[str, Any]:
    """The TokenReview to create; no audiences, so kube-apiserver applies its own."""
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token},
    }


def _string_list(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ReviewResponseError(f"{what} is not a list of strings")
    return tuple(value)


def read_token_review(body: Mapping[str, Any]) -> AuthenticatorResult:
    """Interpret a TokenReview answer: the user, or an error (never a silent fall-through)."""
    status = body.get("status")
    if status is None:
        status = {}
    if not isinstance(status, Mapping):
        raise ReviewResponseError("TokenReview status is not an object")
    if status.get("authenticated") is not True:
        error = status.get("error")
        return Unauthenticated((error if isinstance(error, str) and error
                                else "invalid bearer token",))
    user = status.get("user")
    if user is None:
        user = {}
    if not isinstance(user, Mapping):
        raise ReviewResponseError("TokenReview status.user is not an object")
    raw_extra = user.get("extra") or {}
    if not isinstance(raw_extra, Mapping):
        raise ReviewResponseError("TokenReview status.user.extra is not an object")
    name = user.get("username") or ""
    uid = user.get("uid") or ""
    if not isinstance(name, str) or not isinstance(uid, str):
        raise ReviewResponseError("TokenReview status.user username/uid are not strings")
    return Authenticated(
        UserInfo(
            name=name,
            uid=uid,
            groups=_string_list(user.get("groups"), "TokenReview status.user.groups"),
            extra={str(key): _string_list(values, "TokenReview status.user.extra")
                   for key, values in raw_extra.items()},
        ),
        AuthMethod.TOKEN,
    )


def union_authenticators(*results: AuthenticatorResult) -> AuthenticatorResult:
    """The first success wins, whatever failed before it; otherwise all errors together."""
    errors: list[str] = []
    for result in results:
        if isinstance(result, Authenticated):
            return result
        errors.extend(result.errors)
    return Unauthenticated(tuple(errors))


def with_authenticated_group(user: UserInfo) -> UserInfo:
    """Add ``system:authenticated`` unless anonymous or already (un)authenticated-grouped."""
    if user.name == ANONYMOUS_USER:
        return user
    if AUTHENTICATED_GROUP in user.groups or UNAUTHENTICATED_GROUP in user.groups:
        return user
    return UserInfo(name=user.name, uid=user.uid, groups=(*user.groups, AUTHENTICATED_GROUP),
                    extra=user.extra)


def finish_authentication(*results: AuthenticatorResult) -> Authenticated | AuthenticationFailure:
    """Union, then the group adder, then anonymous only when nobody found any credentials at all."""
    outcome = union_authenticators(*results)
    if isinstance(outcome, Authenticated):
        return Authenticated(with_authenticated_group(outcome.user), outcome.method)
    if outcome.errors:
        return AuthenticationFailure(outcome.errors)
    return Authenticated(ANONYMOUS, AuthMethod.ANONYMOUS)
