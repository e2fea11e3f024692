"""`metricscale adapter`: the composition root (flags, logging, TLS, serving) and --check-config.

Everything that touches the event loop is built inside `asyncio.run(...)`. SIGTERM and SIGINT
make /readyz fail at once, then the server stops accepting, lets requests in flight finish
(bounded by `_SHUTDOWN_GRACE_SECONDS`), and closes every client in reverse order of opening.
A background task that dies stops the process with exit code 1. SIGHUP reloads the rule file
(adapter.http.reloading), which is also reloaded when it changes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import ssl
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import aiohttp
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry
from yarl import URL

from adapter.http.app import HEALTH_KEY, RELOADER_KEY, create_app, mark_shutting_down
from adapter.http.delegate import DelegateConfigError
from adapter.http.reloading import read_config_bytes, read_config_file
from adapter.kube.catalog import ClusterCatalog
from adapter.kube.objects import USER_AGENT
from adapter.prometheus.backends import BackendClients
from adapter.prometheus.relisting import RelistFailed, relist_once
from adapter.prometheus.tenancy import MAX_NAMESPACE_TENANTS
from adapter.rules.config import (
    DEFAULT_BACKEND,
    AdapterConfig,
    BackendConfig,
    ConfigError,
    parse_config,
)
from adapter.rules.query import QueryError, build_custom_query, build_external_query
from adapter.rules.registry import MetricRegistry, merge_registries
from adapter.rules.resources import ResourceCatalog, builtin_catalog
from adapter.rules.tenants import backend_tenants, follows_namespaces
from adapter.security.delegation import SecurityConfigError, build_security
from adapter.security.selfcerts import SelfCertsConfig, SelfManagedCertificates
from adapter.security.tls import (
    ReloadingServerContext,
    TLSConfigError,
    ensure_self_signed_certificate,
)
from adapter.settings import (
    DEFAULT_NAMESPACE,
    AdapterSettings,
    AdapterSettingsError,
    PrometheusConfigError,
    add_arguments,
    settings_from_args,
)
from metricscale.core.selectors import Selector
from metricscale.files import FileError, read_text
from metricscale.kube.config import open_configuration
from metricscale.kube.errors import KubeConfigError, KubeError
from metricscale.kube.http import connect
from metricscale.logs import configure_logging
from metricscale.serving import StatusAppRunner
from metricscale.tasks import start_guarded_task

__all__ = ["add_arguments", "check_config", "run", "serve"]

logger = logging.getLogger(__name__)

_SHUTDOWN_GRACE_SECONDS = 5.0
_CERTIFICATE_RELOAD_SECONDS = 10.0
_SELF_CERTS_SYNC_SECONDS = 60.0
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_SAMPLE_NAMESPACE = "<namespace>"
_SAMPLE_NAME = "<name>"


# --------------------------------------------------------------------------------------------
# Serving


def _load_config(path: str) -> AdapterConfig:
    """Read and parse the rule file; raises ConfigError (or FileError) for the caller to report.

    The same function reads each reloaded version, so a reload fails exactly as start-up would.
    """
    return read_config_file(path)


def _tls_context(settings: AdapterSettings) -> ReloadingServerContext:
    """Files mode: --tls-cert-file, else a throw-away self-signed pair in --cert-dir."""
    serving = settings.serving
    if serving.tls_cert_file and serving.tls_private_key_file:
        cert, key = Path(serving.tls_cert_file), Path(serving.tls_private_key_file)
    else:
        cert_dir = Path(serving.cert_dir)
        cert_dir.mkdir(parents=True, exist_ok=True)
        cert, key = ensure_self_signed_certificate(cert_dir, now=datetime.now(UTC))
        logger.warning("no --tls-cert-file given: serving a self-signed certificate from %s",
                       cert_dir)
    return ReloadingServerContext(cert_file=cert, key_file=key)


def _self_managed(settings: AdapterSettings) -> bool:
    serving = settings.serving
    if serving.tls_cert_file or serving.self_managed_certs == "off":
        return False
    return serving.self_managed_certs == "on" or bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _pod_namespace() -> str:
    try:
        return read_text(str(_SERVICE_ACCOUNT_NAMESPACE)).strip() or DEFAULT_NAMESPACE
    except FileError:
        return DEFAULT_NAMESPACE


def self_certs_config(settings: AdapterSettings) -> SelfCertsConfig:
    serving = settings.serving
    return SelfCertsConfig(
        namespace=serving.certs_namespace or _pod_namespace(),
        secret_name=serving.certs_secret_name, service_name=serving.service_name,
        cert_dir=Path(serving.cert_dir), apiservices=serving.apiservices,
        optional_apiservices=serving.optional_apiservices)


async def _keep_certificates(certificates: SelfManagedCertificates) -> None:
    """Follow the Secret (another replica's renewal) and renew before expiry."""
    while True:
        await asyncio.sleep(_SELF_CERTS_SYNC_SECONDS)
        try:
            await certificates.reconcile_once(now=datetime.now(UTC))
        except (KubeError, OSError, aiohttp.ClientError, TimeoutError) as error:
            logger.warning("keeping the current serving certificate: %s", error)


async def _reload_certificates(context: ReloadingServerContext) -> None:
    while True:
        await asyncio.sleep(_CERTIFICATE_RELOAD_SECONDS)
        try:
            context.reload_if_changed()
        except TLSConfigError as error:
            logger.warning("keeping the current serving certificate: %s", error)


async def serve(settings: AdapterSettings, config: AdapterConfig, *,
                started: asyncio.Event | None = None) -> int:
    """Serve until SIGTERM/SIGINT (0) or until a background task fails (1)."""
    exits = contextlib.AsyncExitStack()
    async with exits:
        return await _serve(settings, config, started=started, exits=exits)


class _CannotStart(Exception):
    """A start-up failure, already logged: the process exits with 1."""


async def _serving_tls(settings: AdapterSettings, exits: contextlib.AsyncExitStack,
                       ) -> tuple[ReloadingServerContext, SelfManagedCertificates | None]:
    """The serving TLS context, from files or from the self-managed certificates."""
    try:
        if not _self_managed(settings):
            return _tls_context(settings), None
        http = await exits.enter_async_context(
            connect(kubeconfig=settings.kubeconfig, context=settings.context,
                    user_agent=USER_AGENT))
        certificates = SelfManagedCertificates(http, self_certs_config(settings))
        await certificates.reconcile_once(now=datetime.now(UTC))
        cert, key = certificates.files()
        return ReloadingServerContext(cert_file=cert, key_file=key), certificates
    except (KubeError, aiohttp.ClientError, TimeoutError) as error:
        logger.error("cannot set up self-managed certificates: %s", error)
        raise _CannotStart from None
    except (TLSConfigError, OSError) as error:
        logger.error("cannot serve TLS: %s", error)
        raise _CannotStart from None


async def _listen(runner: StatusAppRunner, settings: AdapterSettings,
                  tls: ReloadingServerContext) -> None:
    """Open the application (its cleanup contexts) and listen."""
    try:
        await runner.setup()
    except (KubeConfigError, PrometheusConfigError, DelegateConfigError) as error:
        logger.error("%s", error)
        raise _CannotStart from None
    serving = settings.serving
    site = web.TCPSite(runner, serving.bind_address, serving.port,
                       ssl_context=tls.listening_context, reuse_address=True)
    try:
        await site.start()
    except OSError as error:
        logger.error("cannot listen on %s:%d: %s", serving.bind_address, serving.port, error)
        raise _CannotStart from None


async def _cancelled(*tasks: asyncio.Task[None] | None) -> None:
    for task in tasks:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _serve(settings: AdapterSettings, config: AdapterConfig, *,
                 started: asyncio.Event | None, exits: contextlib.AsyncExitStack) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    failures: list[BaseException] = []

    def on_fatal(error: BaseException) -> None:
        logger.critical("stopping: a background task failed: %r", error)
        failures.append(error)
        stop.set()

    try:
        tls, certificates = await _serving_tls(settings, exits)
    except _CannotStart:
        return 1
    try:
        security = build_security(settings, tls=tls)
    except SecurityConfigError as error:
        logger.error("cannot set up authentication: %s", error)
        return 1
    # The object caches live as long as the process, like what is frozen once listening
    # (below): out of the collector's generations, full collections no longer walk their
    # thousands of pods (measured: about 4 ms of collection per 1,000-pod metrics.k8s.io
    # list). They hold no cycles, so what leaves them later is still freed.
    app = create_app(settings=settings, config=config, on_fatal=on_fatal,
                     authenticator=security.authenticator, authorizer=security.authorizer,
                     on_caches_filled=gc.freeze)
    security.install(app, health=app[HEALTH_KEY], on_fatal=on_fatal)
    runner = StatusAppRunner(app, handle_signals=False,
                             shutdown_timeout=_SHUTDOWN_GRACE_SECONDS, access_log=None)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        try:
            await _listen(runner, settings, tls)
        except _CannotStart:
            return 1
        reloader = app.get(RELOADER_KEY)
        if reloader is not None:
            # SIGHUP reloads the rule file now, as it does for Prometheus.
            loop.add_signal_handler(signal.SIGHUP, reloader.request_reload)
        # Everything built so far (modules, config, catalog, app) lives as long as the process;
        # moving it out of the collector's generations keeps full collections from walking it,
        # which measured as rare multi-millisecond pauses at p99 under load.
        gc.freeze()
        reload_task = start_guarded_task(_reload_certificates(tls),
                                         name="serving certificate reload", on_failure=on_fatal)
        keep_task = None if certificates is None else start_guarded_task(
            _keep_certificates(certificates), name="self-managed certificates",
            on_failure=on_fatal)
        logger.info("serving custom.metrics.k8s.io and external.metrics.k8s.io on https://%s:%d",
                    settings.serving.bind_address, settings.serving.port)
        if started is not None:
            started.set()
        await stop.wait()
        logger.info("shutting down")
        mark_shutting_down(app)
        await _cancelled(reload_task, keep_task)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(signum)
        await runner.cleanup()
        # A process that serves more than once (tests, the benchmark) must not pin each
        # server's objects forever.
        gc.unfreeze()
    return 1 if failures else 0


# --------------------------------------------------------------------------------------------
# --check-config


async def _catalog(settings: AdapterSettings, out: TextIO) -> ResourceCatalog:
    if not settings.kubeconfig:
        return builtin_catalog()
    try:
        async with connect(kubeconfig=settings.kubeconfig, context=settings.context,
                           user_agent=USER_AGENT) as http:
            return (await ClusterCatalog(http).refresh()).catalog
    except KubeError as error:
        print(f"cannot discover the cluster's resources ({error}); using the built-in list",
              file=out)
        return builtin_catalog()


def _sample_queries(registry: MetricRegistry, config: AdapterConfig) -> dict[str, list[str]]:
    """Per rule path: its discovered metrics, each with a sample query for placeholder names."""
    lines: dict[str, list[str]] = {rule.path: [] for rule in
                                   (*config.rules, *config.external_rules)}
    for key in registry.custom_metrics():
        entry = registry.custom[key]
        scope = "namespaced" if key.namespaced else "cluster-scoped"
        try:
            built = build_custom_query(
                rule=entry.rule, mapper=entry.mapper, series=entry.series,
                resource=key.resource,
                namespace=_SAMPLE_NAMESPACE if key.namespaced else None,
                names=[_SAMPLE_NAME], metric_selector=Selector())
            query = built.promql
        except QueryError as error:
            query = f"(cannot build a query: {error})"
        lines[entry.rule.path].append(
            f"  {key.api_name} ({scope}, series {entry.series})\n      {query}")
    for name in sorted(registry.external):
        external = registry.external[name]
        try:
            query = build_external_query(
                rule=external.rule, mapper=external.mapper, series=external.series,
                namespace=_SAMPLE_NAMESPACE, metric_selector=Selector())
        except QueryError as error:
            query = f"(cannot build a query: {error})"
        lines[external.rule.path].append(
            f"  {external.metric} (external, series {external.series})\n      {query}")
    return lines


def _empty_yaml(text: str) -> bool:
    try:
        return yaml.safe_load(text) is None
    except (yaml.YAMLError, RecursionError):
        return False  # parse_config reports the problem with its position


def _rules_text_of(text: str, *, path: str, out: TextIO) -> str | None:
    """The rule file inside `text`: itself, or a ConfigMap's `data.config.yaml` (said so).

    None (after printing why) for a ConfigMap without that key: people pass the manifest's
    ConfigMap, and "field apiVersion not found" would not tell them what to do.
    """
    try:
        document = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError):
        return text  # parse_config reports what is wrong with it, field and line
    if not (isinstance(document, dict) and document.get("kind") == "ConfigMap"):
        return text
    name = (document.get("metadata") or {}).get("name", "")
    data = document.get("data") or {}
    rules = data.get("config.yaml") if isinstance(data, dict) else None
    if not isinstance(rules, str):
        print(f"{path}: error: this is a ConfigMap ({name}) without data.config.yaml: pass the "
              "rule file itself, or a ConfigMap that holds it under data.config.yaml", file=out)
        return None
    print(f"{path}: ConfigMap {name}: checking its data.config.yaml (the file the adapter "
          "reads from the mounted ConfigMap)", file=out)
    return rules


