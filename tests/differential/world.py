"""The world both adapters look at: objects in the control plane, series in Prometheus, and the
configurations the pairs run.

Four configurations, each run by one pair:
- `config-gen`: prometheus-adapter's `config-gen` output (its built-in rules) with its
  `resourceRules`, verbatim;
- `defaults`: metricscale's default rules (adapter/rules/defaults.py), verbatim;
- `docs`: the rule forms of prometheus-adapter's documentation (config walkthrough, config.md's
  group template and overrides, external rules with and without `namespaced`, its deploy
  manifest's `resourceRules`), plus rules that make each claimed difference observable.

Every value a series carries is chosen for what it shows: `1.001` is where float and exact
milli-units part, `0.25`/`2.5` are exact either way, and the counters stand still so that a
`rate()` is exactly 0 whenever it is evaluated.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from adapter.rules.defaults import CONFIG_GEN_DEFAULTS_YAML, DEFAULT_CONFIG_YAML
from testbed.controlplane import ControlPlane, KubeError
from testbed.fakes.exporter import Exporter
from testbed.processes import wait_until

__all__ = ["CLUSTER_SCOPED_RESOURCES", "CRD_GROUP", "World", "build_world", "pair_configs"]

CRD_GROUP = "oracle.metricscale.io"
NODES = ("node-a", "node-b")
STORAGE_CLASS = "oracle-fast"
PERSISTENT_VOLUME = "oracle-pv-1"
WIDGET = "w-1"
# The world's cluster-scoped resources other than namespaces, nodes and persistentvolumes (the
# three prometheus-adapter knows are cluster-scoped), as discovery names them.
CLUSTER_SCOPED_RESOURCES = frozenset({f"widgets.{CRD_GROUP}", "storageclasses.storage.k8s.io"})


@dataclass(frozen=True)
class World:
    """Names of what exists: the test's namespaces and the objects in them."""

    token: str  # in the names and labels of this world's objects
    namespace: str  # most objects
    other_namespace: str  # one more namespace with a pod, for cross-namespace requests
    pods: Mapping[str, Mapping[str, str]]  # name -> labels, in `namespace`
    other_pods: Mapping[str, Mapping[str, str]]  # in `other_namespace`
    services: tuple[str, ...]
    deployments: tuple[str, ...]
    gadgets: tuple[str, ...]  # a namespaced custom resource

    @property
    def nodes(self) -> tuple[str, ...]:
        return NODES

    @property
    def widgets(self) -> tuple[str, ...]:  # a cluster-scoped custom resource
        return (WIDGET,)

    @property
    def storage_classes(self) -> tuple[str, ...]:
        return (STORAGE_CLASS,)

    @property
    def persistent_volumes(self) -> tuple[str, ...]:
        return (PERSISTENT_VOLUME,)


# Pods of the main namespace with their labels. `cache.v1` and `cachexv1` are selected together
# by `app=cache`: the regex `cache.v1|cachexv1` shows how each adapter escapes a `.`.
PODS: Mapping[str, Mapping[str, str]] = {
    "web-1": {"app": "web", "tier": "front"},
    "web-2": {"app": "web", "tier": "front"},
    "db-0": {"app": "db", "tier": "back"},
    "cache.v1": {"app": "cache", "tier": "back"},
    "cachexv1": {"app": "cache", "tier": "back"},
}
OTHER_PODS: Mapping[str, Mapping[str, str]] = {"worker-0": {"app": "worker"}}

# A gauge per pod, with a value that tells float and exact conversion apart where it matters.
GAUGE_VALUES: Mapping[str, str] = {
    "web-1": "1.001", "web-2": "2.5", "db-0": "7", "cache.v1": "0.25", "cachexv1": "1500000",
}
SPECIAL_VALUES: Mapping[str, str] = {
    "web-1": "NaN", "web-2": "+Inf", "db-0": "-3.5", "cache.v1": "0.000999", "cachexv1": "-Inf",
}


