"""Discovery documents, aggregated discovery, OpenAPI, /version, health endpoints, /metrics and
the 404/405 forms, as aggregation-contract.md §5-§7 and §10 describe them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from testbed.fakes.prometheus import ExporterPool, PrometheusServer
from tests.adapter.cluster import ModuleCluster, Names, Objects, pod_manifest
from tests.adapter.harness import RunningAdapter, running_adapter, wait_for_series

pytestmark = [pytest.mark.prometheus, pytest.mark.asyncio(loop_scope="module")]

NAMES = Names.unique("dapi")
SHOP = NAMES.namespace("shop")
AGGREGATOR_ACCEPT = ("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
                     "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList")
V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"

CONFIG = """
rules:
- seriesQuery: '{{__name__="dapi_requests",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: '{{__name__="dapi_queue",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (queue)'
"""

GROUPS = [
    {"name": "custom.metrics.k8s.io",
     "versions": [{"groupVersion": "custom.metrics.k8s.io/v1beta2", "version": "v1beta2"},
                  {"groupVersion": "custom.metrics.k8s.io/v1beta1", "version": "v1beta1"}],
     "preferredVersion": {"groupVersion": "custom.metrics.k8s.io/v1beta2",
                          "version": "v1beta2"}},
    {"name": "external.metrics.k8s.io",
     "versions": [{"groupVersion": "external.metrics.k8s.io/v1beta1", "version": "v1beta1"}],
     "preferredVersion": {"groupVersion": "external.metrics.k8s.io/v1beta1",
                          "version": "v1beta1"}},
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def adapter(cluster: ModuleCluster, prometheus: PrometheusServer,
                  exporter_pool: ExporterPool,
                  tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningAdapter]:
    workdir = tmp_path_factory.mktemp("discovery-api")
    with exporter_pool.exporter() as exporter:
        exporter.set("dapi_requests", {"namespace": SHOP, "pod": "web-0"}, 1)
        exporter.set("dapi_queue", {"namespace": SHOP, "queue": "q"}, 1)
        await wait_for_series(prometheus, f'{{job="{exporter.job}",__name__=~"dapi_.*"}}', 2)
        cluster.namespace("shop")
        async with Objects(cluster.control_plane) as objects:
            await objects.create(pod_manifest("web-0", SHOP, labels={"app": "web"}))
        async with running_adapter(
                workdir=workdir / "adapter", config_text=CONFIG.format(job=exporter.job),
                prometheus_url=prometheus.url,
                kubeconfig=cluster.adapter_kubeconfig()) as running:
            yield running


# ------------------------------------------------------------------------------ discovery


@pytest.mark.parametrize("accept", [None, "application/json", "*/*",
                                    "application/json, */*", "application/vnd.kubernetes."
                                    "protobuf, */*"])
async def test_apis_is_the_plain_group_list(adapter: RunningAdapter, accept: str | None) -> None:
    reply = await adapter.get("/apis", accept=accept)
    assert reply.status == 200
    assert reply.content_type == "application/json"
    assert reply.json() == {"kind": "APIGroupList", "apiVersion": "v1", "groups": GROUPS}


async def test_apis_with_the_aggregators_accept_is_a_v2_discovery_document(
        adapter: RunningAdapter) -> None:
    reply = await adapter.get("/apis", accept=AGGREGATOR_ACCEPT)
    assert reply.status == 200
    assert reply.content_type == V2
    assert reply.headers["Vary"] == "Accept"
    body = reply.json()
    assert (body["kind"], body["apiVersion"]) == ("APIGroupDiscoveryList",
                                                  "apidiscovery.k8s.io/v2")
    by_group = {item["metadata"]["name"]: item for item in body["items"]}
    custom = by_group["custom.metrics.k8s.io"]
    assert [v["version"] for v in custom["versions"]] == ["v1beta2", "v1beta1"]
    pods = next(r for r in custom["versions"][0]["resources"] if r["resource"] == "pods")
    assert pods["scope"] == "Namespaced"
    assert pods["responseKind"] == {"group": "", "version": "", "kind": ""}
    assert pods["subresources"] == [{
        "subresource": "dapi_requests",
        "responseKind": {"group": "", "version": "", "kind": "MetricValueList"},
        "verbs": ["get"]}]
    [external] = by_group["external.metrics.k8s.io"]["versions"]
    assert external["freshness"] == "Current"
    assert external["resources"][0]["resource"] == "dapi_queue"
    assert external["resources"][0]["responseKind"]["kind"] == "ExternalMetricValueList"


async def test_apis_with_only_v2beta1_gets_v2beta1(adapter: RunningAdapter) -> None:
    reply = await adapter.get("/apis", accept=V2BETA1)
    assert reply.content_type == V2BETA1
    assert reply.json()["apiVersion"] == "apidiscovery.k8s.io/v2beta1"


async def test_apis_with_nothing_servable_is_406(adapter: RunningAdapter) -> None:
    reply = await adapter.get("/apis", accept="application/yaml")
    assert reply.status == 406
    assert reply.json()["message"] == ("only the following media types are accepted: "
                                       "application/json")


@pytest.mark.parametrize("path", ["/apis/custom.metrics.k8s.io",
                                  "/apis/custom.metrics.k8s.io/"])
async def test_group_document(adapter: RunningAdapter, path: str) -> None:
    reply = await adapter.get(path)
    assert reply.json() == {"kind": "APIGroup", "apiVersion": "v1", **GROUPS[0]}


@pytest.mark.parametrize("path", ["/apis/custom.metrics.k8s.io/v1beta1",
                                  "/apis/custom.metrics.k8s.io/v1beta2/",
                                  "/apis/external.metrics.k8s.io/v1beta1/"])
async def test_every_group_version_answers_its_resource_list(adapter: RunningAdapter,
                                                             path: str) -> None:
    reply = await adapter.get(path + "?timeout=32s")
    assert reply.status == 200
    body = reply.json()
    assert body["kind"] == "APIResourceList" and body["apiVersion"] == "v1"
    assert body["groupVersion"] == path.removeprefix("/apis/").rstrip("/")
    assert body["resources"], "an empty list makes client-go fail discovery"


async def test_aggregator_availability_check_gets_a_2xx(adapter: RunningAdapter) -> None:
    reply = await adapter.get("/apis/custom.metrics.k8s.io/v1beta2",
                              headers={"X-Remote-User": "system:kube-aggregator",
                                       "X-Remote-Group": "system:masters"})
    assert reply.status == 200


# ------------------------------------------------------------------------------ 404 and 405


@pytest.mark.parametrize("path", ["/foo", "/openapi/v3", "/apisx"])
async def test_paths_outside_the_api_are_plain_404(adapter: RunningAdapter, path: str) -> None:
    reply = await adapter.get(path)
    assert reply.status == 404
    assert reply.text == "404 page not found\n"
    assert reply.content_type.startswith("text/plain")


@pytest.mark.parametrize("path", ["/api", "/api/v1/pods", "/apis/apps/v1",
                                  "/apis/custom.metrics.k8s.io/v1"])
async def test_paths_inside_the_api_are_status_404(adapter: RunningAdapter, path: str) -> None:
    reply = await adapter.get(path)
    assert reply.status == 404
    assert reply.json()["kind"] == "Status"
    assert reply.json()["reason"] == "NotFound"


@pytest.mark.parametrize("path", ["/apis", "/apis/custom.metrics.k8s.io/v1beta2",
                                  "/apis/external.metrics.k8s.io/v1beta1"])
async def test_non_get_on_served_paths_is_405_status(adapter: RunningAdapter, path: str) -> None:
    reply = await adapter.request(path, method="DELETE")
    assert reply.status == 405
    assert reply.json() == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "reason": "MethodNotAllowed", "details": {},
                            "code": 405, "message": "the server does not allow this method "
                                                    "on the requested resource"}


# ------------------------------------------------------------------------------ OpenAPI, version


async def test_openapi_v2_is_a_minimal_valid_swagger_document(adapter: RunningAdapter) -> None:
    reply = await adapter.get("/openapi/v2", accept="application/json")
    body = reply.json()
    assert reply.status == 200
    assert body["swagger"] == "2.0" and body["paths"] == {} and body["info"]["title"]


async def test_version_has_the_kubernetes_version_fields(adapter: RunningAdapter) -> None:
    body = (await adapter.get("/version")).json()
    assert set(body) == {"major", "minor", "gitVersion", "gitCommit", "gitTreeState",
                         "buildDate", "goVersion", "compiler", "platform"}
    assert body["gitVersion"].startswith("v")


# ------------------------------------------------------------------------------ health


@pytest.mark.parametrize("endpoint", ["healthz", "livez", "readyz"])
async def test_health_endpoints_answer_ok(adapter: RunningAdapter, endpoint: str) -> None:
    reply = await adapter.get(f"/{endpoint}")
    assert (reply.status, reply.text) == (200, "ok")
    assert reply.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert reply.headers["X-Content-Type-Options"] == "nosniff"


async def test_readyz_verbose_lists_every_check(adapter: RunningAdapter) -> None:
    reply = await adapter.get("/readyz?verbose")
    assert reply.text == ("[+]ping ok\n[+]metric-discovery ok\n[+]shutdown ok\n"
                          "[+]informers ok\nreadyz check passed\n")


async def test_livez_verbose_and_exclusions(adapter: RunningAdapter) -> None:
    assert (await adapter.get("/livez?verbose=1")).text == "[+]ping ok\nlivez check passed\n"
    reply = await adapter.get("/readyz?verbose&exclude=shutdown&exclude=nope")
    assert "[+]shutdown excluded: ok\n" in reply.text
    assert 'warn: some health checks cannot be excluded: no matches for "nope"\n' in reply.text


async def test_single_checks_have_their_own_path(adapter: RunningAdapter) -> None:
    assert (await adapter.get("/readyz/metric-discovery")).text == "ok"
    assert (await adapter.get("/readyz/nope")).status == 404


# ------------------------------------------------------------------------------ /metrics


async def test_metrics_expose_requests_prometheus_discovery_and_rules(
        adapter: RunningAdapter) -> None:
    await adapter.get(f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{SHOP}/pods/*/dapi_requests")
    reply = await adapter.get("/metrics")
    assert reply.status == 200
    assert reply.content_type.startswith("text/plain")
    text = reply.text
    for expected in (
            'metricscale_http_requests_total{code="200",method="GET",route="custom_metric"}',
            'metricscale_http_request_duration_seconds_bucket{le="0.001",route="custom_metric"}',
            'metricscale_prometheus_request_duration_seconds_count{backend="default",endpoint="query"}',
            'metricscale_prometheus_request_duration_seconds_count{backend="default",endpoint="series"}',
            'metricscale_discovery_passes_total{backend="default",result="success"} 1.0',
            'metricscale_discovery_duration_seconds_count',
            'metricscale_discovery_last_success_timestamp_seconds',
            'metricscale_discovery_age_seconds',
            'metricscale_discovered_metrics{api="custom"} 2.0',
            'metricscale_discovered_metrics{api="external"} 1.0',
            'metricscale_rules{section="rules"} 1.0',
            'metricscale_rules{section="externalRules"} 1.0',
            'metricscale_rule_discovered_metrics{rule="rules[0]"} 2.0',
            'metricscale_kube_discovery_resources',
            'process_resident_memory_bytes'):
        assert expected in text, expected


async def test_errors_are_counted_by_code(adapter: RunningAdapter) -> None:
    await adapter.get(f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{SHOP}/pods/*/nope")
    text = (await adapter.get("/metrics")).text
    assert 'metricscale_http_requests_total{code="404",method="GET",route="custom_metric"}' \
        in text
