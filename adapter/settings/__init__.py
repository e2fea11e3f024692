"""The `metricscale adapter` flags, parsed into one frozen settings value (no I/O, no clock).

Flag names follow prometheus-adapter and the generic Kubernetes API server, so a Deployment
written for prometheus-adapter keeps working after the image is swapped; the differences are
listed in docs/reference/flags.md. The flags of the Prometheus connection, shared with
`metricscale replay`, are in `adapter.settings.prometheus` (and importable from here).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

from yarl import URL

from adapter.settings.prometheus import (
    ACCEPT_ENCODINGS,
    AcceptEncoding,
    Method,
    PrometheusConfigError,
    PrometheusSettings,
    add_prometheus_arguments,
    backend_prometheus_settings,
    control_character,
    parse_header,
    prometheus_headers,
    prometheus_settings_from_args,
)
from metricscale.core import durations
from metricscale.core.errors import ConfigError
from metricscale.kube.config import add_kubeconfig_arguments, resolve_kubeconfig
from metricscale.logs import add_logging_arguments

__all__ = [
    "ACCEPT_ENCODINGS",
    "DEFAULT_CERT_DIR",
    "DEFAULT_RELIST_INTERVAL",
    "AcceptEncoding",
    "AdapterSettings",
    "AdapterSettingsError",
    "AuthFlags",
    "DelegationSettings",
    "Method",
    "PrometheusConfigError",
    "PrometheusSettings",
    "ServingSettings",
    "add_arguments",
    "add_prometheus_arguments",
    "backend_prometheus_settings",
    "control_character",
    "parse_header",
    "prometheus_headers",
    "prometheus_settings_from_args",
    "settings_from_args",
]

DEFAULT_SECURE_PORT = 6443
DEFAULT_BIND_ADDRESS = "0.0.0.0"
# The generic apiserver's default, relative to the working directory.
DEFAULT_CERT_DIR = "apiserver.local.config/certificates"
DEFAULT_CERTS_SECRET_NAME = "metricscale-adapter-certs"
DEFAULT_NAMESPACE = "metricscale"
DEFAULT_SERVICE_NAME = "metricscale-adapter"
DEFAULT_APISERVICES = ("v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io",
                       "v1beta1.external.metrics.k8s.io")
DEFAULT_OPTIONAL_APISERVICES = ("v1beta1.metrics.k8s.io",)
# prometheus-adapter's default is 10m; its own manifests use 1m because with 10m a new metric
# (or a failed first pass) stays invisible for ten minutes. A pass here costs one series call per
# distinct seriesQuery and memory that grows with metric names, not series, so 1m is cheap.
DEFAULT_RELIST_INTERVAL = "1m"
DEFAULT_PROMETHEUS_TIMEOUT = "10s"
DEFAULT_ALWAYS_ALLOW_PATHS = ("/healthz", "/readyz", "/livez")
DEFAULT_DELEGATE_TIMEOUT = "10s"
DEFAULT_DELEGATE_TIMEOUT_SECONDS = 10.0


class AdapterSettingsError(ConfigError):
    """Flags of `metricscale adapter`, or the files they name, that cannot be used (alone or
    together); the message names the flag to fix."""


# --------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True)
class ServingSettings:
    """Where and how the HTTPS server listens."""

    port: int = DEFAULT_SECURE_PORT
    bind_address: str = DEFAULT_BIND_ADDRESS
    tls_cert_file: str | None = None
    tls_private_key_file: str | None = None
    cert_dir: str = DEFAULT_CERT_DIR
    # Self-managed certificates (no --tls-cert-file): "auto" is on inside a cluster.
    self_managed_certs: Literal["auto", "on", "off"] = "auto"
    certs_secret_name: str = DEFAULT_CERTS_SECRET_NAME
    certs_namespace: str | None = None  # None: the pod's namespace, else DEFAULT_NAMESPACE
    service_name: str = DEFAULT_SERVICE_NAME
    apiservices: tuple[str, ...] = DEFAULT_APISERVICES
    optional_apiservices: tuple[str, ...] = DEFAULT_OPTIONAL_APISERVICES


@dataclass(frozen=True)
class AuthFlags:
    """The generic apiserver's authn/authz flags, parsed here and interpreted by the auth wiring.

    None/empty means "not given": the in-cluster ConfigMap (or the default) applies.
    """

    client_ca_file: str | None = None
    requestheader_client_ca_file: str | None = None
    requestheader_allowed_names: tuple[str, ...] = ()
    requestheader_username_headers: tuple[str, ...] | None = None
    requestheader_group_headers: tuple[str, ...] | None = None
    requestheader_extra_headers_prefix: tuple[str, ...] | None = None
    requestheader_uid_headers: tuple[str, ...] | None = None
    authentication_kubeconfig: str | None = None
    authentication_skip_lookup: bool = False
    authorization_kubeconfig: str | None = None
    authorization_always_allow_paths: tuple[str, ...] = DEFAULT_ALWAYS_ALLOW_PATHS
    insecure_disable_auth: bool = False
    # Seconds; 0 turns that cache off (the generic apiserver's defaults are 10s each).
    token_cache_ttl: Decimal = Decimal(10)
    authorized_cache_ttl: Decimal = Decimal(10)
    unauthorized_cache_ttl: Decimal = Decimal(10)


@dataclass(frozen=True)
class DelegationSettings:
    """Where requests for metrics our rules do not serve go (`--delegate-*-to`), and how.

    One CA bundle and one front-proxy client certificate serve both targets (a bundle may hold
    several CAs when the two adapters' certificates have different issuers).
    """

    external_url: str | None = None
    custom_url: str | None = None
    ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    timeout: float = DEFAULT_DELEGATE_TIMEOUT_SECONDS

    @property
    def enabled(self) -> bool:
        return bool(self.external_url or self.custom_url)


@dataclass(frozen=True)
class AdapterSettings:
    """Everything `metricscale adapter` was asked to do."""

    config_file: str | None
    prometheus: PrometheusSettings | None
    serving: ServingSettings = field(default_factory=ServingSettings)
    kubeconfig: str | None = None
    context: str | None = None
    relist_interval: Decimal = Decimal(60)
    max_age: Decimal = Decimal(60)
    check_config: str | None = None
    auth: AuthFlags = field(default_factory=AuthFlags)
    log_format: str = "text"
    log_level: str = "info"
    delegation: DelegationSettings = field(default_factory=DelegationSettings)


# --------------------------------------------------------------------------------------------
# argparse


def _comma_list(text: str) -> tuple[str, ...]:
    """A Go `StringSlice` flag value: comma-separated, each item trimmed."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _listed(value: str | tuple[str, ...]) -> tuple[str, ...]:
    """argparse applies `type` to a string default; a given value is already a tuple."""
    return _comma_list(value) if isinstance(value, str) else value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every flag of `metricscale adapter` on `parser`, group by group."""
    _add_serving_arguments(parser)
    _add_certificate_arguments(parser)
    _add_kubernetes_and_rules_arguments(parser)
    _add_prometheus_flags(parser)
    _add_auth_arguments(parser)
    _add_delegation_arguments(parser)
    add_logging_arguments(parser.add_argument_group("logging"))


def _add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    """Where and with which certificate the HTTPS server listens."""
    serving = parser.add_argument_group("serving")
    serving.add_argument("--secure-port", type=int, default=DEFAULT_SECURE_PORT,
                         help="HTTPS port (default %(default)s)")
    serving.add_argument("--bind-address", default=DEFAULT_BIND_ADDRESS,
                         help="address to listen on (default %(default)s)")
    serving.add_argument("--tls-cert-file", help="serving certificate (PEM, chain allowed); "
                         "reloaded when it changes on disk")
    serving.add_argument("--tls-private-key-file", help="private key of --tls-cert-file")
    serving.add_argument("--cert-dir", default=DEFAULT_CERT_DIR,
                         help="where a self-signed pair is kept when no --tls-cert-file is given "
                              "(default %(default)s)")


def _add_certificate_arguments(parser: argparse.ArgumentParser) -> None:
    """The self-managed certificates (no --tls-cert-file, in a cluster)."""
    certs = parser.add_argument_group(
        "self-managed certificates",
        "without --tls-cert-file, inside a cluster, the adapter keeps its own CA and serving "
        "certificate in a Secret, writes the pair into --cert-dir, renews it before expiry "
        "and sets the caBundle of its APIServices")
    certs.add_argument("--self-managed-certs", choices=("auto", "on", "off"), default="auto",
                       help="auto (default): on when no --tls-cert-file is given and the "
                            "adapter runs in a cluster; off: a throw-away self-signed pair")
    certs.add_argument("--certs-secret-name", default=DEFAULT_CERTS_SECRET_NAME,
                       help="Secret holding the CA and serving pair (default %(default)s)")
    certs.add_argument("--certs-namespace",
                       help="namespace of that Secret and of the Service (default: the pod's "
                            f"namespace, else {DEFAULT_NAMESPACE})")
    certs.add_argument("--service-name", default=DEFAULT_SERVICE_NAME,
                       help="the adapter's Service, named in the certificate (default "
                            "%(default)s)")
    certs.add_argument("--apiservices", type=_comma_list,
                       default=",".join(DEFAULT_APISERVICES),
                       help="APIServices whose caBundle is set (default %(default)s)")
    certs.add_argument("--optional-apiservices", type=_comma_list,
                       default=",".join(DEFAULT_OPTIONAL_APISERVICES),
                       help="APIServices whose caBundle is set if they exist (default "
                            "%(default)s)")


def _add_kubernetes_and_rules_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster to read objects from, and the rule file with its discovery."""
    kube = parser.add_argument_group("kubernetes")
    add_kubeconfig_arguments(kube, purpose="for listing objects and discovery")
    kube.add_argument("--lister-kubeconfig",
                      help="prometheus-adapter's name for --kubeconfig (give one of them)")

    rules = parser.add_argument_group("rules and discovery")
    rules.add_argument("--config", help="prometheus-adapter rule file (rules, externalRules, "
                                        "resourceRules)")
    rules.add_argument("--metrics-relist-interval", default=DEFAULT_RELIST_INTERVAL,
                       help="how often series are rediscovered (default %(default)s; "
                            "prometheus-adapter: 10m)")
    rules.add_argument("--metrics-max-age", default=None,
                       help="lookback of each discovery pass; at least the relist interval "
                            "(default: the relist interval)")
    rules.add_argument("--check-config", metavar="FILE",
                       help="validate FILE and exit (0 valid, 1 not); with --prometheus-url, also "
                            "print each rule's discovered metrics and a sample query")


def _add_prometheus_flags(parser: argparse.ArgumentParser) -> None:
    """The `default` backend: the shared connection flags and the adapter's own."""
    prom = parser.add_argument_group("prometheus")
    add_prometheus_arguments(prom, default_timeout=DEFAULT_PROMETHEUS_TIMEOUT,
                             token_reread=True)
    prom.add_argument("--prometheus-verb", default="POST", type=str.upper,
                      choices=["POST", "GET"],
                      help="HTTP method of queries (default POST: no URL length limit)")
    prom.add_argument("--prometheus-accept-encoding", default="identity", type=str.lower,
                      choices=ACCEPT_ENCODINGS,
                      help="what Prometheus may compress its answers with (default identity: "
                           "on loopback or in a cluster gzip costs more CPU than it saves; gzip "
                           "for a backend behind a slow link; a backends: entry may set its own "
                           "acceptEncoding)")
    prom.add_argument("--prometheus-cache-ttl", default="0",
                      help="reuse a query's answer for this long (default 0: off; e.g. 5s when "
                           "several HPAs read one metric within a scrape interval)")


def _add_auth_arguments(parser: argparse.ArgumentParser) -> None:
    """The generic apiserver's authentication and authorization flags."""
    auth = parser.add_argument_group("authentication and authorization")
    auth.add_argument("--client-ca-file",
                      help="CA of plain client certificates (default: from the ConfigMap "
                           "kube-system/extension-apiserver-authentication)")
    auth.add_argument("--requestheader-client-ca-file",
                      help="CA of the front proxy's client certificate (default: from the "
                           "ConfigMap)")
    auth.add_argument("--requestheader-allowed-names", type=_comma_list, default=(),
                      help="CNs allowed as the front proxy, comma-separated (empty: any)")
    auth.add_argument("--requestheader-username-headers", type=_comma_list, default=None,
                      help="default x-remote-user")
    auth.add_argument("--requestheader-group-headers", type=_comma_list, default=None,
                      help="default x-remote-group")
    auth.add_argument("--requestheader-extra-headers-prefix", type=_comma_list, default=None,
                      help="default x-remote-extra-")
    auth.add_argument("--requestheader-uid-headers", type=_comma_list, default=None,
                      help="default none")
    auth.add_argument("--authentication-kubeconfig",
                      help="cluster for TokenReviews and the ConfigMap (default: --kubeconfig)")
    auth.add_argument("--authentication-skip-lookup", action="store_true",
                      help="do not read the ConfigMap")
    auth.add_argument("--authorization-kubeconfig",
                      help="cluster for SubjectAccessReviews (default: that of "
                           "--authentication-kubeconfig)")
    auth.add_argument("--authorization-always-allow-paths", type=_comma_list,
                      default=DEFAULT_ALWAYS_ALLOW_PATHS,
                      help="paths allowed without a review; a trailing * is a prefix "
                           "(default /healthz,/readyz,/livez)")
    auth.add_argument("--authentication-token-webhook-cache-ttl", default="10s",
                      help="how long TokenReview answers are cached (default %(default)s)")
    auth.add_argument("--authorization-webhook-cache-authorized-ttl", default="10s",
                      help="how long allowing SubjectAccessReview answers are cached "
                           "(default %(default)s)")
    auth.add_argument("--authorization-webhook-cache-unauthorized-ttl", default="10s",
                      help="how long denying SubjectAccessReview answers are cached "
                           "(default %(default)s)")
    auth.add_argument("--insecure-disable-auth", action="store_true",
                      help="local development only: no authentication, no authorization")


def _add_delegation_arguments(parser: argparse.ArgumentParser) -> None:
    """Where requests for metrics our rules do not serve go."""
    delegate = parser.add_argument_group(
        "delegation",
        "requests for metrics our rules do not serve go to another metrics adapter (e.g. "
        "KEDA's), which sees the caller as it would behind kube-apiserver; our own metrics win "
        "a name clash")
    delegate.add_argument("--delegate-external-to", metavar="URL",
                          help="https:// Service URL of the adapter serving the other "
                               "external.metrics.k8s.io metrics, e.g. "
                               "https://keda-operator-metrics-apiserver.keda.svc:443")
    delegate.add_argument("--delegate-custom-to", metavar="URL",
                          help="https:// Service URL of the adapter serving the other "
                               "custom.metrics.k8s.io metrics")
    delegate.add_argument("--delegate-ca-file",
                          help="CA bundle that signed the delegates' serving certificates "
                               "(default: the system's trust store)")
    delegate.add_argument("--delegate-client-cert-file",
                          help="front-proxy client certificate presented to the delegates "
                               "(signed by a CA in their requestheader-client-ca-file)")
    delegate.add_argument("--delegate-client-key-file",
                          help="private key of --delegate-client-cert-file")
    delegate.add_argument("--delegate-timeout", default=DEFAULT_DELEGATE_TIMEOUT,
                          help="timeout of each delegated request (default %(default)s; "
                               "discovery waits at most 2s)")


def _duration_flag(name: str, text: str, *, zero_allowed: bool = False) -> Decimal:
    """A Go duration flag's value; a TTL may be 0 (its cache off), an interval or timeout not."""
    try:
        value = durations.parse_go_duration(text)
    except durations.DurationError:
        raise AdapterSettingsError(f"{name}: {durations.flag_message(text)}") from None
    if value < 0 or (value == 0 and not zero_allowed):
        bound = "must not be negative" if zero_allowed else "must be positive"
        raise AdapterSettingsError(f"{name} {bound}, got {text!r}")
    return value


def _ttl_flag(name: str, text: str) -> Decimal:
    return _duration_flag(name, text, zero_allowed=True)


def _prometheus_settings(args: argparse.Namespace) -> PrometheusSettings | None:
    if not args.prometheus_url:
        return None
    try:
        headers = prometheus_headers(args)
        method: Method = "GET" if args.prometheus_verb == "GET" else "POST"
        timeout = float(_duration_flag("--prometheus-timeout", args.prometheus_timeout))
        cache_ttl = float(_ttl_flag("--prometheus-cache-ttl", args.prometheus_cache_ttl))
        encoding: AcceptEncoding = ("gzip" if args.prometheus_accept_encoding == "gzip"
                                    else "identity")
        return prometheus_settings_from_args(args, headers=headers, timeout=timeout,
                                             method=method, cache_ttl=cache_ttl,
                                             accept_encoding=encoding)
    except PrometheusConfigError as error:
        raise AdapterSettingsError(str(error)) from None


def settings_from_args(args: argparse.Namespace) -> AdapterSettings:
    """Check the flags together; raises AdapterSettingsError naming what to fix."""
    relist = _duration_flag("--metrics-relist-interval", args.metrics_relist_interval)
    max_age = relist
    if args.metrics_max_age is not None:
        max_age = _duration_flag("--metrics-max-age", args.metrics_max_age)
        if max_age < relist:
            raise AdapterSettingsError(
                f"--metrics-max-age ({args.metrics_max_age}) must not be less than "
                f"--metrics-relist-interval ({args.metrics_relist_interval}): series seen "
                "between two passes would be missed")
    prometheus = _prometheus_settings(args)
    if args.kubeconfig and args.lister_kubeconfig and args.kubeconfig != args.lister_kubeconfig:
        raise AdapterSettingsError("--kubeconfig and --lister-kubeconfig name different files; "
                            "give one of them")
    kubeconfig = resolve_kubeconfig(args.kubeconfig or args.lister_kubeconfig or None)
    if args.check_config is None:
        if not args.config:
            raise AdapterSettingsError("no metrics discovery configuration file specified "
                                "(make sure to use --config)")
        if prometheus is None:
            raise AdapterSettingsError("--prometheus-url is required")
    if bool(args.tls_cert_file) != bool(args.tls_private_key_file):
        raise AdapterSettingsError("--tls-cert-file and --tls-private-key-file go together")
    if not 0 < args.secure_port < 65536:
        raise AdapterSettingsError(f"--secure-port {args.secure_port} is not a TCP port")
    serving = ServingSettings(
        port=args.secure_port, bind_address=args.bind_address,
        tls_cert_file=args.tls_cert_file, tls_private_key_file=args.tls_private_key_file,
        cert_dir=args.cert_dir, self_managed_certs=args.self_managed_certs,
        certs_secret_name=args.certs_secret_name, certs_namespace=args.certs_namespace,
        service_name=args.service_name, apiservices=_listed(args.apiservices),
        optional_apiservices=_listed(args.optional_apiservices))
    if serving.self_managed_certs == "on" and serving.tls_cert_file:
        raise AdapterSettingsError("--self-managed-certs=on and --tls-cert-file exclude each other")
    auth = AuthFlags(
        client_ca_file=args.client_ca_file,
        requestheader_client_ca_file=args.requestheader_client_ca_file,
        requestheader_allowed_names=tuple(args.requestheader_allowed_names),
        requestheader_username_headers=args.requestheader_username_headers,
        requestheader_group_headers=args.requestheader_group_headers,
        requestheader_extra_headers_prefix=args.requestheader_extra_headers_prefix,
        requestheader_uid_headers=args.requestheader_uid_headers,
        authentication_kubeconfig=args.authentication_kubeconfig,
        authentication_skip_lookup=bool(args.authentication_skip_lookup),
        authorization_kubeconfig=args.authorization_kubeconfig,
        authorization_always_allow_paths=tuple(args.authorization_always_allow_paths),
        insecure_disable_auth=bool(args.insecure_disable_auth),
        token_cache_ttl=_ttl_flag("--authentication-token-webhook-cache-ttl",
                                  args.authentication_token_webhook_cache_ttl),
        authorized_cache_ttl=_ttl_flag("--authorization-webhook-cache-authorized-ttl",
                                       args.authorization_webhook_cache_authorized_ttl),
        unauthorized_cache_ttl=_ttl_flag("--authorization-webhook-cache-unauthorized-ttl",
                                         args.authorization_webhook_cache_unauthorized_ttl),
    )
    delegation = _delegation_settings(args)
    return AdapterSettings(
        config_file=args.config, prometheus=prometheus, serving=serving,
        kubeconfig=kubeconfig, context=args.context, relist_interval=relist, max_age=max_age,
        check_config=args.check_config, auth=auth, log_format=args.log_format,
        log_level=args.log_level, delegation=delegation)


def _delegate_url(flag: str, value: str | None) -> str | None:
    if not value:
        return None
    control = control_character(value)
    if control is not None:
        raise AdapterSettingsError(f"{flag} contains a control character ({control})")
    try:
        url = URL(value)
    except ValueError as error:
        raise AdapterSettingsError(f"{flag} is not a valid URL: {error}") from None
    if url.scheme != "https" or not url.host:
        raise AdapterSettingsError(f"{flag} must be an https:// URL, e.g. "
                            "https://keda-operator-metrics-apiserver.keda.svc:443")
    if url.user or url.password or url.raw_query_string or url.raw_fragment or \
            url.raw_path not in ("", "/"):
        raise AdapterSettingsError(f"{flag} must be scheme, host and port only (no path, query or "
                            "credentials): the request's own path is appended")
    return str(url.origin())


def _delegation_settings(args: argparse.Namespace) -> DelegationSettings:
    external = _delegate_url("--delegate-external-to", args.delegate_external_to)
    custom = _delegate_url("--delegate-custom-to", args.delegate_custom_to)
    cert, key = args.delegate_client_cert_file, args.delegate_client_key_file
    if bool(cert) != bool(key):
        raise AdapterSettingsError("--delegate-client-cert-file and --delegate-client-key-file go "
                            "together")
    timeout = _duration_flag("--delegate-timeout", args.delegate_timeout)
    if not (external or custom):
        given = [flag for flag, value in (("--delegate-ca-file", args.delegate_ca_file),
                                          ("--delegate-client-cert-file", cert))
                 if value]
        if given:
            raise AdapterSettingsError(f"{given[0]} needs --delegate-external-to or "
                                "--delegate-custom-to")
        return DelegationSettings()
    if not cert:
        raise AdapterSettingsError("delegation needs --delegate-client-cert-file and "
                            "--delegate-client-key-file: the delegate authenticates this "
                            "adapter as a front proxy, by its client certificate")
    return DelegationSettings(external_url=external, custom_url=custom,
                              ca_file=args.delegate_ca_file or None, client_cert_file=cert,
                              client_key_file=key, timeout=float(timeout))


def parse_settings(argv: Sequence[str]) -> AdapterSettings:
    """Parse a command line (without the subcommand) into settings; for tests and tools."""
    parser = argparse.ArgumentParser(prog="metricscale adapter")
    add_arguments(parser)
    return settings_from_args(parser.parse_args(list(argv)))