def _crd(*, plural: str, singular: str, kind: str, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{CRD_GROUP}"},
        "spec": {"group": CRD_GROUP, "scope": scope,
                 "names": {"plural": plural, "singular": singular, "kind": kind,
                           "listKind": f"{kind}List"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {
                                   "type": "object",
                                   "x-kubernetes-preserve-unknown-fields": True}}}]}}


def _established(cluster: ControlPlane, name: str) -> bool:
    try:
        crd = cluster.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    except KubeError:
        return False
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


def build_world(cluster: ControlPlane) -> World:
    """Creates the objects (idempotent for cluster-scoped ones: the control plane is shared by
    the session). Custom resource definitions come first: prometheus-adapter reads the cluster's
    resources once, when it starts."""
    token = secrets.token_hex(3)
    world = World(token=token, namespace=f"oracle-{token}", other_namespace=f"oracle-{token}-b",
                  pods=PODS, other_pods=OTHER_PODS, services=("web", "db"),
                  deployments=("web",), gadgets=("g-1",))
    cluster.apply(_crd(plural="widgets", singular="widget", kind="Widget", scope="Cluster"))
    cluster.apply(_crd(plural="gadgets", singular="gadget", kind="Gadget", scope="Namespaced"))
    for plural in ("widgets", "gadgets"):
        wait_until(functools.partial(_established, cluster, f"{plural}.{CRD_GROUP}"),
                   what=f"CRD {plural}.{CRD_GROUP} established", timeout=60,
                   children=cluster.children, interval=0.1)
    cluster.apply({"apiVersion": f"{CRD_GROUP}/v1", "kind": "Widget",
                   "metadata": {"name": WIDGET, "labels": {"app": "widget"}}})
    cluster.apply({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                   "metadata": {"name": STORAGE_CLASS}, "provisioner": "oracle.example/none"})
    cluster.apply({"apiVersion": "v1", "kind": "PersistentVolume",
                   "metadata": {"name": PERSISTENT_VOLUME},
                   "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                            "hostPath": {"path": "/tmp/oracle"}}})
    for namespace in (world.namespace, world.other_namespace):
        cluster.apply({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": namespace, "labels": {"oracle": token}}})
    for namespace, pods in ((world.namespace, world.pods),
                            (world.other_namespace, world.other_pods)):
        for name, labels in pods.items():
            cluster.apply({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": namespace,
                                        "labels": {**labels, "oracle-world": token}},
                           "spec": {"containers": [{"name": "app", "image": "oracle"}]}})
    for name in world.services:
        cluster.apply({"apiVersion": "v1", "kind": "Service",
                       "metadata": {"name": name, "namespace": world.namespace,
                                    "labels": {"app": name}},
                       "spec": {"ports": [{"port": 80}], "selector": {"app": name}}})
    for name in world.deployments:
        cluster.apply({"apiVersion": "apps/v1", "kind": "Deployment",
                       "metadata": {"name": name, "namespace": world.namespace,
                                    "labels": {"app": name}},
                       "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                                "template": {"metadata": {"labels": {"app": name}},
                                             "spec": {"containers": [
                                                 {"name": "app", "image": "oracle"}]}}}})
    for name in world.gadgets:
        cluster.apply({"apiVersion": f"{CRD_GROUP}/v1", "kind": "Gadget",
                       "metadata": {"name": name, "namespace": world.namespace,
                                    "labels": {"app": "gadget"}}})
    return world


def delete_world(cluster: ControlPlane, world: World) -> None:
    for namespace in (world.namespace, world.other_namespace):
        cluster.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})


