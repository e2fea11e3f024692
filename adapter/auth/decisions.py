"""Delegated authentication and authorization decisions, made as Kubernetes API servers make them.

Everything here is a plain function over plain values: no I/O, no clock (callers pass ``now``).
The HTTP shell feeds in the peer certificate facts (from :mod:`adapter.security.tls`), the
request headers as a list of ``(name, value)`` pairs in arrival order, and the answers of
TokenReview and SubjectAccessReview calls; it gets back users, request attributes, review
bodies, cache keys, decisions and the ``Status`` bodies to send.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from adapter.api.wire import status_body
from metricscale.core.errors import ConfigError
from metricscale.core.selectors import quote_go_string

logger = logging.getLogger(__name__)

Headers = Sequence[tuple[str, str]]

ANONYMOUS_USER = "system:anonymous"
UNAUTHENTICATED_GROUP = "system:unauthenticated"
AUTHENTICATED_GROUP = "system:authenticated"
MASTERS_GROUP = "system:masters"

DEFAULT_USERNAME_HEADERS = ("x-remote-user",)
DEFAULT_GROUP_HEADERS = ("x-remote-group",)
DEFAULT_EXTRA_HEADERS_PREFIXES = ("x-remote-extra-",)
DEFAULT_ALWAYS_ALLOW_PATHS = ("/healthz", "/readyz", "/livez")
DEFAULT_PRIVILEGED_GROUPS = (MASTERS_GROUP,)

# --authentication-token-webhook-cache-ttl (success and failure alike; transport errors are not
# answers and are never cached) and --authorization-webhook-cache-{un,}authorized-ttl.
TOKEN_CACHE_TTL_SECONDS = 10.0
AUTHORIZED_TTL_SECONDS = 10.0
UNAUTHORIZED_TTL_SECONDS = 10.0
CACHE_MAX_ENTRIES = 8192
# Requester-controlled attributes this long or longer are not cached (a DoS guard upstream).
MAX_CACHED_ATTRIBUTES_BYTES = 10_000
# The webhook clients' backoff: 500 ms, factor 1.5, 5 attempts in all (jitter is the caller's).
REVIEW_RETRY_DELAYS_SECONDS = (0.5, 0.75, 1.125, 1.6875)

EXTENSION_AUTH_CONFIGMAP_NAMESPACE = "kube-system"
EXTENSION_AUTH_CONFIGMAP_NAME = "extension-apiserver-authentication"

_API_PREFIXES = frozenset({"api", "apis"})
_GROUPLESS_API_PREFIXES = frozenset({"api"})
_SPECIAL_VERBS = frozenset({"proxy", "watch"})
_SPECIAL_VERBS_NO_SUBRESOURCES = frozenset({"proxy"})
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_METHOD_VERBS: Mapping[str, str] = MappingProxyType({
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
})


class AuthConfigError(ConfigError):
    """The authentication configuration (ConfigMap or flags) cannot be used."""


class RequestAttributesError(ValueError):
    """The request path cannot be turned into authorization attributes (upstream answers 500)."""


class ReviewResponseError(ValueError):
    """A TokenReview or SubjectAccessReview answer is not the shape the API promises."""


# --------------------------------------------------------------------------------------------
# Users


@dataclass(frozen=True)
class UserInfo:
    """Who is asking. ``extra`` maps a key to its values; it makes instances unhashable."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


ANONYMOUS = UserInfo(name=ANONYMOUS_USER, groups=(UNAUTHENTICATED_GROUP,))


# --------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class RequestHeaderConfig:
    """Front-proxy trust: the CA signing the proxy's client certificate, and the headers it sets."""

    ca_pem: bytes
    allowed_names: tuple[str, ...] = ()
    username_headers: tuple[str, ...] = DEFAULT_USERNAME_HEADERS
    uid_headers: tuple[str, ...] = ()
    group_headers: tuple[str, ...] = DEFAULT_GROUP_HEADERS
    extra_headers_prefixes: tuple[str, ...] = DEFAULT_EXTRA_HEADERS_PREFIXES


