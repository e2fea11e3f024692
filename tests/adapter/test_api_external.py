"""external.metrics.k8s.io over HTTPS: names matched without regard to case, selectors on the
metric's own labels, `namespaced: false`, scalar answers, errors and empty answers."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import ExporterPool, PrometheusServer
from tests.adapter.cluster import ModuleCluster
from tests.adapter.harness import (
    HPA_ACCEPT,
    RFC3339_SECONDS,
    RunningAdapter,
    running_adapter,
    wait_for_series,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.asyncio(loop_scope="module")]

EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"

CONFIG = """
rules: []
externalRules:
- seriesQuery: '{{__name__="eapi_queue_messages_ready",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (queue)'
- seriesQuery: '{{__name__="eapi_queue_length",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
  name:
    matches: '^eapi_queue_length$'
    as: 'queueLength'
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (queue)'
- seriesQuery: '{{__name__="eapi_consumer_lag",job="{job}"}}'
  resources:
    namespaced: false
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (namespace, topic)'
- seriesQuery: '{{__name__="eapi_backlog",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
  metricsQuery: 'scalar(sum(<<.Series>>{{<<.LabelMatchers>>}}))'
- seriesQuery: '{{__name__="eapi_unmapped",job="{job}"}}'
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}})'
"""


@dataclass
class World:
    adapter: RunningAdapter
    exporter: Exporter


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(cluster: ModuleCluster, prometheus: PrometheusServer,
                exporter_pool: ExporterPool,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    workdir = tmp_path_factory.mktemp("external-api")
    with exporter_pool.exporter() as exporter:
        for namespace, queue, value in (("shop", "orders", 1200), ("shop", "orders-retry", 35),
                                        ("other", "orders", 5)):
            exporter.set("eapi_queue_messages_ready",
                         {"namespace": namespace, "queue": queue, "vhost": "/"}, value)
        exporter.set("eapi_queue_length", {"namespace": "shop", "queue": "orders"}, 0.5)
        exporter.set("eapi_consumer_lag", {"namespace": "kafka", "topic": "orders"}, 17)
        exporter.set("eapi_consumer_lag", {"namespace": "shop", "topic": "orders"}, 3)
        exporter.set("eapi_backlog", {"namespace": "shop", "queue": "a"}, 2)
        exporter.set("eapi_backlog", {"namespace": "shop", "queue": "b"}, 3)
        exporter.set("eapi_unmapped", {"queue": "a"}, 1)
        await wait_for_series(prometheus, f'{{job="{exporter.job}",__name__=~"eapi_.*"}}', 9)
        # External metrics name no objects: the cluster is only the adapter's to connect to.
        async with running_adapter(
                workdir=workdir / "adapter", config_text=CONFIG.format(job=exporter.job),
                prometheus_url=prometheus.url,
                kubeconfig=cluster.adapter_kubeconfig()) as adapter:
            yield World(adapter, exporter)


def external_items(body: dict[str, object]) -> list[dict[str, object]]:
    assert body["kind"] == "ExternalMetricValueList"
    assert body["apiVersion"] == "external.metrics.k8s.io/v1beta1"
    found = body["items"]
    assert isinstance(found, list)
    return found


async def test_items_carry_the_metric_labels_of_each_series(world: World) -> None:
    reply = await world.adapter.get(f"{EXTERNAL}/namespaces/shop/eapi_queue_messages_ready",
                                    accept=HPA_ACCEPT)
    assert reply.status == 200, reply
    assert reply.content_type == "application/json"
    found = external_items(reply.json())
    assert sorted((item["metricLabels"]["queue"], item["value"])  # type: ignore[index]
                  for item in found) == [("orders", "1200"), ("orders-retry", "35")]
    for item in found:
        assert item["metricName"] == "eapi_queue_messages_ready"
        assert re.match(RFC3339_SECONDS, str(item["timestamp"]))
        assert set(item) == {"metricName", "metricLabels", "timestamp", "value"}


async def test_label_selector_selects_among_the_metric_series(world: World) -> None:
    reply = await world.adapter.get(
        f"{EXTERNAL}/namespaces/shop/eapi_queue_messages_ready?labelSelector=queue%3Dorders")
    [item] = external_items(reply.json())
    assert item["metricLabels"] == {"queue": "orders"} and item["value"] == "1200"


async def test_the_request_namespace_scopes_a_namespaced_rule(world: World) -> None:
    reply = await world.adapter.get(f"{EXTERNAL}/namespaces/other/eapi_queue_messages_ready")
    [item] = external_items(reply.json())
    assert item["value"] == "5"


async def test_metric_names_match_without_regard_to_case(world: World) -> None:
    for written in ("queuelength", "queueLength", "QUEUELENGTH"):
        reply = await world.adapter.get(f"{EXTERNAL}/namespaces/shop/{written}")
        assert reply.status == 200, (written, reply)
        [item] = external_items(reply.json())
        assert item["metricName"] == "queueLength"
        assert item["value"] == "500m"


async def test_not_namespaced_rule_takes_the_namespace_from_the_selector(world: World) -> None:
    reply = await world.adapter.get(
        f"{EXTERNAL}/namespaces/shop/eapi_consumer_lag?labelSelector=namespace%3Dkafka")
    [item] = external_items(reply.json())
    assert item["metricLabels"] == {"namespace": "kafka", "topic": "orders"}
    assert item["value"] == "17"


async def test_a_scalar_answer_is_one_item_without_labels(world: World) -> None:
    reply = await world.adapter.get(f"{EXTERNAL}/namespaces/shop/eapi_backlog")
    [item] = external_items(reply.json())
    assert item["metricLabels"] == {} and item["value"] == "5"


async def test_discovery_lists_each_external_metric_as_namespaced(world: World) -> None:
    body = (await world.adapter.get(EXTERNAL)).json()
    assert body["groupVersion"] == "external.metrics.k8s.io/v1beta1"
    entries = {r["name"]: r for r in body["resources"]}
    assert set(entries) >= {"eapi_queue_messages_ready", "queueLength", "eapi_consumer_lag"}
    assert all(r["namespaced"] is True and r["kind"] == "ExternalMetricValueList"
               for r in entries.values())


async def test_custom_group_without_rules_publishes_the_placeholder(world: World) -> None:
    body = (await world.adapter.get("/apis/custom.metrics.k8s.io/v1beta2")).json()
    assert body["resources"] == [{"name": "/custommetrics", "singularName": "",
                                  "namespaced": False, "kind": "MetricValueList",
                                  "verbs": ["get"]}]


async def test_unknown_external_metric_is_404(world: World) -> None:
    reply = await world.adapter.get(f"{EXTERNAL}/namespaces/shop/nope")
    assert reply.status == 404
    assert reply.json()["message"] == "the server could not find the metric nope"


async def test_no_matching_series_is_404_saying_so(world: World) -> None:
    reply = await world.adapter.get(
        f"{EXTERNAL}/namespaces/shop/eapi_queue_messages_ready?labelSelector=queue%3Dnone")
    assert reply.status == 404
    assert reply.json()["message"] == ("the server could not find the metric "
                                       "eapi_queue_messages_ready: no series matched the query "
                                       "of externalRules[0]")


async def test_regex_characters_in_selector_values_match_literally(world: World) -> None:
    # prometheus-adapter sends queue=~"ord.rs", which would match "orders".
    reply = await world.adapter.get(
        f"{EXTERNAL}/namespaces/shop/eapi_queue_messages_ready"
        "?labelSelector=queue+in+%28ord.rs%29")
    assert reply.status == 404


async def test_bad_selector_is_400(world: World) -> None:
    reply = await world.adapter.get(
        f"{EXTERNAL}/namespaces/shop/eapi_queue_messages_ready?labelSelector=%21%21")
    assert reply.status == 400
    assert reply.json()["reason"] == "BadRequest"


async def test_rule_that_cannot_scope_to_the_namespace_is_a_500_that_says_why(
        world: World) -> None:
    reply = await world.adapter.get(f"{EXTERNAL}/namespaces/shop/eapi_unmapped")
    assert reply.status == 500
    body = reply.json()
    assert body["reason"] == "InternalError"
    assert "externalRules[4]" in body["message"]
    assert "Traceback" not in reply.text


@pytest.mark.parametrize("path", ["/namespaces/shop", "/eapi_backlog",
                                  "/namespaces/shop/eapi_backlog/extra"])
async def test_other_shapes_are_404(world: World, path: str) -> None:
    reply = await world.adapter.get(EXTERNAL + path)
    assert reply.status == 404
    assert reply.json()["kind"] == "Status"


async def test_post_is_405(world: World) -> None:
    reply = await world.adapter.request(f"{EXTERNAL}/namespaces/shop/eapi_backlog",
                                        method="POST")
    assert reply.status == 405
