"""The flags and settings of a connection to a Prometheus-compatible backend.

`metricscale adapter` declares them for its `default` backend and `metricscale replay` for the
backend it reads history from; a `backends:` entry of the rule file makes the same settings
(`backend_prometheus_settings`).
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from typing import Literal

from yarl import URL

from adapter.rules.config import BackendConfig
from adapter.rules.tenants import tenant_headers
from metricscale.core.errors import ConfigError

__all__ = [
    "ACCEPT_ENCODINGS",
    "AcceptEncoding",
    "Method",
    "PrometheusConfigError",
    "PrometheusSettings",
    "add_prometheus_arguments",
    "backend_prometheus_settings",
    "control_character",
    "parse_header",
    "prometheus_headers",
    "prometheus_settings_from_args",
]

Method = Literal["POST", "GET"]
# What Prometheus may compress its answers with. identity (the default): over loopback or a
# cluster network gzip costs Prometheus and the adapter more CPU than it saves in transfer (a
# 100-sample answer is ~10 kB); gzip is for a backend behind a slow or metered link.
AcceptEncoding = Literal["identity", "gzip"]
ACCEPT_ENCODINGS: tuple[AcceptEncoding, ...] = ("identity", "gzip")
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


class PrometheusConfigError(ConfigError):
    """Settings that cannot work (conflicting auth, a header without a name, a bad URL...)."""


def control_character(text: str) -> str | None:
    """`U+000A at position 21` for the first ASCII control character in `text` (which yarl
    would silently drop from a URL), else None."""
    for position, character in enumerate(text):
        if character < " " or character == "\x7f":
            return f"U+{ord(character):04X} at position {position}"
    return None


def parse_header(text: str) -> tuple[str, str]:
    """`Name=value`, split on the first `=` (`Name=` for an empty value).

    Upstream takes a missing `=` as an empty value; here it is refused: `--prometheus-header
    X-Scope-OrgID` sent an empty tenant, which a typo should not do silently.
    """
    name, equals, value = text.partition("=")
    name = name.strip()
    if not equals:
        # The text itself only when it is a plain name: a mistyped "Authorization: Bearer
        # ..." must not end up in the error (and the log).
        shown = f" {name!r}" if name and _HEADER_NAME.match(name) else ""
        raise PrometheusConfigError(f"--prometheus-header{shown}: expected NAME=VALUE (no '=' "
                                    "found; write NAME= for an empty value)")
    if not name or not _HEADER_NAME.match(name):
        raise PrometheusConfigError(f"--prometheus-header {name!r}: not a header name")
    if "\r" in value or "\n" in value:
        raise PrometheusConfigError(f"--prometheus-header {name}: the value has a line break")
    return name, value


@dataclass(frozen=True)
class PrometheusSettings:
    """Everything the client needs; built from flags by the adapter's settings module."""

    url: str
    headers: tuple[tuple[str, str], ...] = ()
    bearer_token_file: str | None = None
    basic_auth_username: str | None = None
    basic_auth_password_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    timeout: float = 30.0
    method: Method = "POST"
    coalesce_window: float = 1.0
    max_connections: int = 100
    cache_ttl: float = 0.0
    accept_encoding: AcceptEncoding = "identity"

    def __post_init__(self) -> None:
        control = control_character(self.url)
        if control is not None:
            raise PrometheusConfigError(
                f"--prometheus-url contains a control character ({control})")
        try:
            url = URL(self.url)
        except ValueError as error:
            # yarl's reason ("Invalid IPv6 URL"), not the URL: it may carry a password.
            raise PrometheusConfigError(
                f"--prometheus-url is not a valid URL: {error}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise PrometheusConfigError("--prometheus-url must be an http:// or https:// URL")
        if self.method not in ("POST", "GET"):
            raise PrometheusConfigError("--prometheus-verb must be GET or POST")
        if self.accept_encoding not in ACCEPT_ENCODINGS:
            raise PrometheusConfigError("--prometheus-accept-encoding must be identity or gzip")
        if not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise PrometheusConfigError("--prometheus-timeout must be a positive duration")
        if not (self.coalesce_window >= 0 and math.isfinite(self.coalesce_window)):
            raise PrometheusConfigError("the coalesce window must be a non-negative duration")
        if not (self.cache_ttl >= 0 and math.isfinite(self.cache_ttl)):
            raise PrometheusConfigError("--prometheus-cache-ttl must not be negative")
        if self.bearer_token_file and (self.basic_auth_username or self.basic_auth_password_file):
            raise PrometheusConfigError("use either a bearer token file or basic auth, not both")
        if bool(self.basic_auth_username) != bool(self.basic_auth_password_file):
            raise PrometheusConfigError("basic auth needs both a username and a password file")
        if self.basic_auth_username and ":" in self.basic_auth_username:
            raise PrometheusConfigError("a basic auth username cannot contain ':'")
        if bool(self.client_cert_file) != bool(self.client_key_file):
            raise PrometheusConfigError("a client certificate needs both the certificate and key")
        authorizes = self.bearer_token_file or self.basic_auth_username
        for name, value in self.headers:
            parse_header(f"{name}={value}")
            if authorizes and name.lower() == "authorization":
                raise PrometheusConfigError(
                    "an Authorization header conflicts with the bearer token or basic auth")


def add_prometheus_arguments(group: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                             default_timeout: str, url_required: bool = False,
                             token_reread: bool = False) -> None:
    """The flags that connect to a Prometheus-compatible backend: the adapter's, which
    `metricscale replay` takes for the same backend (read them with
    `prometheus_settings_from_args`). `token_reread`: the token file is re-read when it
    changes (a long-running program)."""
    group.add_argument("--prometheus-url", required=url_required,
                       help="base URL of Prometheus, Thanos, Mimir or VictoriaMetrics (its path "
                            "is kept as a prefix)")
    group.add_argument("--prometheus-header", action="append", default=[], metavar="NAME=VALUE",
                       help="header sent with every request (repeatable), e.g. "
                            "X-Scope-OrgID=team")
    group.add_argument("--prometheus-token-file",
                       help="bearer token file" + (", re-read when it changes"
                                                   if token_reread else ""))
    group.add_argument("--prometheus-username", help="basic auth user")
    group.add_argument("--prometheus-password-file", help="basic auth password file")
    group.add_argument("--prometheus-client-tls-cert-file", help="client certificate (PEM)")
    group.add_argument("--prometheus-client-tls-key-file", help="client certificate key (PEM)")
    group.add_argument("--prometheus-ca-file",
                       help="CA bundle that signed Prometheus' certificate")
    group.add_argument("--prometheus-insecure-skip-tls-verify", action="store_true",
                       help="do not verify Prometheus' certificate (testing only)")
    group.add_argument("--prometheus-timeout", default=default_timeout,
                       help="timeout of each query (default %(default)s)")


def prometheus_headers(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The `--prometheus-header` values; PrometheusConfigError names the one to fix."""
    return tuple(parse_header(item) for item in args.prometheus_header)


def prometheus_settings_from_args(args: argparse.Namespace, *,
                                  headers: tuple[tuple[str, str], ...], timeout: float,
                                  method: Method = "POST", cache_ttl: float = 0.0,
                                  accept_encoding: AcceptEncoding = "identity"
                                  ) -> PrometheusSettings:
    """PrometheusSettings from the flags of `add_prometheus_arguments` (the `headers` and
    `timeout` already read, each command wording its own errors); raises
    PrometheusConfigError for settings that cannot work together."""
    return PrometheusSettings(
        url=args.prometheus_url,
        headers=headers,
        bearer_token_file=args.prometheus_token_file,
        basic_auth_username=args.prometheus_username,
        basic_auth_password_file=args.prometheus_password_file,
        client_cert_file=args.prometheus_client_tls_cert_file,
        client_key_file=args.prometheus_client_tls_key_file,
        ca_file=args.prometheus_ca_file,
        insecure_skip_verify=bool(args.prometheus_insecure_skip_tls_verify),
        timeout=timeout,
        method=method,
        cache_ttl=cache_ttl,
        accept_encoding=accept_encoding,
    )


def backend_prometheus_settings(backend: BackendConfig, *, flags: PrometheusSettings,
                                tenant: str | None = None) -> PrometheusSettings:
    """The client settings of a `backends:` entry (of one of its tenants, if it has them).

    What the entry does not set comes from the `--prometheus-*` flags (`timeout`, `verb`,
    `acceptEncoding`) or is
    not the file's to set (coalescing, connection limit, cache); credentials are never inherited
    from the flags, which belong to the `default` backend.
    """
    method: Method = "GET" if (backend.verb or flags.method).upper() == "GET" else "POST"
    encoding: AcceptEncoding = ("gzip" if (backend.accept_encoding or flags.accept_encoding)
                                == "gzip" else "identity")
    return PrometheusSettings(
        url=backend.url,
        headers=tenant_headers(backend, tenant),
        bearer_token_file=backend.bearer_token_file,
        basic_auth_username=backend.basic_auth_username,
        basic_auth_password_file=backend.basic_auth_password_file,
        client_cert_file=backend.client_cert_file,
        client_key_file=backend.client_key_file,
        ca_file=backend.ca_file,
        insecure_skip_verify=backend.insecure_skip_verify,
        timeout=backend.timeout_seconds if backend.timeout_seconds is not None else flags.timeout,
        method=method,
        coalesce_window=flags.coalesce_window,
        max_connections=flags.max_connections,
        cache_ttl=flags.cache_ttl,
        accept_encoding=encoding,
    )
