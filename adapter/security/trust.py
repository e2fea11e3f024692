"""The authentication configuration in force: the flags' CAs and headers merged over the
`kube-system/extension-apiserver-authentication` ConfigMap's, each change parsed whole before
it is used and handed to the serving TLS context."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from adapter.auth.configuration import (
    DEFAULT_EXTRA_HEADERS_PREFIXES,
    DEFAULT_GROUP_HEADERS,
    DEFAULT_USERNAME_HEADERS,
    AuthConfigError,
    AuthenticationConfig,
    authentication_from_flags,
    merge_authentication_config,
    needs_cluster_lookup,
    parse_extension_apiserver_authentication,
)
from adapter.kube.objects import AUTHENTICATION_CONFIGMAP, AUTHENTICATION_NAMESPACE
from adapter.security.tls import (
    ReloadingServerContext,
    TLSConfigError,
    TrustBundle,
    client_ca_pems,
    load_trust_bundle,
)
from adapter.settings import AuthFlags
from metricscale.core.errors import ConfigError
from metricscale.files import FileError, read_bytes

__all__ = ["AuthenticationSource", "SecurityConfigError"]

logger = logging.getLogger(__name__)


class SecurityConfigError(ConfigError):
    """Authentication flags or files that cannot be used; the message names what to fix."""


def _read_pem_file(flag: str, path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        return read_bytes(path)
    except FileError as error:
        raise SecurityConfigError(f"{flag} {path}: {error.strerror or error.problem}") from None


def _flags_config(flags: AuthFlags) -> AuthenticationConfig:
    try:
        return authentication_from_flags(
            client_ca_pem=_read_pem_file("--client-ca-file", flags.client_ca_file),
            requestheader_client_ca_pem=_read_pem_file(
                "--requestheader-client-ca-file", flags.requestheader_client_ca_file),
            requestheader_allowed_names=flags.requestheader_allowed_names,
            requestheader_username_headers=(flags.requestheader_username_headers
                                            or DEFAULT_USERNAME_HEADERS),
            requestheader_uid_headers=flags.requestheader_uid_headers or (),
            requestheader_group_headers=(flags.requestheader_group_headers
                                         or DEFAULT_GROUP_HEADERS),
            requestheader_extra_headers_prefix=(flags.requestheader_extra_headers_prefix
                                                or DEFAULT_EXTRA_HEADERS_PREFIXES),
        )
    except AuthConfigError as error:
        raise SecurityConfigError(str(error)) from None


@dataclass(frozen=True)
class _Trust:
    """A configuration with its CA bundles parsed once (not per request)."""

    config: AuthenticationConfig
    request_header_ca: TrustBundle | None
    client_ca: TrustBundle | None


def _trust(config: AuthenticationConfig) -> _Trust:
    return _Trust(
        config=config,
        request_header_ca=load_trust_bundle(
            config.request_header.ca_pem if config.request_header else None),
        client_ca=load_trust_bundle(config.client_ca_pem))


class AuthenticationSource:
    """The authentication configuration in force: flags, merged over the ConfigMap's values.

    Flags override the ConfigMap part by part (client CA; front-proxy block). Each change is
    parsed fully before it is used: a ConfigMap or CA file that does not parse keeps the
    previous configuration (logged). On every change the TLS context is given the new CA
    bundles, so new connections are verified against them without a restart.
    """

    def __init__(self, *, flags: AuthFlags, tls: ReloadingServerContext | None) -> None:
        self._flags = flags
        self._tls = tls
        self._flag_config = _flags_config(flags)
        self.needs_lookup = needs_cluster_lookup(
            self._flag_config, skip_lookup=flags.authentication_skip_lookup)
        self._cluster: AuthenticationConfig | None = None
        self._lookup_synced: Callable[[], bool] = lambda: False
        self.generation = 0
        try:
            self._trust = self._install(merge_authentication_config(self._flag_config, None))
        except TLSConfigError as error:
            raise SecurityConfigError(str(error)) from None

    @property
    def config(self) -> AuthenticationConfig:
        return self._trust.config

    @property
    def request_header_ca(self) -> TrustBundle | None:
        return self._trust.request_header_ca

    @property
    def client_ca(self) -> TrustBundle | None:
        return self._trust.client_ca

    @property
    def loaded(self) -> bool:
        """Ready to authenticate as configured: no lookup needed, or the ConfigMap was read."""
        return not self.needs_lookup or self._lookup_synced()

    def follow_lookup(self, synced: Callable[[], bool]) -> None:
        """Where `loaded` learns whether the ConfigMap has been read (found or not)."""
        self._lookup_synced = synced

    def _install(self, config: AuthenticationConfig) -> _Trust:
        trust = _trust(config)  # raises TLSConfigError before anything changes
        if self._tls is not None:
            self._tls.set_client_cas(client_ca_pems(config))
        self.generation += 1
        return trust

    def _apply(self, config: AuthenticationConfig, *, what: str) -> None:
        if config == self._trust.config:
            return
        try:
            self._trust = self._install(config)
        except TLSConfigError as error:
            logger.error("keeping the previous authentication configuration: %s: %s",
                         what, error)
            return
        header = config.request_header
        allowed = "-"
        if header is not None:
            allowed = ",".join(header.allowed_names) or "any"
        logger.info(
            "authentication configuration from %s: request-header CA %s (allowed names %s), "
            "client CA %s", what, "set" if header else "none", allowed,
            "set" if config.client_ca_pem else "none")

    def apply_configmap(self, data: Mapping[str, str] | None) -> None:
        """The informer's callback: the ConfigMap's data, or None when it was deleted."""
        name = f"{AUTHENTICATION_NAMESPACE}/{AUTHENTICATION_CONFIGMAP}"
        if data is None:
            # kube-apiserver rewrites it within a minute; dropping trust meanwhile would only
            # turn the aggregator away.
            logger.warning("%s was deleted; keeping the configuration read from it", name)
            return
        try:
            cluster = parse_extension_apiserver_authentication(data)
        except AuthConfigError as error:
            logger.error("ignoring an unusable %s: %s", name, error)
            return
        self._cluster = cluster
        self._apply(merge_authentication_config(self._flag_config, cluster), what=name)

    @property
    def has_ca_files(self) -> bool:
        return bool(self._flags.client_ca_file or self._flags.requestheader_client_ca_file)

    def reload_files(self) -> bool:
        """Re-read --client-ca-file / --requestheader-client-ca-file; True if that changed them."""
        if not self.has_ca_files:
            return False
        try:
            flag_config = _flags_config(self._flags)
        except SecurityConfigError as error:
            logger.warning("keeping the previous CA files: %s", error)
            return False
        if flag_config == self._flag_config:
            return False
        self._flag_config = flag_config
        before = self.generation
        self._apply(merge_authentication_config(flag_config, self._cluster), what="CA files")
        return self.generation != before