@dataclass(frozen=True)
class AuthenticationConfig:
    """The client CA (for plain client certificates) and the front-proxy settings; both optional."""

    client_ca_pem: bytes | None = None
    request_header: RequestHeaderConfig | None = None


def _pem_value(data: Mapping[str, str], key: str) -> bytes | None:
    value = data.get(key)
    if value is None or not value.strip():
        return None
    return value.encode()


def _json_string_list(data: Mapping[str, str], key: str) -> tuple[str, ...]:
    """A ConfigMap value holding a JSON array of strings; missing, empty and ``null`` mean none."""
    raw = data.get(key)
    if raw is None or raw == "":
        return ()
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as error:
        raise AuthConfigError(f"{key}: not a JSON array of strings: {error.msg}") from error
    if parsed is None:
        return ()
    if not isinstance(parsed, list) or not all(isinstance(item, str) for item in parsed):
        raise AuthConfigError(f"{key}: not a JSON array of strings")
    return tuple(parsed)


def _header_names(key: str, names: Sequence[str]) -> tuple[str, ...]:
    # An empty header name or prefix would match nothing (a name) or every header (a prefix,
    # turning every request header into identity "extra"): refuse both.
    trimmed = tuple(name.strip() for name in names)
    if any(not name for name in trimmed):
        raise AuthConfigError(f"{key}: empty header name")
    return trimmed


def parse_extension_apiserver_authentication(data: Mapping[str, str]) -> AuthenticationConfig:
    """Read the ``data`` of ``kube-system/extension-apiserver-authentication``.

    The request-header keys only count when ``requestheader-client-ca-file`` is present, as
    kube-apiserver writes them only then.
    """
    client_ca = _pem_value(data, "client-ca-file")
    request_header_ca = _pem_value(data, "requestheader-client-ca-file")
    request_header = None
    if request_header_ca is not None:
        request_header = RequestHeaderConfig(
            ca_pem=request_header_ca,
            allowed_names=_json_string_list(data, "requestheader-allowed-names"),
            username_headers=_header_names(
                "requestheader-username-headers",
                _json_string_list(data, "requestheader-username-headers")),
            uid_headers=_header_names(
                "requestheader-uid-headers", _json_string_list(data, "requestheader-uid-headers")),
            group_headers=_header_names(
                "requestheader-group-headers",
                _json_string_list(data, "requestheader-group-headers")),
            extra_headers_prefixes=_header_names(
                "requestheader-extra-headers-prefix",
                _json_string_list(data, "requestheader-extra-headers-prefix")),
        )
    return AuthenticationConfig(client_ca_pem=client_ca, request_header=request_header)


def authentication_from_flags(
    *,
    client_ca_pem: bytes | None = None,
    requestheader_client_ca_pem: bytes | None = None,
    requestheader_allowed_names: Sequence[str] = (),
    requestheader_username_headers: Sequence[str] = DEFAULT_USERNAME_HEADERS,
    requestheader_uid_headers: Sequence[str] = (),
    requestheader_group_headers: Sequence[str] = DEFAULT_GROUP_HEADERS,
    requestheader_extra_headers_prefix: Sequence[str] = DEFAULT_EXTRA_HEADERS_PREFIXES,
) -> AuthenticationConfig:
    """The configuration given by the generic apiserver's flags (the caller reads the CA files).

    Header flags only matter together with ``--requestheader-client-ca-file``.
    """
    request_header = None
    if requestheader_client_ca_pem is not None and requestheader_client_ca_pem.strip():
        request_header = RequestHeaderConfig(
            ca_pem=requestheader_client_ca_pem,
            allowed_names=tuple(requestheader_allowed_names),
            username_headers=_header_names(
                "--requestheader-username-headers", requestheader_username_headers),
            uid_headers=_header_names("--requestheader-uid-headers", requestheader_uid_headers),
            group_headers=_header_names(
                "--requestheader-group-headers", requestheader_group_headers),
            extra_headers_prefixes=_header_names(
                "--requestheader-extra-headers-prefix", requestheader_extra_headers_prefix),
        )
    client_ca = client_ca_pem if client_ca_pem is not None and client_ca_pem.strip() else None
    return AuthenticationConfig(client_ca_pem=client_ca, request_header=request_header)


