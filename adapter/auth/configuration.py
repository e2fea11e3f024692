"""Front-proxy and client-CA trust: the ConfigMap kube-apiserver publishes, the flags that
override it, and how the two combine (the generic apiserver's rules, as pure code)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from metricscale.core.errors import ConfigError

DEFAULT_USERNAME_HEADERS = ("x-remote-user",)
DEFAULT_GROUP_HEADERS = ("x-remote-group",)
DEFAULT_EXTRA_HEADERS_PREFIXES = ("x-remote-extra-",)

EXTENSION_AUTH_CONFIGMAP_NAMESPACE = "kube-system"
EXTENSION_AUTH_CONFIGMAP_NAME = "extension-apiserver-authentication"


class AuthConfigError(ConfigError):
    """The authentication configuration (ConfigMap or flags) cannot be used."""


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
