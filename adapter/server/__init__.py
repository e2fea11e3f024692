"""`metricscale adapter`: the composition root (flags, logging, TLS, serving); --check-config
is adapter.server.checking.

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
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
from aiohttp import web

from adapter.http.app import HEALTH_KEY, RELOADER_KEY, create_app, mark_shutting_down
from adapter.http.delegate import DelegateConfigError
from adapter.http.reloading import read_config_file
from adapter.kube.objects import USER_AGENT
from adapter.rules.config import (
    AdapterConfig,
    ConfigError,
)
from adapter.security.delegation import SecurityConfigError, build_security
from adapter.security.selfcerts import SelfCertsConfig, SelfManagedCertificates
from adapter.security.tls import (
    ReloadingServerContext,
    TLSConfigError,
    ensure_self_signed_certificate,
)
from adapter.server.checking import check_config
from adapter.settings import (
    DEFAULT_NAMESPACE,
    AdapterSettings,
    AdapterSettingsError,
    PrometheusConfigError,
    add_arguments,
    settings_from_args,
)
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
        status = await _serve(settings, config, started=started, exits=exits)
    logger.info("stopped")
    return status


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
        stopping = time.monotonic()
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
    # What is left (the Kubernetes and delegation clients) closes after this line.
    logger.info("requests, caches and discovery stopped %.1f s after the signal",
                time.monotonic() - stopping)
    return 1 if failures else 0


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
    return asyncio.run(serve(settings, config))