def check_config(settings: AdapterSettings, *, out: TextIO | None = None) -> int:
    """Validate the file of --check-config; with --prometheus-url also run one discovery pass.

    Prints to `out` (stdout); returns the exit code: 0 valid (and discovered), 1 otherwise.
    """
    out = out or sys.stdout
    path = settings.check_config or ""
    try:
        raw = read_config_bytes(path)
        text = raw.decode("utf-8")
        config_text = _rules_text_of(text, path=path, out=out)
        if config_text is None:
            return 1
        if _empty_yaml(config_text):
            print(f"{path}: warning: the file is empty: the adapter would serve no metrics",
                  file=out)
            return 0
        config = parse_config(config_text)
    except FileError as error:
        print(f"{path}: cannot read: {error.strerror}", file=out)
        return 1
    except UnicodeDecodeError as error:
        print(f"{path}: error: not UTF-8 text (byte {error.start})", file=out)
        print(f"{path}: invalid (1 problem(s))", file=out)
        return 1
    except ConfigError as error:
        for issue in error.issues:
            print(f"{path}: error: {issue}", file=out)
        print(f"{path}: invalid ({len(error.issues)} problem(s))", file=out)
        return 1
    for warning in config.warnings:
        print(f"{path}: warning: {warning}", file=out)
    resource_rules = "yes" if config.resource_rules is not None else "no"
    print(f"{path}: valid: {len(config.rules)} rules, {len(config.external_rules)} "
          f"externalRules, resourceRules: {resource_rules}", file=out)
    if config.backends:
        for line in _backend_lines(config):
            print(line, file=out)
    if settings.prometheus is None:
        return 0
    return asyncio.run(_check_discovery(settings, config=config, out=out))


