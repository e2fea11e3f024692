"""custom.metrics.k8s.io over HTTPS: every route shape in both versions, the rule features,
errors, empty answers that say why, hostile values, 2,000-pod selectors and shared queries.

One adapter serves the whole module, against the session's real Prometheus (scraping an
exporter of this module's own job) and the session's real control plane holding the described
objects (namespaces, nodes and a CRD group of the module's own names; the adapter under its
manifests' RBAC, with the Widget CRD added as the manifests say to).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from adapter.http.app import METRICS_REGISTRY_KEY
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import ExporterPool, PrometheusServer
from tests.adapter.cluster import ModuleCluster, Names, Objects, node_manifest, pod_manifest
from tests.adapter.harness import (
    HPA_ACCEPT,
    RFC3339_SECONDS,
    RunningAdapter,
    running_adapter,
    wait_for_series,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.asyncio(loop_scope="module")]

NAMES = Names.unique("capi")
SHOP, OTHER, BIG, KUBELABELS = (NAMES.namespace(n) for n in ("shop", "other", "big", "kubelabels"))
NODE_1, NODE_2 = NAMES.cluster("node-1"), NAMES.cluster("node-2")
GROUP = f"{NAMES.prefix}.example.com"  # the Widget CRD's group, the module's own
W1 = NAMES.cluster("w1")
CUSTOM = "/apis/custom.metrics.k8s.io"
VERSIONS = ("v1beta1", "v1beta2")
BIG_PODS = 2000

CONFIG = """
rules:
# Plain gauges on pods, with overrides (the walkthrough's shape).
- seriesQuery: '{{__name__=~"capi_requests|capi_big",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
# Nodes (cluster-scoped) and a cluster-scoped CRD, found through overrides.
- seriesQuery: '{{__name__=~"capi_node_temperature|capi_widget_load",job="{job}"}}'
  resources:
    overrides:
      node: {{resource: node}}
      widget: {{group: {group}, resource: widget}}
  metricsQuery: 'max(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
