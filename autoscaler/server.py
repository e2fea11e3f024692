"""`metricscale autoscaler`: the controller program (flags, wiring, HTTP endpoints, shutdown).

The composition root: it loads the cluster configuration and, in `serve_autoscaler` (an
`async with` that yields the running replica, every part of it built), opens the API clients,
starts the watch caches, waits for them to fill, runs the leader elector and the controller,
and serves `/metrics`, `/healthz` and `/readyz`. SIGTERM (or SIGINT) stops the workers,
releases the lease so the standby takes over at once, and closes everything in reverse order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from autoscaler.controller.exported import AutoscalerSeries
from autoscaler.controller.leader import (
    LeaderElectionConfig,
    LeaderElector,
    LeaderGuard,
    add_leader_election_arguments,
    default_identity,
    default_lease_namespace,
    leader_election_config,
    publish_settings,
)
from autoscaler.controller.reconciler import Reconciler
from autoscaler.controller.shadow import ShadowPublisher, ShadowReconciler
from autoscaler.controller.stats import ControllerMetrics
from autoscaler.controller.watching import Watching
from autoscaler.controller.workqueue import CURRENT_OBJECT, Controller
from autoscaler.decision import settings as settings_flags
from autoscaler.decision.settings import Settings
from autoscaler.decision.shadow import SHADOW_NAME
from autoscaler.kube.metrics_api import MetricsClient
from autoscaler.kube.operations import USER_AGENT, KubeClient
from autoscaler.model.names import dns_label_problem
from autoscaler.model.objects import Autoscaler
from metricscale.core.durations import format_duration
from metricscale.core.errors import ConfigError
from metricscale.core.selectors import SelectorError, parse_selector
from metricscale.kube.config import (
    Configuration,
    add_kubeconfig_arguments,
    open_configuration,
    resolve_kubeconfig,
)
from metricscale.kube.errors import KubeConfigError, KubeError
from metricscale.kube.http import open_kube_http
from metricscale.kube.informer import InformerCollector, InformerOptions, PathSource
from metricscale.logs import add_logging_arguments, configure_logging
from metricscale.serving import StatusAppRunner
from metricscale.tasks import start_guarded_task

__all__ = ["MAX_CONCURRENT_SYNCS", "AutoscalerServer", "Health", "Options", "StartupError",
           "add_arguments", "options_from_arguments", "run", "serve_autoscaler"]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
# How long the first LIST of every cache may take before the program says so (it keeps going).
_SYNC_REPORT_SECONDS = 30.0


# --------------------------------------------------------------------------------------------
# Flags


# The most workers: each is a coroutine on the one event loop, and their requests share one
# connection pool (100 connections unless the kubeconfig asks for more), so beyond a few
# hundred a worker only waits for a connection; a mistyped 1000000000 would create a billion
# tasks at start and run the process out of memory.
MAX_CONCURRENT_SYNCS = 1000


def _worker_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    if value > MAX_CONCURRENT_SYNCS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_CONCURRENT_SYNCS}, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `metricscale autoscaler` (upstream's names where upstream has the flag)."""
    settings_flags.add_arguments(parser)
    group = parser.add_argument_group("controller")
    group.add_argument("--concurrent-syncs", "--concurrent-horizontal-pod-autoscaler-syncs",
                       dest="concurrent_syncs", type=_worker_count, default=5, metavar="N",
                       help=f"autoscalers reconciled at the same time (default 5, at most "
                            f"{MAX_CONCURRENT_SYNCS})")
    group.add_argument("--dry-run", action="store_true",
                       help="decide and report (status, events), but never write a scale; "
                            "one autoscaler at a time: annotation metricscale.dev/dry-run=true")
    group.add_argument("--enable-native-hpa", action="store_true",
                       help="also act on autoscaling/v2 HorizontalPodAutoscalers; only when "
                            "kube-controller-manager's HPA controller is switched off")
    group.add_argument("--shadow", action="store_true",
                       help="shadow mode: decide every native HPA as metricscale would, beside "
                            "kube-controller-manager's HPA controller, and write nothing to it "
                            "or its target (agreement on /metrics, an Event per difference); "
                            f"acts on no Autoscaler; its Lease defaults to {SHADOW_NAME}")
    group.add_argument("--shadow-selector", default="", metavar="SELECTOR",
                       help="with --shadow: only the HPAs this label selector picks, e.g. "
                            "team=shop (default: all)")
    group.add_argument("--namespace", default="", metavar="NAMESPACE",
                       help="watch only this namespace, a DNS-1123 label (default: all)")
    add_kubeconfig_arguments(group)
    group.add_argument("--metrics-bind-address", default=":8080", metavar="HOST:PORT",
                       help="where /metrics, /healthz and /readyz are served (default :8080; "
                            "0 to switch off)")
    add_logging_arguments(group)
    add_leader_election_arguments(parser)