def _backend_lines(config: AdapterConfig) -> list[str]:
    """`backend NAME (URL): rules[0], externalRules[1]`, one per backend, `default` first."""
    urls = {backend.name: _shown_url(backend.url) for backend in config.backends}
    configs = {backend.name: backend for backend in config.backends}
    lines = []
    for name, rules in config.rules_by_backend().items():
        where = urls.get(name, "--prometheus-url")
        used = ", ".join(rules) if rules else "no rule"
        backend = configs.get(name)
        tenants = "" if backend is None else _tenant_text(backend)
        lines.append(f"backend {name} ({where}): {used}{tenants}")
    return lines


def _tenant_text(backend: BackendConfig) -> str:
    """`; tenants: ...` of a tenant backend: what its discovery lists."""
    if not backend.per_namespace:
        return ""
    fixed = backend_tenants(backend)
    if follows_namespaces(backend):
        more = f" and {', '.join(fixed)}" if fixed else ""
        return (f"; tenants: one per namespace the adapter sees (at most "
                f"{MAX_NAMESPACE_TENANTS}){more}")
    return f"; tenants: {', '.join(fixed) if fixed else 'none'}"


def _shown_url(url: str) -> str:
    """The Prometheus URL for output: a password written into it stays out of logs."""
    return str(URL(url).with_password(None))