def needs_cluster_lookup(flags: AuthenticationConfig, *, skip_lookup: bool) -> bool:
    """Whether to read the ConfigMap: some CA is not given by flag and lookup is not skipped."""
    if skip_lookup:
        return False
    return flags.client_ca_pem is None or flags.request_header is None


def merge_authentication_config(
    flags: AuthenticationConfig, cluster: AuthenticationConfig | None
) -> AuthenticationConfig:
    """Flags override the in-cluster ConfigMap part by part (client CA; front-proxy block)."""
    if cluster is None:
        return flags
    return AuthenticationConfig(
        client_ca_pem=flags.client_ca_pem if flags.client_ca_pem is not None
        else cluster.client_ca_pem,
        request_header=flags.request_header if flags.request_header is not None
        else cluster.request_header,
    )


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
# Authentication


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


def _is_hex(char: str) -> bool:
    return char in "0123456789abcdefABCDEF"


_BYTES = tuple(bytes((value,)) for value in range(256))


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
            if len(pair) != 2 or not all(_is_hex(c) for c in pair):
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


# --------------------------------------------------------------------------------------------
# Request attributes (RequestInfoFactory with API prefixes "api" and "apis")


@dataclass(frozen=True)
class RequestAttributes:
    """What is being asked, in the terms of authorization."""

    verb: str
    path: str
    is_resource_request: bool = False
    api_prefix: str = ""
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    parts: tuple[str, ...] = ()


class RequestPathError(ValueError):
    """A request path the adapter refuses outright (answer 400): it could be read two ways."""


def decode_request_path(raw_path: str) -> str:
    """The decoded path to authorize and route on, as Go's ``URL.Path``; ambiguity refused.

    ``raw_path`` is the path as sent, without the query. Go decodes every escape, so an encoded
    slash becomes a separator there while a Python router may keep it inside a segment; a dot
    segment may be resolved by one layer and not another. Rather than authorize one reading and
    serve another, such paths are refused: ``%2F``, NUL, ``.``/``..`` segments (escaped or
    not) and malformed escapes.
    """
    if not raw_path.startswith("/"):
        raise RequestPathError("the request path must start with /")
    # Left to right, one piece per escape (every request runs this: no loop per character).
    first, *escaped = raw_path.split("%")
    out = [first.encode()]
    for piece in escaped:
        pair = piece[:2]
        if len(pair) != 2 or not (_is_hex(pair[0]) and _is_hex(pair[1])):
            raise RequestPathError("malformed percent-encoding in the request path")
        value = int(pair, 16)
        if value == ord("/"):
            raise RequestPathError("encoded slashes are not allowed in the request path")
        out.append(_BYTES[value])
        out.append(piece[2:].encode())
    try:
        path = b"".join(out).decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestPathError("the request path is not UTF-8") from error
    if "\x00" in path:
        raise RequestPathError("NUL is not allowed in the request path")
    if any(segment in {".", ".."} for segment in path.split("/")):
        raise RequestPathError("dot segments are not allowed in the request path")
    return path


def _split_path(path: str) -> list[str]:
    # Only the outer slashes go: an inner empty segment stays a segment, as upstream.
    trimmed = path.strip("/")
    return trimmed.split("/") if trimmed else []


def _query_values(query: Sequence[tuple[str, str]], key: str) -> list[str]:
    return [value for name, value in query if name == key]