def export_series(exporter: Exporter, world: World) -> None:
    """Every series the rules of the three configurations discover."""
    ns, other = world.namespace, world.other_namespace
    for pod, value in GAUGE_VALUES.items():
        service = "web" if pod.startswith("web") else "db"
        for verb, share in (("GET", "1"), ("POST", "2")):
            labels = {"namespace": ns, "pod": pod, "service": service, "verb": verb}
            exporter.set("oracle_queue_length", labels, _times(value, share), type="gauge")
            exporter.set("oracle_http_requests_total", labels, 42, type="counter")
        exporter.set("oracle_cpu_seconds_total", {"namespace": ns, "pod": pod}, 9,
                     type="counter")
        exporter.set("oracle_special_value", {"namespace": ns, "pod": pod},
                     Decimal(SPECIAL_VALUES[pod]), type="gauge")
        # docs/config-walkthrough.md's series: its own label names for namespace and pod
        exporter.set("http_requests_total", {"kubernetes_namespace": ns,
                                             "kubernetes_pod_name": pod, "method": "GET"},
                     100, type="counter")
        exporter.set("oracle_filtered_rss_bytes", {"namespace": ns, "pod": pod}, Decimal(value))
        exporter.set("oracle_filtered_skip_bytes", {"namespace": ns, "pod": pod}, 1)
        exporter.set("oracle_filtered_count", {"namespace": ns, "pod": pod}, 1)
        exporter.set("oracle_hits_total", {"namespace": ns, "pod": pod}, 5, type="counter")
        exporter.set("oracle_by_name", {"namespace": ns, "pod": pod}, Decimal(value))
        # two labels name pods; they disagree, so the label a rule queries shows in the answer
        exporter.set("oracle_both_labels", {"namespace": ns, "pod": pod,
                                            "kubernetes_pod_name": f"{pod}-k"}, Decimal(value))
        exporter.set("oracle_dup", {"namespace": ns, "pod": pod, "pod_name": f"{pod}-x"},
                     Decimal(value))
    exporter.set("oracle_queue_length", {"namespace": other, "pod": "worker-0",
                                         "service": "worker", "verb": "GET"}, 4)
    exporter.set("oracle_deploy_replicas", {"namespace": ns, "deployment": "web"}, 3)
    exporter.set("oracle_rollout_progress", {"kube_namespace": ns, "kube_apps_deployment": "web"},
                 Decimal("0.5"))
    exporter.set("oracle_microservice_latency", {"namespace": ns, "microservice": "web"},
                 Decimal("0.125"))
    exporter.set("oracle_gadget_level", {"namespace": ns, "gadget": "g-1"}, 11)
    exporter.set("oracle_widget_usage", {"namespace": ns, "widget": WIDGET}, 12)
    exporter.set("oracle_widget_power", {"widget": WIDGET}, 13)
    exporter.set("oracle_storage_iops", {"namespace": ns, "storageclass": STORAGE_CLASS}, 14)
    exporter.set("oracle_pv_bytes", {"namespace": ns, "persistentvolume": PERSISTENT_VOLUME},
                 1024)
    for index, node in enumerate(NODES):
        exporter.set("oracle_node_temperature_celsius", {"node": node}, 40 + index)
        exporter.set("oracle_node_queue", {"namespace": ns, "node": node}, index + 1)
        # the kubelet's /metrics/resource series that prometheus-adapter's manifest reads
        exporter.set("node_cpu_usage_seconds_total", {"node": node}, 1000 + index,
                     type="counter")
        exporter.set("node_memory_working_set_bytes", {"node": node}, 2**30 + index)
    # external metrics (docs/externalmetrics.md, docs/sample-config.yaml)
    for namespace, name, topic, lag in ((ns, "orders", "t1", "3.5"), (ns, "billing", "t2", "1.25"),
                                        (other, "orders", "t1", "8")):
        exporter.set("queue_consumer_lag", {"namespace": namespace, "name": name,
                                            "topic": topic}, Decimal(lag))
        exporter.set("queue_depth", {"namespace": namespace, "name": name, "topic": topic},
                     Decimal(lag))
        exporter.set("oracle_unmapped_lag", {"namespace": namespace, "name": name}, Decimal(lag))
        exporter.set("OracleQueueDepth", {"namespace": namespace, "name": name}, Decimal(lag))
        exporter.set("oracle_external_raw", {"namespace": namespace, "name": name}, Decimal(lag))
        exporter.set("oracle_external_special", {"namespace": namespace, "name": name},
                     Decimal("1.001" if name == "orders" else "NaN"))
    exporter.set("oracle_external_special", {"namespace": ns, "name": "refunds"},
                 Decimal("+Inf"))
    # what the generated objects of the Hypothesis test carry; discovered from the start
    for name in ("oracle_generated", "oracle_generated_present"):
        exporter.set(name, {"namespace": ns, "pod": "web-1"}, 1)