async def _check_discovery(settings: AdapterSettings, *, config: AdapterConfig,
                           out: TextIO) -> int:
    assert settings.prometheus is not None
    shown_url = _shown_url(settings.prometheus.url)
    catalog = await _catalog(settings, out)
    now = datetime.fromtimestamp(time.time(), tz=UTC)
    parts = []
    async with BackendClients(config=config, flags=settings.prometheus,
                              registry=CollectorRegistry()) as backends:
        for backend in backends.namespace_backends():
            if config.rules_by_backend().get(backend.name):
                print(f"backend {backend.name}: its namespaces' tenants are discovered by the "
                      "running adapter; this check discovers only its default tenant", file=out)
        for target in backends.relist_targets():
            if target.backend != DEFAULT_BACKEND and not config.rules_by_backend().get(
                    target.backend):
                continue
            try:
                parts.append(await relist_once(
                    now, config=config, lister=target.client, catalog=catalog,
                    max_age=settings.max_age, request_timeout=target.client.settings.timeout,
                    backend=target.backend if config.backends else None, tenant=target.tenant))
            except RelistFailed as error:
                cause = error.__cause__
                detail = getattr(cause, "detail", "") or ""
                where = shown_url if target.backend == DEFAULT_BACKEND else (
                    f"backend {target.backend} ({_shown_url(target.client.settings.url)})")
                if target.tenant is not None:
                    where += f" tenant {target.tenant}"
                print(f"discovery against {where} failed: {error} {detail}", file=out)
                return 1
    registry = merge_registries(parts, catalog=catalog)
    for problem in registry.stats.override_problems:
        print(f"warning: {problem}", file=out)
    per_rule = _sample_queries(registry, config)
    stats = {rule.rule: rule for rule in registry.stats.rules}
    for rule in (*config.rules, *config.external_rules):
        rule_stats = stats.get(rule.path)
        seen = rule_stats.series_names if rule_stats else 0
        found = per_rule[rule.path]
        print(f"{rule.path}: seriesQuery {rule.series_query!r}: {seen} series names, "
              f"{len(found)} metrics", file=out)
        for line in found:
            print(line, file=out)
    print(f"discovered {registry.stats.custom_metrics} custom and "
          f"{registry.stats.external_metrics} external metrics from "
          f"{shown_url}", file=out)
    return 0


