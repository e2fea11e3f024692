"""The requests sent to both servers of a pair: every discovered metric in every URL shape that
can ask for it, the discovery documents, the resource metrics, and the odd paths.

Requests are derived from what the two servers list (the union of both lists), so every rule
of every configuration is asked for in each shape: by name, by `*` with and without a label
selector, with a metric selector, for a missing object, namespaced and cluster-scoped, in both
custom metrics versions.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence

from tests.differential.comparison import Request
from tests.differential.world import CLUSTER_SCOPED_RESOURCES, CRD_GROUP, World

__all__ = [
    "DISCOVERY_PATHS",
    "custom_requests",
    "discovery_requests",
    "external_requests",
    "objects_of",
    "odd_requests",
    "resource_metrics_requests",
]

CUSTOM = "/apis/custom.metrics.k8s.io"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"
RESOURCE = "/apis/metrics.k8s.io/v1beta1"

DISCOVERY_PATHS = (
    "/apis", "/apis/custom.metrics.k8s.io", f"{CUSTOM}/v1beta1", f"{CUSTOM}/v1beta2",
    "/apis/external.metrics.k8s.io", EXTERNAL, "/apis/metrics.k8s.io", RESOURCE,
)


def _q(**params: str) -> str:
    return "?" + urllib.parse.urlencode(params) if params else ""


def objects_of(world: World, resource: str) -> tuple[str, ...]:
    """Names of the world's objects of a resource as discovery writes it (`pods`,
    `deployments.apps`, ...); an empty tuple for resources the world has none of."""
    return {
        "pods": tuple(world.pods),
        "services": world.services,
        "deployments.apps": world.deployments,
        "nodes": world.nodes,
        "persistentvolumes": world.persistent_volumes,
        "storageclasses.storage.k8s.io": world.storage_classes,
        f"widgets.{CRD_GROUP}": world.widgets,
        f"gadgets.{CRD_GROUP}": world.gadgets,
        "namespaces": (world.namespace, world.other_namespace),
    }.get(resource, ())


# What kube-apiserver's aggregator asks `/apis` with (aggregated discovery), and the HPA's Accept.
AGGREGATED_DISCOVERY = ("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
                        "application/json;g=apidiscovery.k8s.io;v=v2beta1;"
                        "as=APIGroupDiscoveryList,application/json")
HPA_ACCEPT = "application/vnd.kubernetes.protobuf, */*"


def discovery_requests(pair: str) -> list[Request]:
    return [*(Request(pair, path) for path in DISCOVERY_PATHS),
            Request(pair, "/apis", accept=AGGREGATED_DISCOVERY)]


def custom_requests(pair: str, world: World, listed: Iterable[tuple[str, bool]]
                    ) -> list[Request]:
    """Requests for every `(resource/metric, namespaced)` either server lists."""
    scopes: dict[str, set[bool]] = {}
    for name, namespaced in listed:
        scopes.setdefault(name, set()).add(namespaced)
    requests: list[Request] = []
    for name in sorted(scopes):
        resource, _, metric = name.partition("/")
        if not metric:
            continue  # an empty metric name cannot be asked for
        requests.extend(Request(pair, path)
                        for path in _custom_paths(world, resource, metric, scopes[name]))
    return requests


def _custom_paths(world: World, resource: str, metric: str, scopes: set[bool]
                  ) -> Iterator[str]:
    ns, other = world.namespace, world.other_namespace
    names = objects_of(world, resource)
    first = names[0] if names else "oracle"  # a job named after the exporter's job label
    metric_path = urllib.parse.quote(metric, safe="")
    if resource == "namespaces":
        for version in ("v1beta1", "v1beta2"):
            yield f"{CUSTOM}/{version}/namespaces/{ns}/metrics/{metric_path}"
        yield f"{CUSTOM}/v1beta2/namespaces/{other}/metrics/{metric_path}"
        yield (f"{CUSTOM}/v1beta2/namespaces/*/metrics/{metric_path}"
               + _q(labelSelector="oracle=" + world.token))
        yield f"{CUSTOM}/v1beta2/namespaces/{ns}/metrics/{metric_path}" + _q(
            metricLabelSelector="verb=GET")
        return
    if True in scopes:
        base = f"{CUSTOM}/v1beta2/namespaces/{ns}/{resource}"
        for version in ("v1beta1", "v1beta2"):
            yield f"{CUSTOM}/{version}/namespaces/{ns}/{resource}/*/{metric_path}"
        yield f"{base}/{first}/{metric_path}"
        yield f"{base}/missing-object/{metric_path}"
        yield f"{base}/*/{metric_path}" + _q(metricLabelSelector="verb=GET")
        yield f"{CUSTOM}/v1beta1/namespaces/{ns}/{resource}/{first}/{metric_path}" + _q(
            metricLabelSelector="verb in (GET,POST)")
        if resource == "pods":
            yield f"{base}/*/{metric_path}" + _q(labelSelector="app=web")
            yield f"{base}/*/{metric_path}" + _q(labelSelector="app=cache")
            yield f"{base}/*/{metric_path}" + _q(labelSelector="app=nothing")
            yield f"{CUSTOM}/v1beta2/namespaces/{other}/pods/*/{metric_path}"
    if False in scopes:
        if resource in ("nodes", "persistentvolumes") or resource in CLUSTER_SCOPED_RESOURCES:
            # the HPA's namespaced URL for a cluster-scoped kind
            yield f"{CUSTOM}/v1beta2/namespaces/{ns}/{resource}/{first}/{metric_path}"
        base = f"{CUSTOM}/v1beta2/{resource}"
        yield f"{base}/{first}/{metric_path}"
        yield f"{base}/*/{metric_path}"
        yield f"{CUSTOM}/v1beta1/{resource}/*/{metric_path}"


def external_requests(pair: str, world: World, metrics: Iterable[str]) -> list[Request]:
    ns, other = world.namespace, world.other_namespace
    requests: list[Request] = []
    for metric in sorted(set(metrics)):
        base = f"{EXTERNAL}/namespaces"
        paths = [f"{base}/{ns}/{metric}", f"{base}/{other}/{metric}",
                 f"{base}/{ns}/{metric}" + _q(labelSelector="topic=t1"),
                 f"{base}/{ns}/{metric}" + _q(labelSelector=f"namespace={other}"),
                 f"{base}/{ns}/{metric}" + _q(labelSelector="name in (orders,billing)")]
        if metric.lower() != metric:
            paths.append(f"{base}/{ns}/{metric.lower()}")
        requests.extend(Request(pair, path) for path in paths)
    return requests


def resource_metrics_requests(pair: str, world: World) -> list[Request]:
    ns = world.namespace
    paths = [
        f"{RESOURCE}/nodes", f"{RESOURCE}/nodes/node-a", f"{RESOURCE}/nodes/missing-node",
        f"{RESOURCE}/nodes" + _q(labelSelector="kubernetes.io/hostname=node-b"),
        f"{RESOURCE}/nodes" + _q(fieldSelector="metadata.name=node-a"),
        f"{RESOURCE}/namespaces/{ns}/pods", f"{RESOURCE}/namespaces/{ns}/pods/web-1",
        f"{RESOURCE}/namespaces/{ns}/pods/cache.v1", f"{RESOURCE}/namespaces/{ns}/pods/missing",
        f"{RESOURCE}/namespaces/{ns}/pods" + _q(labelSelector="tier=back"),
        f"{RESOURCE}/namespaces/{ns}/pods" + _q(fieldSelector="metadata.name=db-0"),
        f"{RESOURCE}/pods" + _q(labelSelector="oracle-world=" + world.token),
        f"{RESOURCE}/namespaces/{world.other_namespace}/pods",
    ]
    return [Request(pair, path) for path in paths]


def odd_requests(pair: str, world: World, metric: str) -> list[Request]:
    """Paths that are not metric requests, or not well formed, and other verbs."""
    ns = world.namespace
    paths: Sequence[tuple[str, str]] = (
        ("GET", f"{CUSTOM}/v1beta2/nodes/node-a"),
        ("GET", f"{CUSTOM}/v1beta2/namespaces/{ns}/pods/web-1"),
        ("GET", f"{CUSTOM}/v1beta2/namespaces/{ns}/metrics"),
        ("GET", f"{CUSTOM}/v1beta2/namespaces/{ns}/{metric}"),
        ("GET", f"{CUSTOM}/v1beta3/namespaces/{ns}/pods/*/{metric}"),
        ("GET", f"{CUSTOM}/v1beta2/namespaces/{ns}/pods/*/{metric}" + _q(labelSelector="===")),
        ("GET", f"{CUSTOM}/v1beta2/namespaces/{ns}/pods/*/{metric}" + _q(
            metricLabelSelector="===")),
        ("POST", f"{CUSTOM}/v1beta2/namespaces/{ns}/pods/*/{metric}"),
        ("DELETE", f"{CUSTOM}/v1beta2/namespaces/{ns}/pods/web-1/{metric}"),
        ("GET", "/healthz"), ("GET", "/livez"), ("GET", "/readyz"),
        ("GET", "/apis/unknown.example.com/v1"),
    )
    hpa = f"{CUSTOM}/v1beta2/namespaces/{ns}/pods/*/{metric}"
    return [*(Request(pair, path, method) for method, path in paths),
            Request(pair, hpa, accept=HPA_ACCEPT),
            Request(pair, hpa, accept="application/vnd.kubernetes.protobuf"),
            Request(pair, hpa, accept="application/yaml"),
            Request(pair, hpa, accept="text/plain")]


def listed(document: Mapping[str, object] | None) -> list[tuple[str, bool]]:
    """(name, namespaced) of a discovery document's resources."""
    resources = (document or {}).get("resources")
    if not isinstance(resources, list):
        return []
    return [(str(r.get("name")), bool(r.get("namespaced"))) for r in resources
            if isinstance(r, dict)]