def _times(value: str, factor: str) -> Decimal:
    return Decimal(value) * Decimal(factor)


# --------------------------------------------------------------------------------------------
# Configurations

CONFIG_GEN_RESOURCE_RULES = """\
resourceRules:
  cpu:
    containerQuery: sum(rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>}[5m])) by (<<.GroupBy>>)
    nodeQuery: sum(rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>, id='/'}[5m])) by (<<.GroupBy>>)
    resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}, instance: {resource: node}}}
    containerLabel: container
  memory:
    containerQuery: sum(container_memory_working_set_bytes{<<.LabelMatchers>>}) by (<<.GroupBy>>)
    nodeQuery: sum(container_memory_working_set_bytes{<<.LabelMatchers>>,id='/'}) by (<<.GroupBy>>)
    resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}, instance: {resource: node}}}
    containerLabel: container
  window: 5m
"""  # noqa: E501 - config-gen prints each rule on one line

# prometheus-adapter's deploy/manifests/config-map.yaml (v0.12), verbatim but for the indentation.
UPSTREAM_MANIFEST_RESOURCE_RULES = """\
resourceRules:
  cpu:
    containerLabel: container
    containerQuery: |
      sum by (<<.GroupBy>>) (
        irate (
            container_cpu_usage_seconds_total{<<.LabelMatchers>>,container!="",pod!=""}[4m]
        )
      )
    nodeQuery: |
      sum by (<<.GroupBy>>) (
        irate(
            node_cpu_usage_seconds_total{<<.LabelMatchers>>}[4m]
        )
      )
    resources:
      overrides:
        namespace: {resource: namespace}
        node: {resource: node}
        pod: {resource: pod}
  memory:
    containerLabel: container
    containerQuery: |
      sum by (<<.GroupBy>>) (
        container_memory_working_set_bytes{<<.LabelMatchers>>,container!="",pod!=""}
      )
    nodeQuery: |
      sum by (<<.GroupBy>>) (
        node_memory_working_set_bytes{<<.LabelMatchers>>}
      )
    resources:
      overrides:
        node: {resource: node}
        namespace: {resource: namespace}
        pod: {resource: pod}
  window: 5m
"""

# How many rules map two labels to pods: prometheus-adapter picks one label per rule in Go's
# map order, each rule a coin toss: with 40 rules the chance that it picks `pod` for all of them
# (and the row shows nowhere) is 2^-40, once in about a trillion runs.
DUPLICATE_LABEL_RULES = 40