# --------------------------------------------------------------------------------------------
# The subcommand


async def _check_named_kubeconfigs(args: argparse.Namespace, settings: AdapterSettings) -> None:
    """What is wrong with a kubeconfig (or --context) the flags name, before anything starts
    (AdapterSettingsError).

    A file the user named that cannot be used is bad usage (exit 2, as the autoscaler); the
    in-cluster account or a $KUBECONFIG that fails later is a runtime failure (exit 1).
    """
    named: list[tuple[str, str | None, str | None]] = []
    lister_flag = ("--kubeconfig" if args.kubeconfig else
                   "--lister-kubeconfig" if args.lister_kubeconfig else None)
    if lister_flag is not None or (args.context and settings.kubeconfig):
        named.append((lister_flag or "--context", settings.kubeconfig, settings.context))
    # The delegation clients use the file's current context, not --context.
    for flag, path in (("--authentication-kubeconfig", args.authentication_kubeconfig),
                       ("--authorization-kubeconfig", args.authorization_kubeconfig)):
        if path:
            named.append((flag, path, None))
    for flag, path, context in named:
        try:
            async with open_configuration(kubeconfig=path, context=context):
                pass
        except KubeConfigError as error:
            raise AdapterSettingsError(f"{flag}: {error}") from None


def _check_named_files(settings: AdapterSettings) -> None:
    """What is wrong with a file a `--prometheus-*` flag names, before anything starts
    (AdapterSettingsError).

    Each must be a readable regular file, the CA bundle must hold a certificate and the client
    pair must load. Without this a missing token file went unnoticed until the first request,
    and a bad CA failed later naming neither file nor flag.
    """
    prometheus = settings.prometheus
    if prometheus is None:
        return
    named = (("--prometheus-ca-file", prometheus.ca_file),
             ("--prometheus-token-file", prometheus.bearer_token_file),
             ("--prometheus-password-file", prometheus.basic_auth_password_file),
             ("--prometheus-client-tls-cert-file", prometheus.client_cert_file),
             ("--prometheus-client-tls-key-file", prometheus.client_key_file))
    for flag, name in named:
        if not name:
            continue
        path = Path(name)
        try:
            if not path.is_file():
                raise AdapterSettingsError(
                    f"{flag} {name}: {'not a regular file' if path.exists() else 'no such file'}")
            with path.open("rb") as file:
                file.read(1)
        except OSError as error:
            raise AdapterSettingsError(f"{flag} {name}: cannot read it: "
                                       f"{error.strerror or error}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if prometheus.ca_file:
        try:
            context.load_verify_locations(cafile=prometheus.ca_file)
        except ssl.SSLError:
            raise AdapterSettingsError(f"--prometheus-ca-file {prometheus.ca_file}: no PEM "
                                       "certificate in it") from None
    if prometheus.client_cert_file:
        try:
            context.load_cert_chain(prometheus.client_cert_file,
                                    keyfile=prometheus.client_key_file)
        except ssl.SSLError:
            raise AdapterSettingsError(
                f"--prometheus-client-tls-cert-file {prometheus.client_cert_file} and "
                f"--prometheus-client-tls-key-file {prometheus.client_key_file}: not a PEM "
                "certificate and its private key") from None


# The problems of a rule file refused at start, on its one line; --check-config lists them all.
_SHOWN_ISSUES = 3


def _start_config(path: str) -> AdapterConfig:
    """--config read and parsed; what is wrong with it in one line (AdapterSettingsError)."""
    try:
        return _load_config(path)
    except FileError as error:
        raise AdapterSettingsError(f"--config {path}: cannot read it: {error.strerror}"
                                   ) from None
    except ConfigError as error:
        shown = "; ".join(str(issue) for issue in error.issues[:_SHOWN_ISSUES])
        more = len(error.issues) - _SHOWN_ISSUES
        if more > 0:
            shown += (f"; and {more} more (`metricscale adapter --check-config {path}` lists "
                      "them all)")
        raise AdapterSettingsError(f"--config {path}: {shown}") from None


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (a dependency on CPython/Linux), else None:
    asyncio's own. libuv's loop and its TLS transport spend less CPU per request than asyncio's
    (bench/adapter.py measures both); the adapter works the same on either."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(args: argparse.Namespace) -> int:
    """`metricscale adapter ...`: serve, or check a configuration file.

    Bad flags, and files they name that cannot be used, raise AdapterSettingsError: one line
    naming the flag (and field), exit 2 (cli/main.py)."""
    settings = settings_from_args(args)
    configure_logging(level=settings.log_level, fmt=settings.log_format)
    _check_named_files(settings)
    if settings.check_config is not None:
        return check_config(settings)
    asyncio.run(_check_named_kubeconfigs(args, settings))
    assert settings.config_file is not None  # settings_from_args requires it for serving
    config = _start_config(settings.config_file)
    for warning in config.warnings:
        logger.warning("%s: %s", settings.config_file, warning)
    if settings.auth.insecure_disable_auth:
        logger.warning("--insecure-disable-auth: every caller may read every metric")
    loop_factory = event_loop_factory()
    logger.debug("event loop: %s", "uvloop" if loop_factory else "asyncio")
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(serve(settings, config))