def _split_unescaped(text: str, separator: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            current.append(char)
            escaped = True
        elif char == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _unescape_field_value(value: str) -> str | None:
    out: list[str] = []
    escaped = False
    for char in value:
        if escaped:
            if char not in "\\,=":
                return None
            out.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in ",=":
            return None
        else:
            out.append(char)
    return None if escaped else "".join(out)


def _field_selector_exact_name(selector: str) -> str | None:
    """``metadata.name`` required by a field selector (``=``/``==``), None if absent or invalid."""
    terms: list[tuple[str, str, str]] = []
    for part in sorted(_split_unescaped(selector, ",")):
        if not part:
            continue
        for index in range(len(part)):
            operator = next((op for op in ("!=", "==", "=") if part.startswith(op, index)), None)
            if operator is not None:
                value = _unescape_field_value(part[index + len(operator):])
                if value is None:
                    return None
                terms.append((part[:index], operator, value))
                break
        else:
            return None
    for lhs, operator, value in terms:
        if lhs == "metadata.name" and operator != "!=":
            return value
    return None


def _is_valid_path_segment_name(name: str) -> bool:
    return name not in {".", ".."} and "/" not in name and "%" not in name


def _query_flag(values: Sequence[str]) -> bool:
    return bool(values) and values[0].lower() not in {"false", "0"}


def request_attributes(
    *, method: str, path: str, query: Sequence[tuple[str, str]] = ()
) -> RequestAttributes:
    """Authorization attributes of a request, as ``RequestInfoFactory.NewRequestInfo``.

    ``path`` is the decoded URL path; ``query`` the decoded query pairs. Selector attributes
    (AuthorizeWithSelectors) are not produced: reviews ask for the broader permission.
    """
    non_resource = RequestAttributes(verb=method.lower(), path=path)
    parts = _split_path(path)
    if len(parts) < 3 or parts[0] not in _API_PREFIXES:
        return non_resource
    api_prefix = parts[0]
    parts = parts[1:]
    api_group = ""
    if api_prefix not in _GROUPLESS_API_PREFIXES:
        if len(parts) < 3:
            return non_resource
        api_group = parts[0]
        parts = parts[1:]
    api_version = parts[0]
    parts = parts[1:]

    verb_via_path = parts[0] in _SPECIAL_VERBS
    if verb_via_path:
        if len(parts) < 2:
            raise RequestAttributesError(
                f"unable to determine kind and namespace from url {path}")
        verb = parts[0]
        parts = parts[1:]
    else:
        verb = _METHOD_VERBS.get(method, "")  # methods are case-sensitive

    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]

    resource = subresource = name = ""
    if len(parts) >= 3 and verb not in _SPECIAL_VERBS_NO_SUBRESOURCES:
        subresource = parts[2]
    if len(parts) >= 2:
        name = parts[1]
    if len(parts) >= 1:
        resource = parts[0]

    if not name and verb == "get":
        verb = "watch" if _query_flag(_query_values(query, "watch")) else "list"
        selectors = _query_values(query, "fieldSelector")
        if selectors:
            exact = _field_selector_exact_name(selectors[0])
            if exact is not None and _is_valid_path_segment_name(exact):
                name = exact
    if not name and verb == "delete":
        verb = "deletecollection"

    return RequestAttributes(
        verb=verb,
        path=path,
        is_resource_request=True,
        api_prefix=api_prefix,
        api_group=api_group,
        api_version=api_version,
        namespace=namespace,
        resource=resource,
        subresource=subresource,
        name=name,
        parts=tuple(parts),
    )


def check_request_attributes(*, method: str, path: str) -> None:
    """Raise RequestAttributesError where ``request_attributes`` would, without building the
    attributes (when nothing reviews them). Only a verb in the path (``watch``, ``proxy``)
    with nothing after it fails, whatever the query: the rest is only read for those."""
    if any("/" + verb in path for verb in _SPECIAL_VERBS):
        request_attributes(method=method, path=path)


# --------------------------------------------------------------------------------------------
# Authorization


