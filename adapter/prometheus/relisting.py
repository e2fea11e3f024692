"""Metric relisting: `relist_once` (one pass over the series API) and the loop that swaps snapshots.

A pass sends one `/api/v1/series` request per distinct `seriesQuery`, all in parallel, with
`start = now - max-age`, and folds each streamed answer into series shapes (name + label
names) as it arrives, so memory follows metric names and label-name sets, never the number of
series. Only a pass where every call succeeded builds a new `MetricRegistry`, which replaces
the old one in a single assignment: requests see the old snapshot or the new one, never a mix.
A failed pass keeps the last good snapshot and is retried sooner than the interval.

A pass that succeeds but finds far fewer series than the snapshot in use (fewer than half its
series shapes) is held: the snapshot in use keeps serving and the pass is retried sooner than
the interval, like a failed one. That is what a Prometheus looks like right after a restart
that lost its data (or one down for longer than max-age), before its first scrape: an empty
answer that would otherwise turn every custom metric into a 404 for a whole interval. A later
pass that finds the series again is swapped in at once; a drop that is still there when a
relist interval has passed since the first held pass is real, and that pass is swapped in. A
restart cannot be told from a real drop without asking the backend when it started, which not
every backend (Thanos, Mimir, VictoriaMetrics) can answer, so every far drop is held once.
Held passes are logged, counted (`metricscale_discovery_passes_total{result="held"}`) and
shown (`metricscale_discovery_held_passes`: held passes in a row, 0 when none).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import NoReturn, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from adapter.prometheus.client import PrometheusError
from adapter.rules.config import DEFAULT_BACKEND, AdapterConfig
from adapter.rules.registry import (
    MetricRegistry,
    SeriesShape,
    build_registry,
    empty_registry,
    merge_registries,
)
from adapter.rules.resources import ResourceCatalog

__all__ = [
    "RelistFailed",
    "RelistMetrics",
    "Relister",
    "Relisting",
    "SeriesLister",
    "TenantChanges",
    "TenantSync",
    "collect_shapes",
    "relist_once",
]

logger = logging.getLogger(__name__)

# First retry after a failed (or held) pass; doubled per consecutive one, capped at the interval.
_FIRST_RETRY_SECONDS = 1.0
# A pass finding fewer series shapes than this share of the snapshot in use is held.
HOLD_BELOW_SHARE = 0.5


class SeriesLister(Protocol):
    """The one call discovery needs (PrometheusClient.series has this shape)."""

    def series(self, matches: Sequence[str], *, start: float | Decimal,
               end: float | Decimal | None = None,
               request_timeout: float | None = None) -> AsyncIterator[dict[str, str]]: ...


class RelistFailed(Exception):
    """A pass could not complete; `str()` is safe to show, the cause is chained for logs."""


async def collect_shapes(lister: SeriesLister, series_query: str, *, start: Decimal,
                         request_timeout: float | None,
                         interned: dict[frozenset[str], frozenset[str]]) -> list[SeriesShape]:
    """The distinct (name, label names) shapes of one series query, read as they stream in."""
    seen: dict[SeriesShape, None] = {}
    stream = lister.series([series_query], start=start, request_timeout=request_timeout)
    try:
        async for labels in stream:
            name = labels.get("__name__", "")
            names = frozenset(labels)
            if name:
                names = names - {"__name__"}
            names = interned.setdefault(names, names)
            seen[SeriesShape(name, names)] = None
    finally:
        # Close the response at once on failure or cancellation, not when garbage collected.
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
    return list(seen)


async def relist_once(now: datetime, *, config: AdapterConfig, lister: SeriesLister,
                      catalog: ResourceCatalog, max_age: Decimal,
                      request_timeout: float | None = None, backend: str | None = None,
                      tenant: str | None = None) -> MetricRegistry:
    """One relisting pass; raises RelistFailed if any series call fails.

    With `backend`, only the rules bound to it (`lister` is that backend's client, of `tenant`
    if it has tenants); without, every rule.
    """
    start = Decimal(str(now.timestamp())) - max_age
    queries = config.series_queries() if backend is None else config.series_queries_for(backend)
    interned: dict[frozenset[str], frozenset[str]] = {}
    try:
        async with asyncio.TaskGroup() as group:
            tasks = {query: group.create_task(
                collect_shapes(lister, query, start=start, request_timeout=request_timeout,
                               interned=interned),
                name=f"series {query}") for query in queries}
    except ExceptionGroup as failures:
        # Not `except* PrometheusError`: before Python 3.11.4 (the image runs Debian's 3.11.2),
        # an exception raised inside `except*` leaves it wrapped in an ExceptionGroup, which
        # the callers' `except RelistFailed` misses, and the relist loop dies.
        prometheus, others = failures.split(PrometheusError)
        if prometheus is None or others is not None:
            raise  # a bug, not an unreachable backend: the guarded task stops the process
        first = _first_leaf(prometheus)
        raise RelistFailed(f"a series request failed: {first}") from first
    shapes = {query: task.result() for query, task in tasks.items()}
    return build_registry(config=config, series=shapes, catalog=catalog, now=now,
                          backend=backend, tenant=tenant)


def _first_leaf(group: BaseExceptionGroup[PrometheusError]) -> PrometheusError:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


@dataclass(frozen=True)
class RelistMetrics:
    """Relister's own series on the adapter's CollectorRegistry."""

    passes: Counter
    duration: Histogram
    last_success: Gauge
    age: Gauge
    metrics: Gauge
    shapes: Gauge
    rule_metrics: Gauge
    rules: Gauge
    held: Gauge

    @classmethod
    def register(cls, registry: CollectorRegistry) -> RelistMetrics:
        return cls(
            passes=Counter("metricscale_discovery_passes_total",
                           "Discovery passes, by backend and result (success, failure, held: "
                           "far fewer series than the snapshot in use, not swapped in).",
                           ["backend", "result"], registry=registry),
            duration=Histogram("metricscale_discovery_duration_seconds",
                               "Time of a discovery pass (failures included), by backend.",
                               ["backend"], registry=registry,
                               buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)),
            last_success=Gauge("metricscale_discovery_last_success_timestamp_seconds",
                               "Unix time of a backend's last successful discovery pass (of "
                               "its tenants, the oldest; 0: none yet).", ["backend"],
                               registry=registry),
            age=Gauge("metricscale_discovery_age_seconds",
                      "Seconds since a backend's snapshot in use was built (of its tenants', "
                      "the oldest; NaN before the first).", ["backend"], registry=registry),
            metrics=Gauge("metricscale_discovered_metrics",
                          "Metrics in the snapshot in use, by API (custom, external).", ["api"],
                          registry=registry),
            shapes=Gauge("metricscale_discovered_series_shapes",
                         "Distinct (series name, label names) pairs in the last pass.",
                         registry=registry),
            rule_metrics=Gauge("metricscale_rule_discovered_metrics",
                               "Metrics each rule registered in the last pass.", ["rule"],
                               registry=registry),
            rules=Gauge("metricscale_rules",
                        "Rules in the configuration, by section.", ["section"],
                        registry=registry),
            held=Gauge("metricscale_discovery_held_passes",
                       "Discovery passes held in a row (far fewer series than the snapshot in "
                       "use, which keeps serving), by backend (of its tenants, the most); 0: "
                       "the last pass was not held.", ["backend"], registry=registry),
        )


@dataclass(frozen=True)
class TenantChanges:
    """What one tenant pass changed: relisters for new tenants (no pass run yet) and the
    relisters of tenants that are gone (their clients already out of use)."""

    added: tuple[Relister, ...] = ()
    removed: tuple[Relister, ...] = ()


class TenantSync(Protocol):
    """Keeps the tenants of the backends that follow the namespaces (adapter.prometheus.tenancy
    .NamespaceTenants); `Relisting` runs it before its relisters, at their interval."""

    @property
    def name(self) -> str: ...

    @property
    def last_error(self) -> str | None: ...

    async def sync(self) -> TenantChanges | None:
        """One pass; None when the namespaces could not be read (nothing changed)."""

    def next_delay(self) -> float: ...


class Relister:
    """Holds one backend's (or one tenant's) snapshot and runs its relist loop.

    Drive it with `step()` in tests (the clock and the sleep are injected), or `run()` as a
    guarded background task. `Relisting` merges the snapshots of every backend.
    """

    def __init__(self, *, config: AdapterConfig, lister: SeriesLister,
                 catalog: Callable[[], ResourceCatalog], interval: Decimal, max_age: Decimal,
                 metrics: RelistMetrics, timeout: float | None = None,
                 clock: Callable[[], float],
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 backend: str | None = None, tenant: str | None = None,
                 on_swap: Callable[[], None] = lambda: None) -> None:
        self._config = config
        self._lister = lister
        self._catalog = catalog
        self._interval = float(interval)
        self._max_age = max_age
        # A pass must not outlive its interval: the next one would start on stale ground.
        self._timeout = timeout if timeout is not None else self._interval
        self._metrics = metrics
        self._clock = clock
        self._sleep = sleep
        self.on_swap = on_swap
        self.backend = backend
        self.tenant = tenant
        self._registry = empty_registry(catalog())
        self._failures = 0
        self.last_error: str | None = None
        # Passes held in a row (far fewer series than the snapshot in use), and when the
        # first of them started (clock time).
        self.held_passes = 0
        self._held_since: float | None = None
        self.passes = 0
        # False for a tenant added while serving: readiness does not wait for its first pass
        # (its namespaces are served once it succeeds, like a tenant never discovered before).
        self.gates_readiness = True

    @property
    def backend_label(self) -> str:
        """The `backend` label of its /metrics series (`default` for the single backend)."""
        return self.backend or DEFAULT_BACKEND

    @property
    def name(self) -> str:
        """For logs: `backend "x"` (`tenant "t"`), or nothing for the single backend."""
        if self.backend is None:
            return "discovery"
        text = f"discovery of backend {self.backend!r}"
        return text if self.tenant is None else f"{text} (tenant {self.tenant!r})"

    @property
    def registry(self) -> MetricRegistry:
        """The snapshot in use (replaced as a whole by a successful pass)."""
        return self._registry

    @property
    def has_succeeded(self) -> bool:
        """Whether a pass has ever completed (readiness waits for it)."""
        return self._registry.built_at is not None

    async def step(self) -> bool:
        """One pass: swap in the new snapshot on success, keep the old one on failure or when
        the pass is held (far fewer series); True if the new snapshot was swapped in."""
        started = self._clock()
        now = datetime.fromtimestamp(started, tz=UTC)
        self.passes += 1
        try:
            registry = await relist_once(now, config=self._config, lister=self._lister,
                                         catalog=self._catalog(), max_age=self._max_age,
                                         request_timeout=self._timeout, backend=self.backend,
                                         tenant=self.tenant)
        except RelistFailed as error:
            self._failures += 1
            self.last_error = str(error)
            self._metrics.passes.labels(self.backend_label, "failure").inc()
            self._metrics.duration.labels(self.backend_label).observe(
                max(0.0, self._clock() - started))
            cause = error.__cause__
            detail = getattr(cause, "detail", "") or ""
            logger.warning("%s: pass failed (%d in a row), keeping the snapshot of %s: %s %s",
                           self.name, self._failures, self._built_at_text(), error, detail)
            return False
        self._failures = 0
        self.last_error = None
        elapsed = max(0.0, self._clock() - started)
        if self._holds(registry, started=started):
            self._metrics.passes.labels(self.backend_label, "held").inc()
            self._metrics.duration.labels(self.backend_label).observe(elapsed)
            return False
        self.held_passes = 0
        self._held_since = None
        self._registry = registry
        self._record(registry, elapsed)
        self.on_swap()
        return True

    def _holds(self, registry: MetricRegistry, *, started: float) -> bool:
        """Whether `registry` is held rather than swapped in (the module docstring's rule)."""
        kept = self._registry.stats.series_shapes
        found = registry.stats.series_shapes
        if self._registry.built_at is None or found >= kept * HOLD_BELOW_SHARE:
            if self.held_passes:
                logger.info("%s: the series are back (%d series shapes against %d in the "
                            "snapshot in use) after %d held passes", self.name, found, kept,
                            self.held_passes)
            return False
        if self._held_since is None:
            self._held_since = started
        if started - self._held_since >= self._interval:
            logger.warning("%s: the drop to %d series shapes (from %d) has lasted a relist "
                           "interval (%d passes held): swapping it in", self.name, found, kept,
                           self.held_passes)
            return False
        self.held_passes += 1
        logger.warning("%s: pass found %d series shapes against %d in the snapshot in use "
                       "(%d held in a row): keeping the snapshot of %s until a pass finds them "
                       "again or the drop lasts a relist interval (as after a Prometheus "
                       "restart, before its first scrape)", self.name, found, kept,
                       self.held_passes, self._built_at_text())
        return True

    def _built_at_text(self) -> str:
        built = self._registry.built_at
        return "nothing (no pass has succeeded yet)" if built is None else built.isoformat()

    def _record(self, registry: MetricRegistry, elapsed: float) -> None:
        stats = registry.stats
        metrics = self._metrics
        metrics.passes.labels(self.backend_label, "success").inc()
        metrics.duration.labels(self.backend_label).observe(elapsed)
        for rule in stats.rules:
            metrics.rule_metrics.labels(rule.rule).set(rule.metrics)
        for problem in stats.override_problems:
            logger.warning("%s: %s", self.name, problem)
        logger.info("%s pass took %.2fs: %d custom and %d external metrics from %d "
                    "series shapes", self.name, elapsed, stats.custom_metrics,
                    stats.external_metrics, stats.series_shapes)

    def next_delay(self) -> float:
        """Seconds until the next pass: the interval, or a shorter backoff after failures (or
        held passes)."""
        streak = self._failures or self.held_passes
        if streak == 0:
            return self._interval
        return min(self._interval, _FIRST_RETRY_SECONDS * 2.0 ** (streak - 1))

    async def run(self, *, passed: bool = False) -> NoReturn:
        """Pass, wait, pass... The interval counts from the end of one pass (as upstream).

        `passed`: a pass has just been made (a reloaded configuration's first): wait first.
        """
        if passed:
            await self._sleep(self.next_delay())
        while True:
            await self.step()
            await self._sleep(self.next_delay())


class Relisting:
    """Every backend's (and tenant's) relister, and the snapshot merged from theirs.

    Each relister keeps its own last good snapshot and its own retry pace, so a failing
    backend holds nobody back; the merge is rebuilt once per swap, never per request.
    """

    def __init__(self, *, config: AdapterConfig, catalog: Callable[[], ResourceCatalog],
                 metrics: RelistMetrics, clock: Callable[[], float],
                 publish: bool = True, tenants: TenantSync | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._config = config
        self._catalog = catalog
        self._metrics = metrics
        self._clock = clock
        self._sleep = sleep
        self.relisters: list[Relister] = []
        # The tenants that follow the namespaces: readiness waits for their first pass too.
        self._tenants = tenants
        self._tenants_synced = tenants is None
        self._tenant_lock = asyncio.Lock()
        self._group: asyncio.TaskGroup | None = None  # while run() runs
        self._loops: dict[Relister, asyncio.Task[NoReturn]] = {}
        self._registry = empty_registry(catalog())
        self._published = False
        self._aged: set[str] = set()  # the backends with an age series
        if publish:
            self.publish()

    def publish(self) -> None:
        """Make `/metrics` describe this discovery: at once for the configuration at start,
        on its swap for a reloaded one (a pending configuration must not overwrite the
        gauges of the one in use), and again for the one kept after a failed reload."""
        self._published = True
        config = self._config
        metrics = self._metrics
        metrics.age.clear()
        metrics.held.clear()
        metrics.last_success.clear()
        self._aged = set()
        self._publish_backends()
        metrics.rules.labels("rules").set(len(config.rules))
        metrics.rules.labels("externalRules").set(len(config.external_rules))
        metrics.rules.labels("resourceRules").set(0 if config.resource_rules is None else 1)
        metrics.rule_metrics.clear()
        for relister in self.relisters:
            for rule in relister.registry.stats.rules:
                metrics.rule_metrics.labels(rule.rule).set(rule.metrics)
        self._publish_registry()

    def add(self, relister: Relister) -> None:
        self.relisters.append(relister)
        if self._published:
            self._publish_backends()

    def _publish_backends(self) -> None:
        """An age and a held series per backend (computed when scraped), from its first
        relister on."""
        for backend in {r.backend_label for r in self.relisters} - self._aged:
            self._aged.add(backend)
            self._metrics.age.labels(backend).set_function(functools.partial(self._age, backend))
            self._metrics.held.labels(backend).set_function(
                functools.partial(self._held_passes, backend))

    @property
    def registry(self) -> MetricRegistry:
        """The merged snapshot in use (replaced as a whole when any relister swaps)."""
        return self._registry

    @property
    def has_succeeded(self) -> bool:
        """Whether every relister has completed a pass (readiness waits for all), the
        namespaces' tenants included once listed (but not tenants added while serving)."""
        return self._tenants_synced and all(
            relister.has_succeeded for relister in self.relisters if relister.gates_readiness)

    @property
    def last_error(self) -> str | None:
        return next(iter(self.failures), None)

    def merge(self) -> None:
        """Rebuild the merged snapshot from the relisters' (called after each swap)."""
        registry = merge_registries([r.registry for r in self.relisters],
                                    catalog=self._catalog())
        self._registry = registry
        if self._published:
            self._publish_registry()

    def _publish_registry(self) -> None:
        registry = self._registry
        stats = registry.stats
        metrics = self._metrics
        self._publish_backends()
        for backend, built in self._oldest_snapshots().items():
            if built is not None:
                metrics.last_success.labels(backend).set(built)
        metrics.metrics.labels("custom").set(stats.custom_metrics)
        metrics.metrics.labels("external").set(stats.external_metrics)
        metrics.shapes.set(stats.series_shapes)

    def _oldest_snapshots(self) -> dict[str, float | None]:
        """Per backend, when the oldest of its relisters' snapshots was built (None while
        one of them has none yet)."""
        oldest: dict[str, float | None] = {}
        for relister in self.relisters:
            built = relister.registry.built_at
            backend = relister.backend_label
            stamp = built.timestamp() if built is not None else None
            if backend not in oldest:
                oldest[backend] = stamp
            else:
                known = oldest[backend]
                oldest[backend] = None if known is None or stamp is None else min(known, stamp)
        return oldest

    def _held_passes(self, backend: str) -> float:
        return max((r.held_passes for r in self.relisters if r.backend_label == backend),
                   default=0)

    @property
    def stale_reason(self) -> str | None:
        """Why the snapshot in use is older than the last pass, safe to show to anyone (no
        backend, tenant or error text): None when every last pass was swapped in."""
        failed = sum(1 for r in self.relisters if r.last_error is not None and r.has_succeeded)
        held = sum(1 for r in self.relisters if r.held_passes)
        if not (failed or held):
            return None
        total = len(self.relisters)
        parts = []
        if failed:
            whose = "" if total == 1 else f" for {failed} of {total} backends/tenants"
            parts.append(f"the last discovery pass failed{whose}")
        if held:
            whose = "" if total == 1 else f" for {held} of {total} backends/tenants"
            parts.append(f"the last discovery pass found far fewer series{whose} and is held")
        built = self._registry.built_at
        since = "" if built is None else f" (built {built.isoformat(timespec='seconds')})"
        return f"{'; '.join(parts)}; serving the last good snapshot{since}"

    def _age(self, backend: str) -> float:
        built = self._oldest_snapshots().get(backend)
        if built is None:
            return math.nan
        return max(0.0, self._clock() - built)

    async def step(self) -> bool:
        """One pass: the namespaces' tenants first (a new tenant gets its relister, a gone one
        loses it), then every relister, side by side; True if all of it succeeded."""
        synced = await self.sync_tenants(passed=True)
        results = await asyncio.gather(*(relister.step() for relister in self.relisters))
        return synced and all(results)

    async def sync_tenants(self, *, passed: bool) -> bool:
        """One pass of the tenants that follow the namespaces: relisters are added for new
        tenants (their loops started if `run()` runs: `passed` says their first pass is the
        caller's to run) and removed for gone ones; False if the namespaces could not be read.
        """
        if self._tenants is None:
            return True
        async with self._tenant_lock:
            changes = await self._tenants.sync()
            if changes is None:
                return False
            for relister in changes.removed:
                with contextlib.suppress(ValueError):
                    self.relisters.remove(relister)
                loop = self._loops.pop(relister, None)
                if loop is not None:
                    loop.cancel()
            for relister in changes.added:
                # Tenants found while serving do not hold readiness back.
                relister.gates_readiness = not self._tenants_synced
                relister.on_swap = self.merge
                self.relisters.append(relister)
                if self._group is not None:
                    self._start(self._group, relister, passed=passed)
            self._tenants_synced = True
            if changes.removed:
                self.merge()
            return True

    def _start(self, group: asyncio.TaskGroup, relister: Relister, *, passed: bool) -> None:
        task = group.create_task(relister.run(passed=passed), name=relister.name)
        self._loops[relister] = task
        task.add_done_callback(lambda _: self._loops.pop(relister, None))

    @property
    def failures(self) -> list[str]:
        """`name: why` of each relister whose last pass failed (and of the tenant pass)."""
        failed = [f"{r.name}: {r.last_error}" for r in self.relisters
                  if r.last_error is not None]
        if self._tenants is not None and self._tenants.last_error is not None:
            failed.insert(0, f"{self._tenants.name}: {self._tenants.last_error}")
        return failed

    async def _run_tenants(self, tenants: TenantSync, *, passed: bool) -> NoReturn:
        if passed:
            await self._sleep(tenants.next_delay())
        while True:
            # A new tenant's loop makes its first pass at once.
            await self.sync_tenants(passed=False)
            await self._sleep(tenants.next_delay())

    async def run(self, *, passed: bool = False) -> NoReturn:
        """Every relister's loop, and the tenants' (which adds and ends relisters' loops); an
        unexpected exit of one ends them all (and is raised).

        `passed`: `step()` has just run (a reloaded configuration's first pass)."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                for relister in self.relisters:
                    self._start(group, relister, passed=passed)
                if self._tenants is not None:
                    group.create_task(self._run_tenants(self._tenants, passed=passed),
                                      name=self._tenants.name)
        finally:
            self._group = None
        raise RuntimeError("discovery loops ended")  # pragma: no cover - they never return
