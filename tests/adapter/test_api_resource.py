"""metrics.k8s.io/v1beta1 over HTTPS against a real Prometheus and the real control plane:
discovery, pod and node lists and single objects, label and field selectors, running pods only,
objects without metrics (Warning on lists, metrics-server's 404 on single objects), and the
group absent without resourceRules.

The pods and nodes are the module's own (its namespaces, its node names, labelled so that a
node list can select them in a cluster other tests share); no kubelet runs them: a pod's status
is written as a kubelet would write it."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

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

BASE = "/apis/metrics.k8s.io/v1beta1"
NAMES = Names.unique("rapi")
SHOP, OTHER = NAMES.namespace("shop"), NAMES.namespace("other")
N1, N2, N3 = (NAMES.cluster(n) for n in ("n1", "n2", "n3"))
MODULE_LABEL = f"metricscale.test/module={NAMES.prefix}"
OURS = "labelSelector=metricscale.test%2Fmodule%3D" + NAMES.prefix  # this module's nodes

# Gauges instead of cAdvisor's counters, so values are exact (the default rules' rate() is
# exercised end to end in tests/e2e).
CONFIG = """
rules: []
resourceRules:
  cpu:
    containerQuery: 'sum(rapi_cpu{{<<.LabelMatchers>>,job="{job}"}}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(rapi_node_cpu{{<<.LabelMatchers>>,job="{job}"}}) by (<<.GroupBy>>)'
    resources:
      overrides:
        namespace: {{resource: namespace}}
        pod: {{resource: pod}}
        node: {{resource: node}}
    containerLabel: container
  memory:
    containerQuery: 'sum(rapi_memory{{<<.LabelMatchers>>,job="{job}"}}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(rapi_node_memory{{<<.LabelMatchers>>,job="{job}"}}) by (<<.GroupBy>>)'
    resources:
      overrides:
        namespace: {{resource: namespace}}
        pod: {{resource: pod}}
        node: {{resource: node}}
    containerLabel: container
  window: 1m