# A template with the group: kube_apps_deployment -> deployments.apps.
- seriesQuery: '{{__name__="capi_deploy_rps",job="{job}"}}'
  resources:
    template: 'kube_<<.Group>>_<<.Resource>>'
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
# seriesFilters and name matches/as: counters renamed, seconds counters filtered out.
- seriesQuery: '{{__name__=~"capi_jobs_.*_total",job="{job}"}}'
  seriesFilters:
  - isNot: '_seconds_total$'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  name:
    matches: '^capi_(.*)_total$'
    as: '${{1}}_per_second'
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
# .LabelValuesByName and .GroupBySlice instead of .LabelMatchers and .GroupBy.
- seriesQuery: '{{__name__="capi_fields",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  metricsQuery: >-
    sum(<<.Series>>{{namespace="<<index .LabelValuesByName "namespace">>",pod=~"<<index
    .LabelValuesByName "pod">>"}}) by (<<range $i, $l := .GroupBySlice>><<if
    $i>>,<<end>><<$l>><<end>>)
# A query that drops the label naming the objects (a classic "items: []").
- seriesQuery: '{{__name__="capi_dropped",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}})'
# Two labels name nodes: the lexically smallest one ("instance") is queried, every time.
- seriesQuery: '{{__name__="capi_dual",job="{job}"}}'
  resources:
    overrides:
      node: {{resource: node}}
      instance: {{resource: node}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
# A namespace's own metric.
- seriesQuery: '{{__name__="capi_queue_length",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
"""

SHOP_PODS = {"web-0": "web", "web-1": "web", "web-2": "web", "db-0": "db", "dot.pod": "dots",
             "dotxpod": "dots"}


@dataclass
class World:
    adapter: RunningAdapter
    cluster: ModuleCluster
    exporter: Exporter
    prometheus: PrometheusServer


def _seed_series(exporter: Exporter) -> None:
    requests = [
        ({"namespace": SHOP, "pod": "web-0", "verb": "GET"}, 1),
        ({"namespace": SHOP, "pod": "web-0", "verb": "POST"}, 0.5),
        ({"namespace": SHOP, "pod": "web-1", "verb": "GET"}, 2),
        ({"namespace": SHOP, "pod": "web-2", "verb": "GET"}, 0.25),
        ({"namespace": SHOP, "pod": "db-0", "verb": "GET"}, 7),
        ({"namespace": SHOP, "pod": "dot.pod", "verb": "GET"}, 3),
        ({"namespace": SHOP, "pod": "dotxpod", "verb": "GET"}, 4),
        ({"namespace": OTHER, "pod": "web-0", "verb": "GET"}, 100),
        ({"namespace": KUBELABELS, "pod": "site-0", "verb": "GET"}, 5),
        ({"namespace": KUBELABELS, "pod": "site-1", "verb": "GET"}, 6),
        ({"namespace": KUBELABELS, "pod": "other-0", "verb": "GET"}, 7),
    ]
    for labels, value in requests:
        exporter.set("capi_requests", labels, value)
    exporter.set("capi_node_temperature", {"node": NODE_1}, 61.5)
    exporter.set("capi_node_temperature", {"node": NODE_2}, 58)
    exporter.set("capi_widget_load", {"widget": W1}, 0.066)
    exporter.set("capi_deploy_rps", {"kube__namespace": SHOP, "kube_apps_deployment": "web"},
                 250)
    exporter.set("capi_jobs_processed_total", {"namespace": SHOP, "pod": "web-0"}, 2000)
    exporter.set("capi_jobs_wait_seconds_total", {"namespace": SHOP, "pod": "web-0"}, 5)
    exporter.set("capi_fields", {"namespace": SHOP, "pod": "web-0"}, 1.5)
    exporter.set("capi_fields", {"namespace": SHOP, "pod": "web-1"}, 1200000)
    exporter.set("capi_dropped", {"namespace": SHOP, "pod": "web-0"}, 9)
    exporter.set("capi_dual", {"instance": NODE_1, "node": NODE_2}, 5)
    exporter.set("capi_queue_length", {"namespace": SHOP, "queue": "a"}, 40)
    exporter.set("capi_queue_length", {"namespace": SHOP, "queue": "b"}, 2)
    for index in range(BIG_PODS):
        exporter.set("capi_big", {"namespace": BIG, "pod": f"big-{index:04d}"}, index)


async def _seed_objects(cluster: ModuleCluster, objects: Objects) -> None:
    for name in (SHOP, OTHER, BIG, KUBELABELS):
        cluster.namespace(name.removeprefix(f"{NAMES.prefix}-"),
                          labels={"team": "shop" if name == SHOP else "x"})
    pods = [pod_manifest(name, SHOP, labels={"app": app}) for name, app in SHOP_PODS.items()]
    pods.append(pod_manifest("web-0", OTHER, labels={"app": "web"}))
    # Kubernetes-style label keys and integer values: labelSelector selects objects, not series.
    for name, labels in (("site-0", {"app.kubernetes.io/name": "site", "rank": "1"}),
                         ("site-1", {"app.kubernetes.io/name": "site", "rank": "2"}),
                         ("other-0", {"app.kubernetes.io/name": "other", "rank": "3"})):
        pods.append(pod_manifest(name, KUBELABELS, labels=labels))
    pods += [pod_manifest(f"big-{index:04d}", BIG, labels={"app": "big"})
             for index in range(BIG_PODS)]
    nodes = [node_manifest(node, labels={"zone": zone})
             for node, zone in ((NODE_1, "a"), (NODE_2, "b"))]
    cluster.cleanup.add(*nodes)
    await objects.create(*pods, *nodes)
    await objects.create({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": SHOP, "labels": {"app": "web"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": pod_manifest("web", SHOP)["spec"]}}})
    crd = await objects.crd(group=GROUP, kind="Widget", plural="widgets", scope="Cluster")
    cluster.cleanup.add(crd)
    await objects.create({"apiVersion": f"{GROUP}/v1", "kind": "Widget",
                          "metadata": {"name": W1}})


# The Widget CRD: the adapter lists and watches what its rules map labels to.
WIDGET_RBAC = ({"apiGroups": [GROUP], "resources": ["widgets"], "verbs": ["list", "watch"]},)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(cluster: ModuleCluster, prometheus: PrometheusServer,
                exporter_pool: ExporterPool,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    workdir = tmp_path_factory.mktemp("custom-api")
    with exporter_pool.exporter() as exporter:
        _seed_series(exporter)
        async with Objects(cluster.control_plane) as objects:
            await _seed_objects(cluster, objects)
        await wait_for_series(prometheus, f'capi_big{{job="{exporter.job}"}}', BIG_PODS)
        await wait_for_series(prometheus, f'capi_queue_length{{job="{exporter.job}"}}', 2)
        async with running_adapter(
                workdir=workdir / "adapter",
                config_text=CONFIG.format(job=exporter.job, group=GROUP),
                prometheus_url=prometheus.url,
                kubeconfig=cluster.adapter_kubeconfig(extra_rules=WIDGET_RBAC)) as adapter:
            yield World(adapter, cluster, exporter, prometheus)


def items(reply_json: dict[str, object]) -> list[dict[str, object]]:
    assert reply_json["kind"] == "MetricValueList"
    found = reply_json["items"]
    assert isinstance(found, list)
    return found


def values_by_name(body: dict[str, object]) -> dict[str, str]:
    return {item["describedObject"]["name"]: item["value"]  # type: ignore[index]
            for item in items(body)}


# ------------------------------------------------------------------------------ route shapes


@pytest.mark.parametrize("version", VERSIONS)
async def test_pods_wildcard_is_filtered_by_the_pods_labels(world: World, version: str) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/{version}/namespaces/{SHOP}/pods/%2A/capi_requests?labelSelector=app%3Dweb",
        accept=HPA_ACCEPT)
    assert reply.status == 200, reply
    assert reply.content_type == "application/json"
    body = reply.json()
    assert body["apiVersion"] == f"custom.metrics.k8s.io/{version}"
    assert body["metadata"] == {}
    assert values_by_name(body) == {"web-0": "1500m", "web-1": "2", "web-2": "250m"}


async def test_v1beta1_items_carry_metric_name_and_a_null_selector(world: World) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta1/namespaces/{SHOP}/pods/web-1/capi_requests")
    [item] = items(reply.json())
    assert item == {
        "describedObject": {"kind": "Pod", "namespace": SHOP, "name": "web-1",
                            "apiVersion": "v1"},
        "metricName": "capi_requests", "timestamp": item["timestamp"], "value": "2",
        "selector": None}
    assert re.match(RFC3339_SECONDS, str(item["timestamp"]))


async def test_v1beta2_items_carry_the_metric_selector_inside_metric(world: World) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/web-0/capi_requests?metricLabelSelector="
        "verb%3DGET")
    [item] = items(reply.json())
    assert item["metric"] == {"name": "capi_requests",
                              "selector": {"matchLabels": {"verb": "GET"}}}
    assert item["value"] == "1"
    assert "windowSeconds" not in item and "metricName" not in item


async def test_metric_label_selector_sums_only_the_selected_series(world: World) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta1/namespaces/{SHOP}/pods/%2A/capi_requests"
        "?labelSelector=app%3Dweb&metricLabelSelector=verb+in+%28POST%29")
    body = reply.json()
    assert values_by_name(body) == {"web-0": "500m"}
    assert body["items"][0]["selector"] == {
        "matchExpressions": [{"key": "verb", "operator": "In", "values": ["POST"]}]}
    assert reply.headers["Warning"].startswith('299 - "2 of 3 selected pods have no value')


async def test_wildcard_without_selector_answers_every_pod_of_the_namespace_only(
        world: World) -> None:
    reply = await world.adapter.get(f"{CUSTOM}/v1beta2/namespaces/{OTHER}/pods/*/capi_requests")
    assert values_by_name(reply.json()) == {"web-0": "100"}


@pytest.mark.parametrize("version", VERSIONS)
async def test_root_scoped_nodes_by_name_and_by_wildcard(world: World, version: str) -> None:
    one = await world.adapter.get(f"{CUSTOM}/{version}/nodes/{NODE_1}/capi_node_temperature")
    [item] = items(one.json())
    assert item["describedObject"] == {"kind": "Node", "name": NODE_1, "apiVersion": "v1"}
    assert item["value"] == "61500m"
    every = await world.adapter.get(
        f"{CUSTOM}/{version}/nodes/%2A/capi_node_temperature?labelSelector=zone+in+%28a%2Cb%29")
    assert values_by_name(every.json()) == {NODE_1: "61500m", NODE_2: "58"}


async def test_hpa_shaped_namespaced_url_for_a_node_answers_the_node(world: World) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{SHOP}/nodes/{NODE_2}/capi_node_temperature")
    [item] = items(reply.json())
    assert item["describedObject"] == {"kind": "Node", "name": NODE_2, "apiVersion": "v1"}


async def test_cluster_scoped_crd_is_served_at_its_real_scope(world: World) -> None:
    listing = await world.adapter.get(f"{CUSTOM}/v1beta2")
    entries = {r["name"]: r["namespaced"] for r in listing.json()["resources"]}
    assert entries[f"widgets.{GROUP}/capi_widget_load"] is False
    reply = await world.adapter.get(f"{CUSTOM}/v1beta2/widgets.{GROUP}/{W1}/capi_widget_load")
    [item] = items(reply.json())
    assert item["describedObject"] == {"kind": "Widget", "name": W1,
                                       "apiVersion": f"{GROUP}/v1"}
    assert item["value"] == "66m"


async def test_namespace_own_metric_describes_the_namespace(world: World) -> None:
    for version in VERSIONS:
        reply = await world.adapter.get(
            f"{CUSTOM}/{version}/namespaces/{SHOP}/metrics/capi_queue_length")
        [item] = items(reply.json())
        assert item["describedObject"] == {"kind": "Namespace", "name": SHOP,
                                           "apiVersion": "v1"}
        assert item["value"] == "42"


async def test_namespaces_wildcard_selects_namespaces_by_their_labels(world: World) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta1/namespaces/*/metrics/capi_queue_length?labelSelector=team%3Dshop")
    assert values_by_name(reply.json()) == {SHOP: "42"}


async def test_two_labels_for_one_resource_query_the_smallest_label(world: World) -> None:
    found = await world.adapter.get(f"{CUSTOM}/v1beta2/nodes/{NODE_1}/capi_dual")
    assert items(found.json())[0]["value"] == "5"
    assert (await world.adapter.get(f"{CUSTOM}/v1beta2/nodes/{NODE_2}/capi_dual")).status == 404


async def test_group_qualified_resource_through_a_group_template(world: World) -> None:
    for resource in ("deployments.apps", "deployment.apps"):
        reply = await world.adapter.get(
            f"{CUSTOM}/v1beta2/namespaces/{SHOP}/{resource}/web/capi_deploy_rps")
        [item] = items(reply.json())
        assert item["describedObject"] == {"kind": "Deployment", "namespace": SHOP,
                                           "name": "web", "apiVersion": "apps/v1"}
        assert item["value"] == "250"


async def test_series_filters_and_name_as_rename_counters(world: World) -> None:
    listing = (await world.adapter.get(f"{CUSTOM}/v1beta1")).json()
    names = {r["name"] for r in listing["resources"]}
    assert "pods/jobs_processed_per_second" in names
    assert not any("jobs_wait" in name for name in names)
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta1/namespaces/{SHOP}/pods/web-0/jobs_processed_per_second")
    assert items(reply.json())[0]["value"] == "2k"


async def test_label_values_by_name_and_group_by_slice_render_a_working_query(
        world: World) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/*/capi_fields?labelSelector=app%3Dweb")
    assert values_by_name(reply.json()) == {"web-0": "1500m", "web-1": "1200k"}


async def test_discovery_lists_every_resource_metric_pair_with_its_scope(world: World) -> None:
    for version in VERSIONS:
        body = (await world.adapter.get(f"{CUSTOM}/{version}/")).json()
        assert body["groupVersion"] == f"custom.metrics.k8s.io/{version}"
        entries = {r["name"]: r for r in body["resources"]}
        assert entries["pods/capi_requests"]["namespaced"] is True
        assert entries["namespaces/capi_requests"]["namespaced"] is False
        assert entries["nodes/capi_node_temperature"]["namespaced"] is False
        assert entries["deployments.apps/capi_deploy_rps"]["namespaced"] is True
        assert all(r["kind"] == "MetricValueList" and r["verbs"] == ["get"]
                   and r["singularName"] == "" for r in body["resources"])


# ------------------------------------------------------------------------------ errors


async def test_unknown_metric_is_404_with_upstreams_message(world: World) -> None:
    reply = await world.adapter.get(f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/*/nope")
    assert reply.status == 404
    assert reply.json() == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "reason": "NotFound", "code": 404,
                            "message": "the server could not find the metric nope for pods"}
    named = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/web-0/nope?metricLabelSelector=verb%3DGET")
    assert named.json()["message"] == ("the server could not find the metric nope for pods "
                                       "web-0 with selector verb=GET")


async def test_unknown_resource_is_404_naming_the_resource_as_written(world: World) -> None:
    reply = await world.adapter.get(f"{CUSTOM}/v1beta1/namespaces/{SHOP}/foos.bar/x/m")
    assert reply.status == 404
    assert reply.json()["message"].startswith("the server could not find the metric m for "
                                              "foos.bar")


async def test_unknown_route_inside_the_group_is_a_status_404(world: World) -> None:
    reply = await world.adapter.get(f"{CUSTOM}/v1beta2/nodes/foo")
    assert reply.status == 404
    assert reply.json()["details"] == {}
    assert reply.json()["message"] == "the server could not find the requested resource"


@pytest.mark.parametrize("parameter", ["labelSelector", "metricLabelSelector"])
async def test_bad_selectors_are_400_bad_request(world: World, parameter: str) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/*/capi_requests?{parameter}=%3D%3D%3D")
    assert reply.status == 400
    assert reply.json()["reason"] == "BadRequest"


async def test_label_selector_takes_kubernetes_label_keys(world: World) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{KUBELABELS}/pods/*/capi_requests?labelSelector="
        "app.kubernetes.io%2Fname%3Dsite")
    assert reply.status == 200, reply
    assert values_by_name(reply.json()) == {"site-0": "5", "site-1": "6"}


async def test_label_selector_takes_greater_than_and_less_than(world: World) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{KUBELABELS}/pods/*/capi_requests?labelSelector=rank%3E1")
    assert reply.status == 200, reply
    assert values_by_name(reply.json()) == {"site-1": "6", "other-0": "7"}
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{KUBELABELS}/pods/*/capi_requests?labelSelector=rank%3C2")
    assert reply.status == 200, reply
    assert values_by_name(reply.json()) == {"site-0": "5"}


async def test_metric_label_selector_with_a_kubernetes_label_key_is_400(world: World) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{KUBELABELS}/pods/*/capi_requests?metricLabelSelector="
        "app.kubernetes.io%2Fname%3Dsite")
    assert reply.status == 400
    assert reply.json()["reason"] == "BadRequest"


async def test_selector_operators_prometheus_cannot_express_are_400(world: World) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/web-0/capi_requests?metricLabelSelector="
        "code%3E5")
    assert reply.status == 400
    assert "not supported by prometheus" in reply.json()["message"]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
async def test_other_verbs_are_405_status(world: World, method: str) -> None:
    reply = await world.adapter.request(
        f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/*/capi_requests", method=method)
    assert reply.status == 405
    assert reply.json()["reason"] == "MethodNotAllowed"


async def test_all_namespaces_wildcard_is_400(world: World) -> None:
    reply = await world.adapter.get(f"{CUSTOM}/v1beta2/namespaces/*/pods/*/capi_requests")
    assert reply.status == 400


# ------------------------------------------------------------------------------ empty answers


async def test_no_selected_objects_is_404_saying_so(world: World) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/*/capi_requests?labelSelector=app%3Dnone")
    assert reply.status == 404
    assert reply.json()["message"] == (
        "the server could not find the metric capi_requests for pods: no pods in namespace "
        f"{SHOP} match the label selector 'app=none'")


async def test_no_series_for_the_object_is_404_saying_so(world: World) -> None:
    reply = await world.adapter.get(f"{CUSTOM}/v1beta2/namespaces/{OTHER}/pods/db-9/capi_requests")
    assert reply.status == 404
    assert reply.json()["message"].startswith(
        "the server could not find the metric capi_requests for pods db-9: no series matched "
        "the query of rules[0]")


async def test_query_that_drops_the_resource_label_is_404_saying_so(world: World) -> None:
    reply = await world.adapter.get(f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/web-0/capi_dropped")
    assert reply.status == 404
    message = reply.json()["message"]
    assert "without the label 'pod'" in message and "rules[5]" in message


async def test_partial_answer_is_200_with_a_warning_header(world: World) -> None:
    async with Objects(world.cluster.control_plane) as objects:
        await objects.create(pod_manifest("db-new", SHOP, labels={"app": "db"}))
    path = f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/*/capi_requests?labelSelector=app%3Ddb"
    reply = await world.adapter.get(path)
    while "Warning" not in reply.headers:  # until the watch delivers the new pod to the cache
        await asyncio.sleep(0.02)
        reply = await world.adapter.get(path)
    assert reply.status == 200
    assert values_by_name(reply.json()) == {"db-0": "7"}
    assert reply.headers["Warning"].startswith('299 - "1 of 2 selected pods have no value')


# ------------------------------------------------------------------------------ safety and scale


async def test_hostile_object_name_cannot_change_the_query(world: World) -> None:
    hostile = "web-0%22%7D%20or%20vector%281%29%20%23"  # web-0"} or vector(1) #
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/{hostile}/capi_requests")
    # Not a DNS-1123 subdomain, so no pod has it: 404 before any query is built.
    assert reply.status == 404
    assert reply.json()["reason"] == "NotFound"
    assert reply.json()["message"] == "the server could not find the requested resource"


async def test_hostile_namespace_cannot_change_the_query(world: World) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{SHOP}%22%2Cpod%3D~%22.%2A/metrics/capi_queue_length")
    assert reply.status == 404


async def test_regex_characters_in_selector_values_match_literally(world: World) -> None:
    # Upstream writes `verb=~"G.T|POST"`, which matches GET; here the dot is escaped.
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/web-0/capi_requests?metricLabelSelector="
        "verb+in+%28G.T%2CPOST%29")
    assert items(reply.json())[0]["value"] == "500m"


async def test_two_thousand_pods_by_post_in_one_query(world: World) -> None:
    before = world.adapter.prometheus.backend_requests
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{BIG}/pods/*/capi_big?labelSelector=app%3Dbig")
    assert reply.status == 200, reply
    found = values_by_name(reply.json())
    assert len(found) == BIG_PODS
    assert found["big-1999"] == "1999"
    assert world.adapter.prometheus.backend_requests == before + 1


async def test_identical_concurrent_requests_share_one_prometheus_query(world: World) -> None:
    client = world.adapter.prometheus
    before = client.backend_requests
    path = f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/*/capi_requests?labelSelector=app%3Dweb"
    registry = world.adapter.app[METRICS_REGISTRY_KEY]

    def joined() -> float:
        return registry.get_sample_value("metricscale_prometheus_requests_shared_total",
                                         {"backend": "default", "endpoint": "query"}) or 0.0

    joined_before = joined()
    world.prometheus.pause()
    try:
        requests = [asyncio.create_task(world.adapter.get(path)) for _ in range(20)]
        # Held until the other 19 have joined the one request in flight (Prometheus is
        # paused, so none of them can finish first).
        while joined() - joined_before < 19:
            assert not any(task.done() for task in requests), "a request ended early"
            await asyncio.sleep(0.01)
    finally:
        world.prometheus.resume()
    replies = await asyncio.gather(*requests)
    assert {reply.status for reply in replies} == {200}
    assert client.backend_requests - before == 1


async def test_protobuf_accept_is_answered_with_json_and_unservable_accept_is_406(
        world: World) -> None:
    path = f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/web-1/capi_requests"
    ok = await world.adapter.get(path, accept=HPA_ACCEPT)
    assert ok.status == 200 and ok.content_type == "application/json"
    refused = await world.adapter.get(path, accept="application/vnd.kubernetes.protobuf")
    assert refused.status == 406
    assert refused.json()["reason"] == "NotAcceptable"


async def test_quantities_are_canonical_and_exact(world: World) -> None:
    reply = await world.adapter.get(
        f"{CUSTOM}/v1beta2/namespaces/{SHOP}/pods/*/capi_fields?labelSelector=app%3Dweb")
    assert sorted(values_by_name(reply.json()).values()) == ["1200k", "1500m"]
    assert all(re.fullmatch(r"-?[0-9]+[numkMGTPE]?", value)
               for value in values_by_name(reply.json()).values())
