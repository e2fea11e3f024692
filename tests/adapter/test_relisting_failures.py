"""A discovery pass that cannot reach Prometheus is a plain RelistFailed on every interpreter we
ship, so the relist loop keeps the last good snapshot and retries instead of dying.

Before Python 3.11.4 an exception raised inside `except*` came out wrapped in an
ExceptionGroup; the image runs Debian's 3.11.2, where `except RelistFailed` missed it and the
first failed pass ended the adapter. These tests run on that interpreter too
(`make test-shipped`), against a real Prometheus that is stopped and started.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from adapter.prometheus.client import PrometheusClient, PrometheusUnavailable
from adapter.prometheus.relisting import (
    Relister,
    RelistFailed,
    Relisting,
    RelistMetrics,
    relist_once,
)
from adapter.rules.config import AdapterConfig, parse_config
from adapter.rules.resources import builtin_catalog
from adapter.settings import PrometheusSettings
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer
from testbed.fakes.prometheus_fixtures import PrometheusFactory

pytestmark = [pytest.mark.prometheus, pytest.mark.shipped_interpreter]

# Two rules, two series queries: two requests fail side by side, as in a real pass.
CONFIG = """
rules:
- seriesQuery: 'relist_requests'
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: 'relist_queue'
  resources: {overrides: {namespace: {resource: namespace}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)'
"""


def config() -> AdapterConfig:
    return parse_config(CONFIG)


@dataclass
class Backend:
    """A real Prometheus, not started yet, and the adapter's client of it."""

    server: PrometheusServer
    client: PrometheusClient


@pytest.fixture
async def backend(prometheus_factory: PrometheusFactory) -> AsyncIterator[Backend]:
    server = prometheus_factory(start=False)
    async with PrometheusClient(PrometheusSettings(url=server.url, timeout=5.0)) as client:
        yield Backend(server, client)


class Pacer:
    """The relist loop's sleep: records each delay and waits for the test's permit."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._changed = asyncio.Event()
        self._permits: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        self._changed.set()
        await self._permits.get()

    async def wait_for_sleeps(self, count: int, *, loop: asyncio.Task[Any]) -> None:
        """Until the loop has slept `count` times; fails at once if the loop ends instead."""
        while len(self.delays) < count:
            if loop.done():
                raise AssertionError(f"the discovery loop ended after {len(self.delays)} "
                                     f"passes: {loop!r}")
            self._changed.clear()
            changed = asyncio.create_task(self._changed.wait())
            await asyncio.wait({changed, loop}, return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()

    def permit(self) -> None:
        self._permits.put_nowait(None)


def relister(client: PrometheusClient, pacer: Pacer | None = None) -> Relister:
    return Relister(config=config(), lister=client, catalog=builtin_catalog,
                    interval=Decimal(60), max_age=Decimal(60),
                    metrics=RelistMetrics.register(CollectorRegistry()), clock=time.time,
                    **({"sleep": pacer.sleep} if pacer is not None else {}))


async def test_an_unreachable_prometheus_is_a_plain_relist_failed(backend: Backend) -> None:
    with pytest.raises(RelistFailed) as raised:
        await relist_once(datetime.now(UTC), config=config(), lister=backend.client,
                          catalog=builtin_catalog(), max_age=Decimal(60))
    # Exactly RelistFailed, not an ExceptionGroup holding one: `except RelistFailed` sees it.
    assert type(raised.value) is RelistFailed
    assert isinstance(raised.value.__cause__, PrometheusUnavailable)
    assert str(raised.value) == "a series request failed: Prometheus cannot be reached"


async def test_a_failed_pass_is_reported_not_raised(backend: Backend) -> None:
    one = relister(backend.client)
    assert await one.step() is False
    assert await one.step() is False
    assert one.last_error == "a series request failed: Prometheus cannot be reached"
    assert not one.has_succeeded
    assert one.next_delay() == 2.0  # the second failure in a row: 1 s, doubled


async def test_the_relist_loop_retries_until_prometheus_answers(backend: Backend) -> None:
    pacer = Pacer()
    one = relister(backend.client, pacer)
    discovery = Relisting(config=config(), catalog=builtin_catalog,
                          metrics=RelistMetrics.register(CollectorRegistry()), clock=time.time)
    one.on_swap = discovery.merge  # as adapter.http.snapshots wires it
    discovery.add(one)
    loop = asyncio.create_task(discovery.run())
    try:
        for passes in (1, 2, 3):
            await pacer.wait_for_sleeps(passes, loop=loop)
            assert not loop.done(), loop
            pacer.permit()
        await pacer.wait_for_sleeps(4, loop=loop)
        assert pacer.delays == [1.0, 2.0, 4.0, 8.0]  # backing off, never giving up
        assert discovery.failures == [
            "discovery: a series request failed: Prometheus cannot be reached"]
        with Exporter() as exporter:
            exporter.set("relist_requests", {"namespace": "shop", "pod": "web-0"}, 1)
            await asyncio.to_thread(backend.server.start)
            backend.server.add_target(exporter)
            await backend.server.wait_for_scrape_async(exporter, series="relist_requests")
            pacer.permit()
            await pacer.wait_for_sleeps(5, loop=loop)
        assert not loop.done(), loop
        assert discovery.has_succeeded and discovery.failures == []
        assert pacer.delays[-1] == 60.0  # back to the interval
        assert {key.api_name for key in discovery.registry.custom_metrics()} == {
            "pods/relist_requests", "namespaces/relist_requests"}
    finally:
        loop.cancel()
        await asyncio.wait({loop})
        if not loop.cancelled():
            loop.exception()  # a loop that died is reported by the assertion above