class Decision(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"
    NO_OPINION = "no-opinion"


@dataclass(frozen=True)
class AuthorizationDecision:
    """A decision with the reviewer's reason; ``error`` set means "answer 500"."""

    decision: Decision
    reason: str = ""
    error: str = ""


@dataclass(frozen=True)
class AlwaysAllowPaths:
    """``--authorization-always-allow-paths``: exact paths, or prefixes ending in ``*``."""

    exact: frozenset[str]
    prefixes: tuple[str, ...]

    def allows(self, attributes: RequestAttributes) -> bool:
        if attributes.is_resource_request:
            return False
        path = attributes.path.removeprefix("/")
        return path in self.exact or any(path.startswith(prefix) for prefix in self.prefixes)


def parse_always_allow_paths(paths: Sequence[str]) -> AlwaysAllowPaths:
    exact: set[str] = set()
    prefixes: list[str] = []
    for raw in paths:
        path = raw.removeprefix("/")
        if not path:
            exact.add(path)
            continue
        if "*" in path[:-1]:
            raise AuthConfigError(f"only trailing * allowed in {path!r}")
        if path.endswith("*"):
            prefixes.append(path[:-1])
        else:
            exact.add(path)
    return AlwaysAllowPaths(frozenset(exact), tuple(prefixes))


def authorize_without_review(
    *,
    user: UserInfo,
    attributes: RequestAttributes,
    always_allow_paths: AlwaysAllowPaths,
    privileged_groups: Sequence[str] = DEFAULT_PRIVILEGED_GROUPS,
) -> AuthorizationDecision:
    """The local part of the union: privileged groups, then always-allowed paths.

    NO_OPINION means a SubjectAccessReview decides.
    """
    if any(group in privileged_groups for group in user.groups):
        return AuthorizationDecision(Decision.ALLOW)
    if always_allow_paths.allows(attributes):
        return AuthorizationDecision(Decision.ALLOW)
    return AuthorizationDecision(Decision.NO_OPINION)


def subject_access_review_spec(user: UserInfo, attributes: RequestAttributes) -> dict[str, Any]:
    """The review ``spec``, keys in upstream's order, empty fields omitted as ``omitempty`` does."""
    spec: dict[str, Any] = {}
    if attributes.is_resource_request:
        resource_attributes = {
            "namespace": attributes.namespace,
            "verb": attributes.verb,
            "group": attributes.api_group,
            "version": attributes.api_version,
            "resource": attributes.resource,
            "subresource": attributes.subresource,
            "name": attributes.name,
        }
        spec["resourceAttributes"] = {k: v for k, v in resource_attributes.items() if v}
    else:
        non_resource = {"path": attributes.path, "verb": attributes.verb}
        spec["nonResourceAttributes"] = {k: v for k, v in non_resource.items() if v}
    if user.name:
        spec["user"] = user.name
    if user.groups:
        spec["groups"] = list(user.groups)
    if user.extra:
        # Go marshals maps with sorted keys; the cache key relies on the same stable order.
        spec["extra"] = {key: list(user.extra[key]) for key in sorted(user.extra)}
    if user.uid:
        spec["uid"] = user.uid
    return spec


def subject_access_review_body(user: UserInfo, attributes: RequestAttributes) -> dict[str, Any]:
    """The whole SubjectAccessReview object as the Go server posts it."""
    return {
        "kind": "SubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": subject_access_review_spec(user, attributes),
        "status": {"allowed": False},
    }


def review_cache_key(spec: Mapping[str, Any]) -> str:
    """The decision cache key: the JSON of the whole spec (user, groups, extra and attributes)."""
    return json.dumps(spec, separators=(",", ":"), ensure_ascii=False)


def should_cache_review(attributes: RequestAttributes) -> bool:
    size = sum(len(value.encode()) for value in (
        attributes.namespace, attributes.verb, attributes.api_group, attributes.api_version,
        attributes.resource, attributes.subresource, attributes.name, attributes.path))
    return size < MAX_CACHED_ATTRIBUTES_BYTES


@dataclass(frozen=True)
class ReviewStatus:
    """The ``status`` of an answered SubjectAccessReview."""

    allowed: bool
    denied: bool = False
    reason: str = ""
    evaluation_error: str = ""


def read_subject_access_review(body: Mapping[str, Any]) -> ReviewStatus:
    status = body.get("status")
    if status is None:
        status = {}
    if not isinstance(status, Mapping):
        raise ReviewResponseError("SubjectAccessReview status is not an object")
    allowed = status.get("allowed", False)
    denied = status.get("denied", False)
    reason = status.get("reason") or ""
    evaluation_error = status.get("evaluationError") or ""
    if not isinstance(allowed, bool) or not isinstance(denied, bool):
        raise ReviewResponseError("SubjectAccessReview status.allowed/denied are not booleans")
    if not isinstance(reason, str) or not isinstance(evaluation_error, str):
        raise ReviewResponseError("SubjectAccessReview status.reason is not a string")
    return ReviewStatus(allowed=allowed, denied=denied, reason=reason,
                        evaluation_error=evaluation_error)


def decide_from_review(status: ReviewStatus) -> AuthorizationDecision:
    """allowed ⇒ Allow, denied ⇒ Deny, neither ⇒ no opinion (403); both is an error (500)."""
    if status.allowed and status.denied:
        return AuthorizationDecision(
            Decision.DENY, status.reason,
            "webhook subject access review returned both allow and deny response")
    if status.denied:
        return AuthorizationDecision(Decision.DENY, status.reason)
    if status.allowed:
        return AuthorizationDecision(Decision.ALLOW, status.reason)
    return AuthorizationDecision(Decision.NO_OPINION, status.reason)


def review_ttl(
    status: ReviewStatus,
    *,
    authorized_ttl: float = AUTHORIZED_TTL_SECONDS,
    unauthorized_ttl: float = UNAUTHORIZED_TTL_SECONDS,
) -> float:
    return authorized_ttl if status.allowed else unauthorized_ttl


def should_retry_review(status_code: int | None) -> bool:
    """Retry connection errors (None), 429 and 5xx; anything else will not change on retry."""
    return status_code is None or status_code == 429 or status_code >= 500


# --------------------------------------------------------------------------------------------
# A small LRU cache with per-entry expiry; the caller supplies the time.

K = TypeVar("K")
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """LRU-bounded cache whose entries expire ``ttl`` seconds after being stored."""

    def __init__(self, *, max_entries: int = CACHE_MAX_ENTRIES) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K, *, now: float) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, value = entry
        if now >= expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V, *, ttl: float, now: float) -> None:
        if ttl <= 0:
            return
        self._entries[key] = (now + ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


# --------------------------------------------------------------------------------------------
# Status bodies

def _html_sanitize(text: str) -> str:
    # Upstream escapes these so an error text can never be mistaken for HTML.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def forbidden_message(*, user: UserInfo, attributes: RequestAttributes, reason: str = "") -> str:
    """The message of ``responsewriters.Forbidden`` wrapped by ``NewForbidden``."""
    who = quote_go_string(user.name)
    if not attributes.is_resource_request:
        detail = f"User {who} cannot {attributes.verb} path {quote_go_string(attributes.path)}"
    else:
        resource = attributes.resource
        if attributes.subresource:
            resource = f"{resource}/{attributes.subresource}"
        scope = (f"in the namespace {quote_go_string(attributes.namespace)}"
                 if attributes.namespace else "at the cluster scope")
        detail = (f"User {who} cannot {attributes.verb} resource {quote_go_string(resource)} "
                  f"in API group {quote_go_string(attributes.api_group)} {scope}")
    detail = _html_sanitize(detail)
    if reason:
        detail = f"{detail}: {reason}"
    if not attributes.api_group and not attributes.resource:
        return f"forbidden: {detail}"
    qualified = (f"{attributes.resource}.{attributes.api_group}" if attributes.api_group
                 else attributes.resource)
    if not attributes.name:
        return f"{qualified} is forbidden: {detail}"
    return f"{qualified} {quote_go_string(attributes.name)} is forbidden: {detail}"


def forbidden_status(
    *, user: UserInfo, attributes: RequestAttributes, reason: str = ""
) -> dict[str, Any]:
    details = {"name": attributes.name, "group": attributes.api_group,
               "kind": attributes.resource}
    return status_body(
        code=403, reason="Forbidden",
        message=forbidden_message(user=user, attributes=attributes, reason=reason),
        details={key: value for key, value in details.items() if value},
    )


AUTHORIZATION_FAILED_CAUSE = "the authorization check could not be completed"
AUTHENTICATION_FAILED_CAUSE = "the authentication check could not be completed"
