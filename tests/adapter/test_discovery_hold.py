"""A discovery pass that finds far fewer series than the snapshot in use is held, not swapped
in: after a real Prometheus restart that lost its data, the pass before its first scrape finds
nothing, and the metrics stay listed until the series are back (or the drop lasts a relist
interval, when it is real). See adapter/prometheus/relisting.py and docs/adapter-discovery.md.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from adapter.prometheus.relisting import Relisting
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer
from testbed.fakes.prometheus_fixtures import PrometheusFactory
from tests.adapter.cluster import ModuleCluster, Names, pod_manifest
from tests.adapter.harness import RunningAdapter, running_adapter, wait_for_series

pytestmark = [pytest.mark.prometheus, pytest.mark.shipped_interpreter]

NAMES = Names.unique("hold")
SHOP = NAMES.namespace("shop")
CONFIG = """
rules:
- seriesQuery: 'hold_requests'
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
- seriesQuery: 'hold_errors'
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: 'hold_queue'
  resources: {overrides: {namespace: {resource: namespace}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)'
"""
CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"
ALL_SERIES = '{__name__=~"hold_.*"}'
RELIST_INTERVAL = 3600.0  # the harness' --metrics-relist-interval (1h): tests drive the passes


@dataclass
class Clock:
    """The adapter's wall clock, moved forward by the test (discovery reads no other)."""

    offset: float = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@dataclass
class World:
    prometheus: PrometheusServer
    exporter: Exporter
    adapter: RunningAdapter
    clock: Clock

    @property
    def discovery(self) -> Relisting:
        return self.adapter.relister

    async def restart_prometheus_without_its_data(self) -> None:
        """Kill Prometheus, and bring it back empty (a pod without a volume) with the exporter
        left out until `first_scrape()`, so the next pass comes before its first scrape."""
        server = self.prometheus
        await asyncio.to_thread(server.stop)
        server.remove_target(self.exporter)
        shutil.rmtree(server.data_dir)
        await asyncio.to_thread(server.start)

    async def first_scrape(self) -> None:
        self.prometheus.add_target(self.exporter)
        await wait_for_series(self.prometheus, ALL_SERIES, 5)

    async def metric_names(self) -> set[str]:
        custom = (await self.adapter.get(CUSTOM)).json()["resources"]
        external = (await self.adapter.get(EXTERNAL)).json()["resources"]
        # The placeholders listed when an API has no metric (what kubectl needs) are left out.
        return {resource["name"] for resource in [*custom, *external]} - {
            "/custommetrics", "externalmetrics"}

    async def metrics_text(self) -> str:
        return (await self.adapter.get("/metrics")).text


@pytest_asyncio.fixture
async def world(cluster: ModuleCluster, prometheus_factory: PrometheusFactory,
                tmp_path: Path) -> AsyncIterator[World]:
    with Exporter() as exporter:
        for pod in ("web-0", "web-1"):
            exporter.set("hold_requests", {"namespace": SHOP, "pod": pod}, 3)
            exporter.set("hold_errors", {"namespace": SHOP, "pod": pod}, 1)
        exporter.set("hold_queue", {"namespace": SHOP, "queue": "q"}, 8)
        server = prometheus_factory()
        server.add_target(exporter)
        await wait_for_series(server, ALL_SERIES, 5)
        clock = Clock()
        cluster.control_plane.apply(pod_manifest("web-0", cluster.namespace("shop")))
        async with running_adapter(workdir=tmp_path / "adapter", config_text=CONFIG,
                                   prometheus_url=server.url, clock=clock,
                                   kubeconfig=cluster.adapter_kubeconfig()) as adapter:
            yield World(server, exporter, adapter, clock)


EVERY_METRIC = {"pods/hold_requests", "namespaces/hold_requests", "pods/hold_errors",
                "namespaces/hold_errors", "hold_queue"}


async def test_an_empty_pass_after_a_restart_is_held_until_the_series_are_back(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    before = world.discovery.registry
    assert await world.metric_names() == EVERY_METRIC
    # Down first: the pass fails and the snapshot in use stays, as before this change.
    await asyncio.to_thread(world.prometheus.stop)
    assert await world.discovery.step() is False
    assert world.discovery.registry is before
    # Back, empty, before its first scrape: the pass succeeds with nothing, and is held.
    await world.restart_prometheus_without_its_data()
    with caplog.at_level(logging.WARNING, logger="adapter.prometheus.relisting"):
        assert await world.discovery.step() is False
    assert world.discovery.registry is before
    assert await world.metric_names() == EVERY_METRIC
    assert ("discovery of backend 'default': pass found 0 series shapes against 3 in the "
            "snapshot in use (1 held in a row)") in caplog.text
    relister = world.discovery.relisters[0]
    assert relister.next_delay() == 1.0  # retried soon, as after a failure
    verbose = (await world.adapter.get("/readyz?verbose")).text
    assert "[+]metric-discovery ok: the last discovery pass found far fewer series and is " \
        "held; serving the last good snapshot (built " in verbose
    assert (await world.adapter.get("/readyz")).status == 200
    text = await world.metrics_text()
    assert 'metricscale_discovery_passes_total{backend="default",result="held"} 1.0' in text
    assert 'metricscale_discovery_held_passes{backend="default"} 1.0' in text
    # The first scrape brings the series back: the next pass is swapped in at once.
    await world.first_scrape()
    assert await world.discovery.step() is True
    assert world.discovery.registry is not before
    assert await world.metric_names() == EVERY_METRIC
    assert relister.next_delay() == RELIST_INTERVAL
    assert "[+]metric-discovery ok\n" in (await world.adapter.get("/readyz?verbose")).text
    text = await world.metrics_text()
    assert 'metricscale_discovery_held_passes{backend="default"} 0.0' in text


async def test_a_drop_that_lasts_a_relist_interval_is_swapped_in(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    await world.restart_prometheus_without_its_data()
    assert await world.discovery.step() is False
    assert await world.discovery.step() is False  # still within the interval: held again
    assert world.discovery.relisters[0].held_passes == 2
    assert await world.metric_names() == EVERY_METRIC
    world.clock.offset += RELIST_INTERVAL
    with caplog.at_level(logging.WARNING, logger="adapter.prometheus.relisting"):
        assert await world.discovery.step() is True
    assert ("discovery of backend 'default': the drop to 0 series shapes (from 3) has lasted "
            "a relist interval (2 passes held): swapping it in") in caplog.text
    assert await world.metric_names() == set()
    text = await world.metrics_text()
    assert 'metricscale_discovery_passes_total{backend="default",result="held"} 2.0' in text
    assert 'metricscale_discovery_held_passes{backend="default"} 0.0' in text


async def test_a_smaller_drop_is_swapped_in_at_once(world: World) -> None:
    """Half the series or more: an ordinary change (a workload scaled in), not a restart."""
    await asyncio.to_thread(world.prometheus.stop)
    world.prometheus.remove_target(world.exporter)
    shutil.rmtree(world.prometheus.data_dir)
    world.exporter.remove("hold_queue", {"namespace": SHOP, "queue": "q"})
    await asyncio.to_thread(world.prometheus.start)
    world.prometheus.add_target(world.exporter)
    await wait_for_series(world.prometheus, ALL_SERIES, 4)
    assert await world.discovery.step() is True  # 2 shapes of 3: swapped in
    assert await world.metric_names() == EVERY_METRIC - {"hold_queue"}
