"""When Prometheus goes away: 503 Status bodies (never a traceback or backend detail), a failed
relist keeps the last good snapshot, and readiness waits for the first discovery pass."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer
from tests.adapter.cluster import ModuleCluster, Names, Objects, pod_manifest
from tests.adapter.harness import RunningAdapter, running_adapter, wait_for_series

# Also run on the image's Python (make test-shipped): a failed pass must not end the loop there.
pytestmark = [pytest.mark.prometheus, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.shipped_interpreter]

CONFIG = """
rules:
- seriesQuery: 'down_requests'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: 'down_queue'
  resources:
    overrides:
      namespace: {resource: namespace}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)'
resourceRules:
  cpu:
    containerQuery: 'sum(down_cpu{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(down_cpu{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod},
                            node: {resource: node}}}
    containerLabel: container
  memory:
    containerQuery: 'sum(down_memory{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(down_memory{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod},
                            node: {resource: node}}}
    containerLabel: container
  window: 1m
"""
NAMES = Names.unique("down")
SHOP = NAMES.namespace("shop")
POD_METRIC = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{SHOP}/pods/web-0/down_requests"
EXTERNAL_METRIC = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{SHOP}/down_queue"
POD_USAGE = f"/apis/metrics.k8s.io/v1beta1/namespaces/{SHOP}/pods"


@dataclass
class World:
    prometheus: PrometheusServer
    cluster: ModuleCluster
    workdir: Path


@pytest.fixture(scope="module")
def private_prometheus(prometheus_binary: str) -> Iterator[PrometheusServer]:
    """A Prometheus of this module's own: the tests stop and start it."""
    with PrometheusServer(binary=prometheus_binary) as server, Exporter() as exporter:
        exporter.set("down_requests", {"namespace": SHOP, "pod": "web-0"}, 3)
        exporter.set("down_queue", {"namespace": SHOP, "queue": "q"}, 8)
        usage = {"namespace": SHOP, "pod": "web-0", "container": "app"}
        exporter.set("down_cpu", usage, 0.5)
        exporter.set("down_memory", usage, 1024)
        server.add_target(exporter)
        server.wait_for('{__name__=~"down_.*"}', lambda samples: len(samples) == 4, timeout=120)
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(cluster: ModuleCluster, private_prometheus: PrometheusServer,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    workdir = tmp_path_factory.mktemp("prometheus-down")
    cluster.namespace("shop")
    async with Objects(cluster.control_plane) as objects:
        await objects.run(pod_manifest("web-0", SHOP))  # Running, as metrics.k8s.io serves
    yield World(private_prometheus, cluster, workdir)


@pytest_asyncio.fixture(loop_scope="module")
async def adapter(world: World) -> AsyncIterator[RunningAdapter]:
    if not world.prometheus.running:
        world.prometheus.start()
    await wait_for_series(world.prometheus, '{__name__=~"down_.*"}', 4)
    async with running_adapter(workdir=world.workdir / "adapter", config_text=CONFIG,
                               prometheus_url=world.prometheus.url,
                               kubeconfig=world.cluster.adapter_kubeconfig()) as running:
        yield running


def assert_safe(body_text: str, prometheus: PrometheusServer) -> None:
    assert "Traceback" not in body_text
    assert str(prometheus.port) not in body_text
    assert "127.0.0.1" not in body_text


async def test_requests_while_prometheus_is_down_are_503_status(
        world: World, adapter: RunningAdapter) -> None:
    assert (await adapter.get(POD_METRIC)).status == 200
    assert (await adapter.get(POD_USAGE)).json()["items"][0]["containers"] == [
        {"name": "app", "usage": {"cpu": "500m", "memory": "1Ki"}}]
    world.prometheus.stop()
    for path in (POD_METRIC, EXTERNAL_METRIC, POD_USAGE, f"{POD_USAGE}/web-0"):
        reply = await adapter.get(path)
        assert reply.status == 503, reply
        body = reply.json()
        assert body["kind"] == "Status" and body["reason"] == "ServiceUnavailable"
        assert body["details"] == {"retryAfterSeconds": 5}
        assert body["message"].startswith("unable to fetch metrics: ")
        assert_safe(reply.text, world.prometheus)
    text = (await adapter.get("/metrics")).text
    assert ('metricscale_prometheus_request_errors_total{backend="default",endpoint="query",'
            'reason="connection"}') in text


async def test_failed_relist_keeps_the_last_good_snapshot(
        world: World, adapter: RunningAdapter) -> None:
    before = adapter.relister.registry
    assert before.stats.custom_metrics == 2
    world.prometheus.stop()
    assert await adapter.relister.step() is False
    assert adapter.relister.registry is before
    listing = (await adapter.get("/apis/custom.metrics.k8s.io/v1beta2")).json()
    assert {r["name"] for r in listing["resources"]} == {"pods/down_requests",
                                                         "namespaces/down_requests"}
    assert (await adapter.get("/readyz")).status == 200
    # Still ready on the last good snapshot, and ?verbose says why (nothing of the backend).
    verbose = (await adapter.get("/readyz?verbose")).text
    assert ("[+]metric-discovery ok: the last discovery pass failed; serving the last good "
            f"snapshot (built {before.built_at.isoformat(timespec='seconds')})\n") in verbose
    assert_safe(verbose, world.prometheus)
    text = (await adapter.get("/metrics")).text
    assert 'metricscale_discovery_passes_total{backend="default",result="failure"} 1.0' in text
    world.prometheus.start()
    assert await adapter.relister.step() is True
    assert "[+]metric-discovery ok\n" in (await adapter.get("/readyz?verbose")).text
    assert adapter.relister.registry is not before
    assert (await adapter.get(POD_METRIC)).status == 200


async def test_not_ready_until_the_first_discovery_pass(world: World) -> None:
    world.prometheus.stop()
    async with running_adapter(workdir=world.workdir / "cold", config_text=CONFIG,
                               prometheus_url=world.prometheus.url,
                               kubeconfig=world.cluster.adapter_kubeconfig(),
                               wait_ready=False) as cold:
        reply = await cold.get("/readyz?verbose")
        assert reply.status == 500
        assert "[-]metric-discovery failed: reason withheld\n" in reply.text
        assert reply.text.endswith("readyz check failed\n")
        assert (await cold.get("/livez")).status == 200
        early = await cold.get(POD_METRIC)
        assert early.status == 503
        assert "discovery has not completed" in early.json()["message"]
        world.prometheus.start()
        await cold.wait_ready(within=120)  # the loop retries after 1 s, 2 s, 4 s...
        assert (await cold.get(POD_METRIC)).status == 200