DOCS_RULES = """\
rules:
# docs/config-walkthrough.md, verbatim
- seriesQuery: 'http_requests_total{kubernetes_namespace!="",kubernetes_pod_name!=""}'
  resources:
    overrides:
      kubernetes_namespace: {resource: "namespace"}
      kubernetes_pod_name: {resource: "pod"}
  name:
    matches: "^(.*)_total"
    as: "${1}_per_second"
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
# docs/config.md: a group-aware template, with an override for the namespace label
- seriesQuery: 'oracle_rollout_progress'
  resources:
    template: "kube_<<.Group>>_<<.Resource>>"
    overrides:
      kube_namespace: {resource: namespace}
  metricsQuery: 'max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
# docs/config.md: `microservice` names a deployment
- seriesQuery: 'oracle_microservice_latency'
  resources:
    overrides:
      namespace: {resource: namespace}
      microservice: {group: "apps", resource: "deployment"}
  metricsQuery: 'max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
# seriesFilters (is/isNot, unanchored) and the implicit `$1`
- seriesQuery: '{__name__=~"^oracle_filtered_.*"}'
  seriesFilters:
  - is: "_bytes"
  - isNot: "^oracle_filtered_skip"
  resources: {template: "<<.Resource>>"}
  name: {matches: "^oracle_filtered_(.*)$"}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
# `$1_per_second` names group `1_per_second`, which does not exist: the name is empty
- seriesQuery: 'oracle_hits_total'
  resources: {template: "<<.Resource>>"}
  name: {matches: "^(.*)_total$", as: "$1_per_second"}
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
# the raw template fields
- seriesQuery: 'oracle_by_name'
  resources: {template: "<<.Resource>>"}
  metricsQuery: >-
    max(<<.Series>>{namespace="<<index .LabelValuesByName "namespace">>",<<index .GroupBySlice 0>>=~"<<index .LabelValuesByName (index .GroupBySlice 0)>>"}) by (<<index .GroupBySlice 0>>)
# cluster-scoped objects: nodes, a cluster-scoped custom resource, a storage class, a volume
- seriesQuery: '{__name__=~"oracle_node_temperature_celsius|oracle_widget_power"}'
  resources: {template: "<<.Resource>>"}
  metricsQuery: 'max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
- seriesQuery: '{__name__=~"oracle_(widget_usage|storage_iops|pv_bytes|gadget_level|node_queue|deploy_replicas)"}'
  resources: {template: "<<.Resource>>"}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
# a template and an override that both name pods (the override is the label queried)
- seriesQuery: 'oracle_both_labels'
  resources:
    template: "<<.Resource>>"
    overrides:
      kubernetes_pod_name: {resource: pod}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
# values that are not plain numbers
- seriesQuery: 'oracle_special_value'
  resources: {template: "<<.Resource>>"}
  metricsQuery: 'max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""  # noqa: E501

DUPLICATE_LABEL_RULE = """\
- seriesQuery: 'oracle_dup'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
      pod_name: {resource: pod}
  name: {matches: "^oracle_dup$", as: "oracle_dup_%02d"}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""

DOCS_EXTERNAL_RULES = """\
externalRules:
# docs/externalmetrics.md
- seriesQuery: '{__name__="queue_consumer_lag",name!=""}'
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (name)
  resources:
    overrides: { namespace: {resource: "namespace"} }
- seriesQuery: '{__name__="queue_depth",name!=""}'
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (name)
  resources:
    namespaced: false
# docs/sample-config.yaml's first external rule: no label for namespaces
- seriesQuery: '{__name__="oracle_unmapped_lag",name!=""}'
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (name)
# a name with capitals (the HPA asks for it lower-cased)
- seriesQuery: '{__name__="OracleQueueDepth"}'
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>})
  resources: {overrides: {namespace: {resource: namespace}}}
# raw series (every label comes back), a scalar, values that are not plain numbers
- seriesQuery: '{__name__="oracle_external_raw"}'
  metricsQuery: <<.Series>>{<<.LabelMatchers>>}
  resources: {overrides: {namespace: {resource: namespace}}}
- seriesQuery: '{__name__="oracle_external_raw"}'
  name: {as: "oracle_external_scalar"}
  metricsQuery: scalar(sum(<<.Series>>{<<.LabelMatchers>>}))
  resources: {overrides: {namespace: {resource: namespace}}}
- seriesQuery: '{__name__="oracle_external_special"}'
  metricsQuery: max(<<.Series>>{<<.LabelMatchers>>}) by (name)
  resources: {overrides: {namespace: {resource: namespace}}}
"""


def docs_config() -> str:
    duplicates = "".join(DUPLICATE_LABEL_RULE.replace("%02d", f"{i:02d}")
                         for i in range(1, DUPLICATE_LABEL_RULES + 1))
    return DOCS_RULES + duplicates + DOCS_EXTERNAL_RULES + UPSTREAM_MANIFEST_RESOURCE_RULES


# Rules that discover nothing: what both serve when there is no metric to list.
NOTHING_DISCOVERED = """\
rules:
- seriesQuery: 'oracle_never_exported'
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: 'oracle_never_exported'
  resources: {overrides: {namespace: {resource: namespace}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>})'
"""


def pair_configs() -> dict[str, str]:
    """Pair name -> the configuration both of its servers run."""
    return {
        "config-gen": CONFIG_GEN_DEFAULTS_YAML.lstrip() + CONFIG_GEN_RESOURCE_RULES,
        "defaults": DEFAULT_CONFIG_YAML,
        "docs": docs_config(),
        "nothing": NOTHING_DISCOVERED,
    }