@dataclass(frozen=True)
class Options:
    """Everything the program is told, as values."""

    settings: Settings
    leader_election: LeaderElectionConfig
    concurrent_syncs: int = 5
    dry_run: bool = False
    native_hpa: bool = False
    shadow: bool = False
    shadow_selector: str = ""
    namespace: str = ""
    metrics_bind_address: str = ":8080"
    identity: str = ""
    lease_namespace: str = ""
    reporting_instance: str = ""
    reconcile_timeout: float | None = None
    informer_options: InformerOptions = field(default_factory=InformerOptions)


class StartupError(Exception):
    """The program cannot start (a port taken...); `str(err)` is the one line to show."""


def options_from_arguments(args: argparse.Namespace) -> Options:
    """Options from parsed flags; raises ConfigError naming the flag that cannot be used."""
    namespace = args.namespace
    problem = dns_label_problem(namespace) if namespace else None
    if problem is not None:
        raise ConfigError(f"--namespace {namespace!r}: a namespace must be a DNS-1123 label: "
                          f"{problem}")
    try:
        election = leader_election_config(args)
    except ValueError as error:
        text = str(error)
        raise ConfigError(text if text.startswith("--") else f"--leader-elect-*: {text}") \
            from None
    try:
        parse_bind_address(args.metrics_bind_address)
    except ValueError as error:
        raise ConfigError(f"--metrics-bind-address {args.metrics_bind_address!r}: {error}") \
            from None
    shadow, selector = bool(args.shadow), args.shadow_selector.strip()
    if shadow and args.enable_native_hpa:
        raise ConfigError("--shadow and --enable-native-hpa exclude each other: shadow mode "
                          "writes nothing to the HPAs, native mode acts on them")
    if selector and not shadow:
        raise ConfigError("--shadow-selector: only with --shadow")
    if selector:
        try:
            parse_selector(selector)
        except SelectorError as error:
            raise ConfigError(f"--shadow-selector {selector!r}: {error}") from None
    if shadow and election.resource_name == LeaderElectionConfig().resource_name:
        # Never the controller's own Lease: a shadow that took it would stop the Autoscalers.
        election = dataclasses.replace(election, resource_name=SHADOW_NAME)
    return Options(
        settings=settings_flags.settings_from_arguments(args),
        leader_election=election,
        concurrent_syncs=args.concurrent_syncs,
        dry_run=args.dry_run,
        native_hpa=args.enable_native_hpa,
        shadow=shadow,
        shadow_selector=selector,
        namespace=args.namespace,
        metrics_bind_address=args.metrics_bind_address,
        identity=default_identity(),
        lease_namespace=election.resource_namespace or default_lease_namespace(),
        reporting_instance=os.environ.get("POD_NAME") or socket.gethostname(),
    )


def parse_bind_address(text: str) -> tuple[str, int] | None:
    """':8080' -> ('0.0.0.0', 8080); '127.0.0.1:0' -> any free port; '0' -> switched off."""
    if text.strip() in {"", "0"}:
        return None
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError("want HOST:PORT with a port from 0 to 65535, or 0 to switch off")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError("an IPv6 host goes in brackets: [::1]:8080")
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("want HOST:PORT; an IPv6 host goes in brackets: [::1]:8080")
    return (host or "0.0.0.0"), int(port)


# --------------------------------------------------------------------------------------------
# The program


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Health:
    """Whether a replica still works: the first background task that dies stops it."""

    def __init__(self, on_fatal: Callable[[BaseException], None] | None = None) -> None:
        self.fatal: BaseException | None = None  # None while every task runs
        self.stopped = asyncio.Event()
        self._on_fatal = on_fatal

    def failed(self, exc: BaseException) -> None:
        if self.fatal is None:
            self.fatal = exc
        self.stopped.set()
        if self._on_fatal is not None:
            self._on_fatal(exc)