"""

# (namespace, pod, node, phase, labels): cpu/memory per container below
PODS = [(SHOP, "web-0", N1, "Running", {"app": "web"}),
        (SHOP, "web-1", N2, "Running", {"app": "web"}),
        (SHOP, "db-0", N1, "Running", {"app": "db"}),
        (SHOP, "nomem-0", N2, "Running", {"app": "nomem"}),
        (SHOP, "pending-0", N1, "Pending", {"app": "web"}),
        (OTHER, "api-0", N2, "Running", {"app": "api"})]
CPU = {(SHOP, "web-0", "app"): 0.25, (SHOP, "web-0", "sidecar"): 0.0123,
       (SHOP, "web-1", "app"): 1.5, (SHOP, "db-0", "db"): 0.5,
       (SHOP, "nomem-0", "app"): 0.1, (SHOP, "pending-0", "app"): 9,
       (OTHER, "api-0", "app"): 0.003}
MEMORY = {(SHOP, "web-0", "app"): 1048576, (SHOP, "web-1", "app"): 2097152,
          (SHOP, "db-0", "db"): 1000000, (SHOP, "pending-0", "app"): 1,
          (OTHER, "api-0", "app"): 0}
NODES = {N1: (2.0, 4294967296), N2: (0.5, 1073741824), N3: (1.0, None)}


@dataclass
class World:
    adapter: RunningAdapter
    exporter: Exporter
    cluster: ModuleCluster


def _node(name: str) -> dict[str, Any]:
    key, _, value = MODULE_LABEL.partition("=")
    return node_manifest(name, labels={"kubernetes.io/hostname": name, key: value})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(cluster: ModuleCluster, prometheus: PrometheusServer,
                exporter_pool: ExporterPool,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    workdir = tmp_path_factory.mktemp("resource-api")
    with exporter_pool.exporter() as exporter:
        for (namespace, pod, container), value in CPU.items():
            exporter.set("rapi_cpu", {"namespace": namespace, "pod": pod,
                                      "container": container}, value, type="gauge")
        for (namespace, pod, container), value in MEMORY.items():
            exporter.set("rapi_memory", {"namespace": namespace, "pod": pod,
                                         "container": container}, value, type="gauge")
        for node, (cpu, memory) in NODES.items():
            exporter.set("rapi_node_cpu", {"node": node}, cpu, type="gauge")
            if memory is not None:
                exporter.set("rapi_node_memory", {"node": node}, memory, type="gauge")
        await wait_for_series(prometheus, f'{{job="{exporter.job}",__name__=~"rapi_.*"}}',
                              len(CPU) + len(MEMORY) + 5)
        cluster.namespace("shop")
        cluster.namespace("other")
        nodes = [_node(node) for node in NODES]
        cluster.cleanup.add(*nodes)
        async with Objects(cluster.control_plane) as objects:
            await objects.create(*nodes)
            manifests = {pod: pod_manifest(pod, namespace, labels=labels, node=node)
                         for namespace, pod, node, _, labels in PODS}
            await objects.create(*manifests.values())
            await objects.run_existing(*(manifests[pod] for _, pod, _, phase, _ in PODS
                                         if phase == "Running"))
        async with running_adapter(
                workdir=workdir / "adapter", config_text=CONFIG.format(job=exporter.job),
                prometheus_url=prometheus.url,
                kubeconfig=cluster.adapter_kubeconfig()) as adapter:
            yield World(adapter, exporter, cluster)


def _names(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(item["metadata"].get("namespace", ""), item["metadata"]["name"])
            for item in body["items"]]


async def test_discovery_lists_the_group_and_its_two_resources(world: World) -> None:
    groups = (await world.adapter.get("/apis")).json()
    assert [g["name"] for g in groups["groups"]] == [
        "custom.metrics.k8s.io", "external.metrics.k8s.io", "metrics.k8s.io"]
    group = (await world.adapter.get("/apis/metrics.k8s.io")).json()
    assert group["preferredVersion"] == {"groupVersion": "metrics.k8s.io/v1beta1",
                                         "version": "v1beta1"}
    resources = (await world.adapter.get(BASE)).json()
    assert resources == {
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "metrics.k8s.io/v1beta1",
        "resources": [
            {"name": "nodes", "singularName": "", "namespaced": False, "kind": "NodeMetrics",
             "verbs": ["get", "list"]},
            {"name": "pods", "singularName": "", "namespaced": True, "kind": "PodMetrics",
             "verbs": ["get", "list"]}]}


async def test_a_namespace_lists_its_running_pods_with_container_usage(world: World) -> None:
    reply = await world.adapter.get(f"{BASE}/namespaces/{SHOP}/pods", accept=HPA_ACCEPT)
    assert reply.status == 200, reply
    body = reply.json()
    assert body["kind"] == "PodMetricsList" and body["apiVersion"] == "metrics.k8s.io/v1beta1"
    # Sorted by name; pending-0 is not running; nomem-0 has no memory series.
    assert _names(body) == [(SHOP, "db-0"), (SHOP, "web-0"), (SHOP, "web-1")]
    web0 = body["items"][1]
    assert web0["metadata"]["labels"] == {"app": "web"}
    assert re.match(RFC3339_SECONDS, web0["metadata"]["creationTimestamp"])
    assert re.match(RFC3339_SECONDS, web0["timestamp"])
    assert web0["window"] == "1m0s"
    assert web0["containers"] == [
        {"name": "app", "usage": {"cpu": "250m", "memory": "1Mi"}},
        {"name": "sidecar", "usage": {"cpu": "12m", "memory": "0"}}]
    assert body["items"][0]["containers"] == [
        {"name": "db", "usage": {"cpu": "500m", "memory": "1000000"}}]
    assert reply.headers["Warning"] == (
        '299 - "1 of 4 running pods have no metrics: 1 without a memory sample '
        '(resourceRules.memory.containerQuery)"')


async def test_label_and_field_selectors_narrow_the_list(world: World) -> None:
    web = (await world.adapter.get(
        f"{BASE}/namespaces/{SHOP}/pods?labelSelector=app%3Dweb")).json()
    assert _names(web) == [(SHOP, "web-0"), (SHOP, "web-1")]
    on_n2 = (await world.adapter.get(f"{BASE}/pods?fieldSelector=spec.nodeName%3D{N2}")).json()
    assert _names(on_n2) == [(OTHER, "api-0"), (SHOP, "web-1")]
    named = (await world.adapter.get(
        f"{BASE}/pods?fieldSelector=metadata.name%3Dapi-0,metadata.namespace%3D{OTHER}")).json()
    assert _names(named) == [(OTHER, "api-0")]
    everywhere = (await world.adapter.get(f"{BASE}/pods")).json()
    assert _names(everywhere) == [(OTHER, "api-0"), (SHOP, "db-0"), (SHOP, "web-0"),
                                  (SHOP, "web-1")]
    assert everywhere["items"][0]["containers"][0]["usage"] == {"cpu": "3m", "memory": "0"}


async def test_a_single_pod_is_podmetrics_or_metrics_servers_404(world: World) -> None:
    reply = await world.adapter.get(f"{BASE}/namespaces/{SHOP}/pods/web-1")
    assert reply.status == 200, reply
    body = reply.json()
    assert body["kind"] == "PodMetrics" and body["metadata"]["name"] == "web-1"
    assert body["containers"] == [{"name": "app", "usage": {"cpu": "1500m", "memory": "2Mi"}}]
    missing = await world.adapter.get(f"{BASE}/namespaces/{SHOP}/pods/nomem-0")
    assert missing.status == 404
    assert missing.json()["message"] == f'podmetrics.metrics.k8s.io "{SHOP}/nomem-0" not found'
    assert "without a memory sample" in missing.headers["Warning"]
    for name in ("pending-0", "ghost"):  # not running, or no such pod
        gone = await world.adapter.get(f"{BASE}/namespaces/{SHOP}/pods/{name}")
        assert gone.status == 404
        assert gone.json()["message"] == f'pods "{name}" not found'


async def test_nodes_and_a_single_node(world: World) -> None:
    reply = await world.adapter.get(f"{BASE}/nodes?{OURS}")  # others' nodes are not ours
    body = reply.json()
    assert body["kind"] == "NodeMetricsList"
    assert [(i["metadata"]["name"], i["usage"]) for i in body["items"]] == [
        (N1, {"cpu": "2", "memory": "4Gi"}), (N2, {"cpu": "500m", "memory": "1Gi"})]
    assert body["items"][0]["metadata"]["labels"] == {
        "kubernetes.io/hostname": N1, "metricscale.test/module": NAMES.prefix}
    assert "1 of 3 nodes have no metrics: 1 without a memory sample" in reply.headers["Warning"]
    one = (await world.adapter.get(f"{BASE}/nodes/{N2}")).json()
    assert one["kind"] == "NodeMetrics" and one["usage"]["cpu"] == "500m"
    n3 = await world.adapter.get(f"{BASE}/nodes/{N3}")
    assert n3.status == 404
    assert n3.json()["message"] == f'nodemetrics.metrics.k8s.io "{N3}" not found'
    ghost = await world.adapter.get(f"{BASE}/nodes/ghost")
    assert ghost.json()["message"] == 'node "ghost" not found'
    labelled = (await world.adapter.get(
        f"{BASE}/nodes?labelSelector=kubernetes.io%2Fhostname%3D{N2}")).json()
    assert [i["metadata"]["name"] for i in labelled["items"]] == [N2]


# kubectl get's Accept: a meta.k8s.io Table (v1, then v1beta1), else plain JSON.
KUBECTL_GET_ACCEPT = ("application/json;as=Table;v=v1;g=meta.k8s.io,"
                      "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json")


async def test_kubectl_get_gets_metrics_servers_table_of_the_same_objects(world: World) -> None:
    plain = await world.adapter.get(f"{BASE}/namespaces/{SHOP}/pods")
    reply = await world.adapter.get(f"{BASE}/namespaces/{SHOP}/pods", accept=KUBECTL_GET_ACCEPT)
    assert reply.status == 200, reply
    assert reply.content_type == "application/json"
    table = reply.json()
    assert (table["kind"], table["apiVersion"], table["metadata"]) == (
        "Table", "meta.k8s.io/v1", {})
    assert table["columnDefinitions"] == [
        {"name": "Name", "type": "string", "format": "name",
         "description": "Name of the resource", "priority": 0},
        {"name": "cpu", "type": "string", "format": "quantity", "description": "",
         "priority": 0},
        {"name": "memory", "type": "string", "format": "quantity", "description": "",
         "priority": 0},
        {"name": "Window", "type": "string", "format": "duration", "description": "",
         "priority": 0}]
    # A pod's containers summed (web-0: 250m + 12m, 1Mi + 0), as metrics-server sums them.
    assert [row["cells"] for row in table["rows"]] == [
        ["db-0", "500m", "1000000", "1m0s"], ["web-0", "262m", "1Mi", "1m0s"],
        ["web-1", "1500m", "2Mi", "1m0s"]]
    web0 = plain.json()["items"][1]
    assert table["rows"][1]["object"] == {
        "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
        "metadata": {**web0["metadata"], "creationTimestamp": table["rows"][1]["object"][
            "metadata"]["creationTimestamp"]}}
    assert reply.headers["Warning"] == plain.headers["Warning"]


async def test_a_table_of_one_node_of_v1beta1_with_whole_objects_or_none(world: World) -> None:
    one = await world.adapter.get(f"{BASE}/nodes/{N2}?includeObject=Object",
                                  accept="application/json;as=Table;v=v1beta1;g=meta.k8s.io")
    assert one.status == 200, one
    table = one.json()
    assert table["apiVersion"] == "meta.k8s.io/v1beta1"
    (row,) = table["rows"]
    assert row["cells"] == [N2, "500m", "1Gi", "1m0s"]
    assert (row["object"]["kind"], row["object"]["apiVersion"], row["object"]["usage"]) == (
        "NodeMetrics", "metrics.k8s.io/v1beta1", {"cpu": "500m", "memory": "1Gi"})
    bare = (await world.adapter.get(f"{BASE}/nodes?includeObject=None&{OURS}",
                                    accept=KUBECTL_GET_ACCEPT)).json()
    assert [(r["cells"][0], r["object"]) for r in bare["rows"]] == [(N1, None), (N2, None)]
    empty = (await world.adapter.get(f"{BASE}/namespaces/nobody/pods",
                                     accept=KUBECTL_GET_ACCEPT)).json()
    assert (empty["columnDefinitions"], empty["rows"]) == (None, None)


async def test_a_table_answer_keeps_the_errors_of_json_and_refuses_a_bad_include_object(
        world: World) -> None:
    bogus = await world.adapter.get(f"{BASE}/namespaces/{SHOP}/pods?includeObject=bogus",
                                    accept=KUBECTL_GET_ACCEPT)
    assert bogus.status == 400
    assert bogus.json()["message"] == (
        "Unable to convert to Table as requested: includeObject: Invalid value: \"bogus\": "
        "must be 'Metadata', 'Object', 'None', or empty")
    ghost = await world.adapter.get(f"{BASE}/namespaces/{SHOP}/pods/ghost?includeObject=bogus",
                                    accept=KUBECTL_GET_ACCEPT)
    assert (ghost.status, ghost.json()["message"]) == (404, 'pods "ghost" not found')
    # Custom metrics have no Table: only plain JSON, as before.
    custom = await world.adapter.get("/apis/custom.metrics.k8s.io/v1beta1",
                                     accept="application/json;as=Table;v=v1;g=meta.k8s.io")
    assert custom.status == 406


async def test_selector_mistakes_are_400(world: World) -> None:
    reply = await world.adapter.get(f"{BASE}/pods?fieldSelector=spec.hostname%3Dx")
    assert reply.status == 400 and reply.json()["reason"] == "BadRequest"
    bad_labels = await world.adapter.get(f"{BASE}/pods?labelSelector=a%20in")
    assert bad_labels.status == 400 and bad_labels.json()["reason"] == "BadRequest"


async def test_the_queries_use_the_rules_templates(world: World) -> None:
    seen: list[str] = []
    client = world.adapter.prometheus
    original = client.query

    async def spy(promql: str, **kwargs: Any) -> Any:
        seen.append(promql)
        return await original(promql, **kwargs)

    client.query = spy  # type: ignore[method-assign]
    try:
        await world.adapter.get(f"{BASE}/namespaces/{SHOP}/pods?labelSelector=app%3Dweb")
    finally:
        client.query = original  # type: ignore[method-assign]
    job = world.exporter.job
    assert sorted(seen) == sorted([
        f'sum(rapi_cpu{{namespace="{SHOP}",pod=~"web-0|web-1",job="{job}"}}) by (pod,container)',
        f'sum(rapi_memory{{namespace="{SHOP}",pod=~"web-0|web-1",job="{job}"}}) '
        "by (pod,container)"])


async def test_without_resource_rules_the_group_is_not_served(
        cluster: ModuleCluster, prometheus: PrometheusServer,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    workdir = tmp_path_factory.mktemp("no-resource-rules")
    async with running_adapter(
            workdir=workdir / "adapter", config_text="rules: []\n",
            prometheus_url=prometheus.url,
            kubeconfig=cluster.adapter_kubeconfig()) as adapter:
        groups = (await adapter.get("/apis")).json()
        assert "metrics.k8s.io" not in [g["name"] for g in groups["groups"]]
        reply = await adapter.get(f"{BASE}/nodes")
        assert reply.status == 404
