"""Metric relisting: `relist_once` (one pass over the series API) and the loop that swaps snapshots.

A pass sends one `/api/v1/series` request per distinct `seriesQuery`, all in parallel, with
`start = now - max-age`, and folds each streamed answer into series shapes (name + label
names) as it arrives, so memory follows metric names and label-name sets, never the number of
series. Only a pass where every call succeeded builds a new `MetricRegistry`, which replaces
the old one in a single assignment: requests see the old snapshot or the new one, never a mix.
A failed pass keeps the last good snapshot and is retried sooner than the interval.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import NoReturn, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from adapter.prometheus.client import PrometheusError
from adapter.rules.config import AdapterConfig
from adapter.rules.registry import MetricRegistry, SeriesShape, build_registry, empty_registry
from adapter.rules.resources import ResourceCatalog

__all__ = [
    "RelistFailed",
    "RelistMetrics",
    "Relister",
    "SeriesLister",
    "collect_shapes",
    "relist_once",
]

logger = logging.getLogger(__name__)

# First retry after a failed pass; doubled per consecutive failure, capped at the interval.
_FIRST_RETRY_SECONDS = 1.0


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
                      request_timeout: float | None = None) -> MetricRegistry:
    """One relisting pass; raises RelistFailed if any series call fails."""
    start = Decimal(str(now.timestamp())) - max_age
    queries = config.series_queries()
    interned: dict[frozenset[str], frozenset[str]] = {}
    try:
        async with asyncio.TaskGroup() as group:
            tasks = {query: group.create_task(
                collect_shapes(lister, query, start=start, request_timeout=request_timeout,
                               interned=interned),
                name=f"series {query}") for query in queries}
    except* PrometheusError as failures:
        first = failures.exceptions[0]
        raise RelistFailed(f"a series request failed: {first}") from first
    shapes = {query: task.result() for query, task in tasks.items()}
    return build_registry(config=config, series=shapes, catalog=catalog, now=now)


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

    @classmethod
    def register(cls, registry: CollectorRegistry) -> RelistMetrics:
        return cls(
            passes=Counter("metricscale_discovery_passes_total",
                           "Discovery passes, by result (success, failure).", ["result"],
                           registry=registry),
            duration=Histogram("metricscale_discovery_duration_seconds",
                               "Time of a discovery pass (failures included).",
                               registry=registry,
                               buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)),
            last_success=Gauge("metricscale_discovery_last_success_timestamp_seconds",
                               "Unix time of the last successful discovery pass (0: none yet).",
                               registry=registry),
            age=Gauge("metricscale_discovery_age_seconds",
                      "Seconds since the snapshot in use was built (NaN before the first).",
                      registry=registry),
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
        )


class Relister:
    """Holds the snapshot in use and runs the relist loop.

    Drive it with `step()` in tests (the clock and the sleep are injected), or `run()` as a
    guarded background task.
    """

    def __init__(self, *, config: AdapterConfig, lister: SeriesLister,
                 catalog: Callable[[], ResourceCatalog], interval: Decimal, max_age: Decimal,
                 metrics: RelistMetrics, timeout: float | None = None,
                 clock: Callable[[], float],
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
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
        self._registry = empty_registry(catalog())
        self._failures = 0
        self.last_error: str | None = None
        self.passes = 0
        metrics.age.set_function(self._age)
        metrics.rules.labels("rules").set(len(config.rules))
        metrics.rules.labels("externalRules").set(len(config.external_rules))
        metrics.rules.labels("resourceRules").set(0 if config.resource_rules is None else 1)
        for api in ("custom", "external"):
            metrics.metrics.labels(api).set(0)

    @property
    def registry(self) -> MetricRegistry:
        """The snapshot in use (replaced as a whole by a successful pass)."""
        return self._registry

    @property
    def has_succeeded(self) -> bool:
        """Whether a pass has ever completed (readiness waits for it)."""
        return self._registry.built_at is not None

    def _age(self) -> float:
        built = self._registry.built_at
        if built is None:
            return math.nan
        return max(0.0, self._clock() - built.timestamp())

    async def step(self) -> bool:
        """One pass: swap in the new snapshot on success, keep the old one on failure."""
        started = self._clock()
        now = datetime.fromtimestamp(started, tz=UTC)
        self.passes += 1
        try:
            registry = await relist_once(now, config=self._config, lister=self._lister,
                                         catalog=self._catalog(), max_age=self._max_age,
                                         request_timeout=self._timeout)
        except RelistFailed as error:
            self._failures += 1
            self.last_error = str(error)
            self._metrics.passes.labels("failure").inc()
            self._metrics.duration.observe(max(0.0, self._clock() - started))
            cause = error.__cause__
            detail = getattr(cause, "detail", "") or ""
            logger.warning("discovery pass failed (%d in a row), keeping the snapshot of %s: "
                           "%s %s", self._failures, self._built_at_text(), error, detail)
            return False
        self._registry = registry
        self._failures = 0
        self.last_error = None
        elapsed = max(0.0, self._clock() - started)
        self._record(registry, elapsed)
        return True

    def _built_at_text(self) -> str:
        built = self._registry.built_at
        return "nothing (no pass has succeeded yet)" if built is None else built.isoformat()

    def _record(self, registry: MetricRegistry, elapsed: float) -> None:
        stats = registry.stats
        metrics = self._metrics
        metrics.passes.labels("success").inc()
        metrics.duration.observe(elapsed)
        if registry.built_at is not None:
            metrics.last_success.set(registry.built_at.timestamp())
        metrics.metrics.labels("custom").set(stats.custom_metrics)
        metrics.metrics.labels("external").set(stats.external_metrics)
        metrics.shapes.set(stats.series_shapes)
        for rule in stats.rules:
            metrics.rule_metrics.labels(rule.rule).set(rule.metrics)
        for problem in stats.override_problems:
            logger.warning("discovery: %s", problem)
        logger.info("discovery pass took %.2fs: %d custom and %d external metrics from %d "
                    "series shapes", elapsed, stats.custom_metrics, stats.external_metrics,
                    stats.series_shapes)

    def next_delay(self) -> float:
        """Seconds until the next pass: the interval, or a shorter backoff after failures."""
        if self._failures == 0:
            return self._interval
        return min(self._interval, _FIRST_RETRY_SECONDS * 2.0 ** (self._failures - 1))

    async def run(self) -> NoReturn:
        """Pass, wait, pass... The interval counts from the end of one pass (as upstream)."""
        while True:
            await self.step()
            await self._sleep(self.next_delay())