@dataclass(frozen=True)
class AutoscalerServer:
    """One running controller replica, as `serve_autoscaler` yields it.

    Tests run several in one process (each with its own registry and identity).
    """

    kube: KubeClient
    watching: Watching
    reconciler: Reconciler | ShadowReconciler
    controller: Controller
    guard: LeaderGuard
    registry: CollectorRegistry
    health: Health
    port: int | None  # of /metrics, /healthz and /readyz; None: --metrics-bind-address 0
    shutdown: Callable[[], Awaitable[None]] = field(repr=False)
    publisher: ShadowPublisher | None = None  # shadow mode's ConfigMap writer

    async def stop(self) -> None:
        """Stop this replica now (the workers, the lease, the caches), as leaving the `async
        with` does first; the endpoints and the clients close when it is left."""
        await self.shutdown()

    @property
    def fatal(self) -> BaseException | None:
        return self.health.fatal

    @property
    def stopped(self) -> asyncio.Event:
        return self.health.stopped


@contextlib.asynccontextmanager
async def serve_autoscaler(configuration: Configuration, options: Options, *,
                           registry: CollectorRegistry | None = None,
                           clock: Callable[[], datetime] = _utc_now,
                           on_fatal: Callable[[BaseException], None] | None = None
                           ) -> AsyncIterator[AutoscalerServer]:
    """Open the API clients, build the watch caches, the leader elector and the controller,
    serve the HTTP endpoints, then start the caches and the main task; on leaving, stop the
    workers, release the lease (the elector does on cancel) and close everything in reverse
    order. StartupError: the endpoints cannot listen."""
    registry = registry or CollectorRegistry()
    health = Health(on_fatal)
    stats = ControllerMetrics(registry)
    try:
        # One session for every request, the informers' lists and watches included.
        async with open_kube_http(configuration, user_agent=USER_AGENT) as http:
            kube = KubeClient(
                http, registry=registry,
                reporting_instance=options.reporting_instance or socket.gethostname())
            watching = Watching(lambda path: PathSource(http, path),
                                native_hpa=options.native_hpa or options.shadow,
                                namespace=options.namespace or None,
                                informer_options=options.informer_options,
                                autoscalers=not options.shadow,
                                hpa_selector=options.shadow_selector or None)
            if not options.shadow:  # a shadow's HPAs are kube-controller-manager's to show
                registry.register(AutoscalerSeries(lambda: _cached_autoscalers(watching)))
            registry.register(InformerCollector(lambda: watching.informers))
            publisher: ShadowPublisher | None = None

            def leadership_changed(leader: bool) -> None:
                stats.leader.set(1 if leader else 0)
                if leader:
                    # What this replica remembers may be stale: read every history back and
                    # sync all (the elector runs, and so calls this, once `controller` exists).
                    controller.reset(watching.keys())
                    if publisher is not None:
                        publisher.reset()

            elector = _elector(kube, options, clock=clock, settings=options.settings,
                               on_change=leadership_changed)
            guard = elector.guard if elector is not None else LeaderGuard.always_leader(
                clock=clock)
            if elector is None:
                stats.leader.set(1)
            reconciler: Reconciler | ShadowReconciler
            if options.shadow:
                reconciler, controller = _shadow_controller(
                    kube, watching, guard, options=options, stats=stats, clock=clock)
                publisher = ShadowPublisher(
                    kube, reconciler,
                    namespace=options.lease_namespace or default_lease_namespace(),
                    name=options.leader_election.resource_name, leader=guard,
                    stats=stats.shadow)
            else:
                reconciler, controller = _controller(kube, watching, guard, options=options,
                                                     stats=stats, clock=clock)
            main = _MainTask(watching=watching, controller=controller, kube=kube,
                             options=options, stats=stats, elector=elector,
                             publisher=publisher, guard=guard, clock=clock)
            async with _endpoints(options.metrics_bind_address, registry=registry,
                                  watching=watching, health=health) as port:
                watching.start(on_failure=health.failed)
                shutdown = _Shutdown(main, start_guarded_task(
                    main.run(), name="autoscaler main", on_failure=health.failed), health)
                try:
                    yield AutoscalerServer(kube=kube, watching=watching, reconciler=reconciler,
                                           controller=controller, guard=guard,
                                           registry=registry, health=health, port=port,
                                           shutdown=shutdown, publisher=publisher)
                finally:
                    await shutdown()
    finally:
        health.stopped.set()


def _cached_autoscalers(watching: Watching) -> Iterator[tuple[str, Autoscaler]]:
    # Read at scrape time: objects that did not parse have nothing to show.
    for informer in watching.autoscaler_informers():
        for _, entry in informer.items():
            if entry.autoscaler is not None:
                yield entry.key.kind, entry.autoscaler


def _controller(kube: KubeClient, watching: Watching, guard: LeaderGuard, *, options: Options,
                stats: ControllerMetrics, clock: Callable[[], datetime]
                ) -> tuple[Reconciler, Controller]:
    """The reconciler and the work queue's controller, fed by the autoscaler caches."""
    metrics = MetricsClient(kube, version_ttl=options.settings.sync_period.total_seconds())
    reconciler = Reconciler(kube=kube, metrics=metrics, watching=watching,
                            settings=options.settings, dry_run=options.dry_run, leader=guard,
                            controller_metrics=stats)
    controller = Controller(
        reconciler, sync_period=options.settings.sync_period,
        workers=options.concurrent_syncs, metrics=stats,
        reconcile_timeout=options.reconcile_timeout,
        may_work=guard.wait_until_leader,
        exists=lambda key: watching.get(key) is not None,
        wall_clock=clock)
    watching.subscribe(controller.on_event)
    return reconciler, controller


def _shadow_controller(kube: KubeClient, watching: Watching, guard: LeaderGuard, *,
                       options: Options, stats: ControllerMetrics,
                       clock: Callable[[], datetime]) -> tuple[ShadowReconciler, Controller]:
    """Shadow mode's reconciler and the work queue's controller, fed by the HPA cache: the
    reconciler sees each status of an HPA before the queue does."""
    metrics = MetricsClient(kube, version_ttl=options.settings.sync_period.total_seconds())
    shadow = ShadowReconciler(kube=kube, metrics=metrics, watching=watching,
                              settings=options.settings, leader=guard, stats=stats.shadow,
                              clock=clock)
    controller = Controller(
        shadow, sync_period=options.settings.sync_period,
        workers=options.concurrent_syncs, metrics=stats,
        reconcile_timeout=options.reconcile_timeout,
        may_work=guard.wait_until_leader,
        exists=lambda key: watching.get(key) is not None,
        wall_clock=clock)
    watching.subscribe(shadow.observe)
    watching.subscribe(controller.on_event)
    shadow.wake = controller.queue.add
    return shadow, controller


def _elector(kube: KubeClient, options: Options, *, clock: Callable[[], datetime],
             settings: Settings, on_change: Callable[[bool], None]) -> LeaderElector | None:
    """The leader elector, with leader election on (--leader-elect)."""
    election = options.leader_election
    if not election.enabled:
        return None
    return LeaderElector(
        kube, config=election, identity=options.identity or default_identity(),
        namespace=options.lease_namespace or default_lease_namespace(), clock=clock,
        on_change=on_change, settings=settings)


@dataclass
class _MainTask:
    """Wait for the caches to fill, then run the leader elector (or publish the settings once),
    the controller and the gauges."""

    watching: Watching
    controller: Controller
    kube: KubeClient
    options: Options
    stats: ControllerMetrics
    elector: LeaderElector | None  # None: no leader election
    publisher: ShadowPublisher | None = None
    guard: LeaderGuard | None = None
    clock: Callable[[], datetime] = _utc_now
    frozen: bool = False

    async def run(self) -> None:
        while not await self.watching.wait_synced(_SYNC_REPORT_SECONDS):
            logger.warning("the caches of autoscalers and pods are still filling: %s", "; ".join(
                f"{i.name}: {i.last_error or 'waiting'}" for i in self.watching.informers
                if not i.has_synced))
        logger.info("caches filled: %d autoscalers, %d pods", len(self.watching.keys()),
                    len(self.watching.pods))
        # The caches just filled (100,000 parsed pods at 10,000 autoscalers) live as long as
        # the process: out of the collector's generations, a full collection no longer walks
        # them (measured: 0.8 s per full collection with them, each a stall of every worker).
        # They are acyclic, so what leaves the caches later is still freed by reference count.
        gc.freeze()
        self.frozen = True
        async with asyncio.TaskGroup() as group:
            if self.elector is not None:
                group.create_task(self.elector.run(), name="leader elector")
            else:
                group.create_task(self._publish_settings(), name="publish settings")
            group.create_task(self.controller.run(), name="controller")
            group.create_task(self._gauges(), name="gauges")
            if self.publisher is not None:
                group.create_task(self.publisher.run(
                    period=self.options.settings.sync_period, clock=self.clock,
                    wait_until_leader=self.guard.wait_until_leader
                    if self.guard is not None else None), name="shadow publisher")

    async def _publish_settings(self) -> None:
        """Without leader election, publish the decision settings on the Lease anyway, once,
        best effort: `explain --live` reads them there."""
        options = self.options
        namespace = options.lease_namespace or default_lease_namespace()
        name = options.leader_election.resource_name
        try:
            await publish_settings(self.kube, namespace=namespace, name=name,
                                   settings=options.settings)
        except KubeError as exc:
            logger.warning("lease %s/%s: settings not published for explain --live: %s",
                           namespace, name, exc)

    async def _gauges(self) -> None:
        while True:
            self.stats.autoscalers.set(len(self.watching.keys()))
            self.stats.queue_depth.set(len(self.controller.queue))
            await asyncio.sleep(5)


@dataclass
class _Shutdown:
    """Stop the workers, release the lease (the elector does when cancelled) and stop the
    caches, once."""

    main: _MainTask
    task: asyncio.Task[None]
    health: Health
    done: bool = False

    async def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        self.main.controller.shut_down()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task
        await self.main.watching.stop()
        if self.main.frozen:
            # A process that runs more than one controller (tests) must not pin their objects.
            gc.unfreeze()
        self.health.stopped.set()


# --------------------------------------------------------------------------------------------
# HTTP: /metrics, /healthz, /livez, /readyz


@contextlib.asynccontextmanager
async def _endpoints(bind_address: str, *, registry: CollectorRegistry, watching: Watching,
                     health: Health) -> AsyncIterator[int | None]:
    """Serve the endpoints on `bind_address` while inside; the port (None: switched off)."""
    address = parse_bind_address(bind_address)
    if address is None:
        yield None
        return
    app = web.Application()
    endpoints = _Endpoints(registry=registry, watching=watching, health=health)
    app.router.add_get("/metrics", endpoints.metrics)
    app.router.add_get("/healthz", endpoints.healthz)
    app.router.add_get("/livez", endpoints.healthz)
    app.router.add_get("/readyz", endpoints.readyz)
    runner = StatusAppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, address[0], address[1])
        try:
            await site.start()
        except OSError as error:
            raise StartupError(f"cannot listen on --metrics-bind-address {bind_address}: "
                               f"{error.strerror or error}") from None
        sockets = runner.addresses
        port = int(sockets[0][1]) if sockets else address[1]
        logger.info("serving /metrics, /healthz and /readyz on %s:%d", address[0], port)
        yield port
    finally:
        await runner.cleanup()


@dataclass(frozen=True)
class _Endpoints:
    registry: CollectorRegistry
    watching: Watching
    health: Health

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, request: web.Request) -> web.Response:
        if self.health.fatal is not None:
            return web.Response(status=500, text=f"failed: {self.health.fatal!r}\n")
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        if self.health.fatal is not None:
            return web.Response(status=500, text=f"failed: {self.health.fatal!r}\n")
        if not self.watching.synced:
            return web.Response(status=503, text="caches are still filling\n")
        # One line per cache, as kube-apiserver's verbose readyz: a stalled watch shows here.
        lines = []
        for informer in self.watching.informers:
            reason = informer.stale_reason()
            check = f"informer-{informer.name}"
            lines.append(f"[+]{check} ok" if reason is None
                         else f"[-]{check} failed: {reason}")
        if any(line.startswith("[-]") for line in lines):
            return web.Response(status=503,
                                text="\n".join(lines) + "\nreadyz check failed\n")
        return web.Response(text="ok\n")


async def _main(args: argparse.Namespace) -> int:
    # A flag that cannot be used raises ConfigError: one line naming it, exit 2 (cli/main.py).
    options = options_from_arguments(args)
    loop = asyncio.get_running_loop()
    failed: list[BaseException] = []
    stop = asyncio.Event()

    def credentials_failed(error: BaseException) -> None:
        failed.append(error)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with open_configuration(kubeconfig=resolve_kubeconfig(args.kubeconfig),
                                      context=args.context,
                                      on_failure=credentials_failed) as configuration, \
                serve_autoscaler(configuration, options) as server:
            logger.info("metricscale autoscaler started (identity %s, %d workers, sync "
                        "period %s%s)", options.identity, options.concurrent_syncs,
                        format_duration(options.settings.sync_period),
                        ", shadow mode: writes nothing to HPAs or their targets"
                        if options.shadow else ", dry run" if options.dry_run else "")
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([stopping, asyncio.create_task(server.stopped.wait())],
                               return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            logger.info("stopping: releasing the lease and closing")
    except KubeConfigError as error:
        # A file the user named that cannot be used is bad usage; the in-cluster account is not.
        if args.kubeconfig:
            raise
        logger.error("%s", error)
        return EXIT_FAILED
    except StartupError as error:
        logger.error("%s", error)
        return EXIT_FAILED
    return EXIT_FAILED if failed or server.fatal is not None else EXIT_OK


def run(args: argparse.Namespace) -> int:
    # Every line names the autoscaler being reconciled (or "-").
    configure_logging(fmt=args.log_format, level=args.log_level,
                      current_object=CURRENT_OBJECT.get)
    return asyncio.run(_main(args))
