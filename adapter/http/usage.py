"""Answering `metrics.k8s.io/v1beta1` (resource metrics: `kubectl top`, CPU and memory HPAs).

Objects come from the watch-fed caches (running pods, nodes): nothing is LISTed per request.
Pods are grouped by namespace and each namespace's CPU and memory `containerQuery` run in
parallel; nodes take one CPU and one memory `nodeQuery` for all of them (prometheus-adapter.md
§9, the same PromQL, with values escaped as for the custom metrics). Where upstream drops what
it cannot serve without a word, here a list says in a `Warning` header how many objects were
left out and why, a single object without metrics is metrics-server's 404 (with the reason in
a `Warning`), and an unreachable Prometheus is a 503, so an autoscaler holds instead of acting
on a partial answer. On a tenant backend each namespace is queried with its own tenant; a
namespace whose tenant the backend does not serve (not in its `tenants`, or not discovered yet)
is not queried at all: its pods are left out, as pods without samples are.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple, Protocol, TypeVar

from adapter.api.routes import ResourceMetricsRoute
from adapter.api.usage import (
    AnswerTimes,
    NodeRef,
    PodLike,
    PodRef,
    PodUsage,
    Sample,
    assemble_node_usage,
    assemble_pod_usage,
    encode_pod_items,
    go_duration,
    object_not_found,
    pod_usage_items,
    render_node_metrics,
    render_node_metrics_list,
    render_pod_metrics,
    usage_not_found,
)
from adapter.api.wire import internal_error, service_unavailable
from adapter.http.handlers import Answer, ApiError, BackendRouter, QueryBackend
from adapter.kube.objects import KubeCacheFailed, PodMeta
from adapter.prometheus.client import (
    PrometheusError,
    PrometheusUnavailable,
    Scalar,
    UnexpectedResultType,
)
from adapter.rules.config import ResourceRule, ResourceRules
from adapter.rules.query import (
    UsageLabels,
    build_node_usage_query,
    build_pod_usage_query,
)
from adapter.rules.resources import ResourceMapper, builtin_catalog
from metricscale.kube.errors import KubeUnavailable
from metricscale.kube.informer import ObjectMeta

__all__ = ["ResourceMetricsService", "UsageObjects", "usage_labels"]

logger = logging.getLogger(__name__)

_RETRY_AFTER_SECONDS = 5
# Namespaces queried at once for an all-namespaces pod list (two queries each).
_CONCURRENT_NAMESPACES = 16

T = TypeVar("T")


class UsageObjects(Protocol):
    """Running pods and nodes (adapter.kube.objects.ObjectCaches has this shape)."""

    async def running_pods(self, namespace: str | None) -> list[PodMeta]: ...

    async def running_pod(self, namespace: str, name: str) -> PodMeta | None: ...

    async def nodes(self) -> list[ObjectMeta]: ...

    async def node(self, name: str) -> ObjectMeta | None: ...


def usage_labels(rule: ResourceRule) -> UsageLabels:
    """The labels of one resource rule (raises RuleQueryError: checked at start-up)."""
    mapper = ResourceMapper.build(template=rule.resources.label_template,
                                  overrides=rule.resources.overrides,
                                  catalog=builtin_catalog())
    return UsageLabels.of(rule, mapper)


def _pod_order(pod: PodMeta) -> tuple[str, str]:
    return pod.namespace, pod.name


def _pod_fields(pod: PodMeta) -> dict[str, str]:
    return {"metadata.name": pod.name, "metadata.namespace": pod.namespace,
            "spec.nodeName": pod.node_name, "status.phase": pod.phase}


class ResourceMetricsService:
    """Answers metrics.k8s.io requests from `resourceRules`."""

    def __init__(self, *, rules: ResourceRules, objects: UsageObjects, backends: BackendRouter,
                 clock: Callable[[], float]) -> None:
        self._rules = rules
        self._cpu = usage_labels(rules.cpu)
        self._memory = usage_labels(rules.memory)
        self._objects = objects
        self._backends = backends
        self._clock = clock
        self._window = go_duration(rules.window_milliseconds)

    async def answer(self, route: ResourceMetricsRoute) -> Answer:
        if route.kind == "nodes":
            return await self._nodes(route)
        return await self._pods(route)

    # -- pods ----------------------------------------------------------------------------

    async def _pods(self, route: ResourceMetricsRoute) -> Answer:
        pods = await self._requested_pods(route)
        by_namespace: dict[str, list[PodMeta]] = {}
        for pod in pods:
            by_namespace.setdefault(pod.namespace, []).append(pod)
        # A namespace whose tenant its backend does not serve is left out, and not queried.
        served, unserved = self._served_namespaces(by_namespace)
        if route.name is not None and unserved.pods:
            logger.info("pod %s/%s has no metrics: %s", route.namespace, route.name,
                        unserved.why)
            raise ApiError(usage_not_found("pods", namespace=route.namespace, name=route.name),
                           warnings=(unserved.why,))
        limit = asyncio.Semaphore(_CONCURRENT_NAMESPACES)
        at = self._clock()
        now = datetime.fromtimestamp(at, tz=UTC)
        times = AnswerTimes(now)
        # Namespaces in order, each's pods by name: the items are in metrics-server's order.
        results = await asyncio.gather(*(
            self._namespace_usage(route, refs, clients=served[ns], limit=limit, at=at,
                                  times=times)
            for ns, refs in by_namespace.items() if ns in served))
        missing = [ref for result in results for ref in result.missing]
        why = _missing_reason(sum(r.no_cpu for r in results), sum(r.no_memory for r in results),
                              query="containerQuery")
        if route.name is not None:
            usages = [u for result in results for u in result.found if isinstance(u, PodUsage)]
            if not usages:
                logger.info("pod %s/%s has no metrics: %s", route.namespace, route.name, why)
                raise ApiError(usage_not_found("pods", namespace=route.namespace,
                                               name=route.name), warnings=(why,))
            return Answer(render_pod_metrics(usages[0], window=self._window, now=now))
        body = encode_pod_items([item for result in results for item in result.found
                                 if isinstance(item, str)])
        return Answer(body, warnings=_pod_list_warnings(pods=pods, unserved=unserved,
                                                        missing=missing, why=why))

    async def _requested_pods(self, route: ResourceMetricsRoute) -> list[PodMeta]:
        """The running pod named, or the running pods selected, in namespace and name order."""
        if route.name is not None:
            assert route.namespace is not None
            pod = await self._cached(self._objects.running_pod(route.namespace, route.name))
            if pod is None:
                raise ApiError(object_not_found("pods", route.name))
            return [pod]
        candidates = await self._cached(self._objects.running_pods(route.namespace))
        labels, fields = route.label_selector, route.field_selector
        if not labels.is_empty() or not fields.is_empty():
            candidates = [p for p in candidates if labels.matches(p.labels)
                          and fields.matches(_pod_fields(p))]
        return sorted(candidates, key=_pod_order)

    def _served_namespaces(self, by_namespace: dict[str, list[PodMeta]],
                           ) -> tuple[dict[str, tuple[QueryBackend, QueryBackend]], _Unserved]:
        """Each namespace's CPU and memory clients, and what is left out (no tenant served)."""
        served: dict[str, tuple[QueryBackend, QueryBackend]] = {}
        unserved = _Unserved()
        for namespace, refs in by_namespace.items():
            cpu_client = self._client(self._rules.cpu, namespace=namespace)
            memory_client = self._client(self._rules.memory, namespace=namespace)
            if cpu_client is not None and memory_client is not None:
                served[namespace] = (cpu_client, memory_client)
                continue
            unserved.pods.extend(refs)
            unserved.namespaces.append(namespace)
            rule, what = ((self._rules.cpu, "cpu") if cpu_client is None
                          else (self._rules.memory, "memory"))
            unserved.why = unserved.why or _no_tenant_reason(rule, what=what,
                                                             namespace=namespace)
        return served, unserved

    async def _namespace_usage(self, route: ResourceMetricsRoute, refs: list[PodMeta], *,
                               clients: tuple[QueryBackend, QueryBackend],
                               limit: asyncio.Semaphore, at: float,
                               times: AnswerTimes) -> _NamespaceUsage:
        """One namespace's pods: its CPU and memory queries at once, then the assembly."""
        names = [ref.name for ref in refs]
        namespace = refs[0].namespace
        cpu_client, memory_client = clients
        async with limit:
            cpu, memory = await asyncio.gather(
                self._query(build_pod_usage_query(rule=self._rules.cpu, labels=self._cpu,
                                                  namespace=namespace, pods=names),
                            at=at, what="resourceRules.cpu.containerQuery",
                            backend=cpu_client),
                self._query(build_pod_usage_query(rule=self._rules.memory,
                                                  labels=self._memory,
                                                  namespace=namespace, pods=names),
                            at=at, what="resourceRules.memory.containerQuery",
                            backend=memory_client))
        found: list[str] | list[PodUsage]
        missing: Sequence[PodLike]
        if route.name is None:  # a list: each pod's item encoded as it is assembled
            found, missing = pod_usage_items(
                refs, cpu=cpu, memory=memory, pod_label=self._cpu.pod,
                container_label=self._cpu.container, window=self._window, times=times)
        else:
            found, missing = assemble_pod_usage(
                [PodRef(r.namespace, r.name, r.labels, r.labels_json) for r in refs],
                cpu=cpu, memory=memory, pod_label=self._cpu.pod,
                container_label=self._cpu.container)
        if not missing:
            return _NamespaceUsage(found, missing, 0, 0)
        cpu_pods = {labels.get(self._cpu.pod) for labels, _, _ in cpu}
        memory_pods = {labels.get(self._memory.pod) for labels, _, _ in memory}
        no_cpu = sum(1 for ref in missing if ref.name not in cpu_pods)
        no_memory = sum(1 for ref in missing if ref.name not in memory_pods)
        return _NamespaceUsage(found, missing, no_cpu, no_memory)

    # -- nodes ---------------------------------------------------------------------------

    async def _nodes(self, route: ResourceMetricsRoute) -> Answer:
        if route.name is not None:
            node = await self._cached(self._objects.node(route.name))
            if node is None:
                raise ApiError(object_not_found("nodes", route.name))
            nodes = [node]
        else:
            candidates = await self._cached(self._objects.nodes())
            nodes = sorted((n for n in candidates if route.label_selector.matches(n.labels)
                            and route.field_selector.matches({"metadata.name": n.name})),
                           key=lambda n: n.name)
        refs = [NodeRef(node.name, node.labels) for node in nodes]
        at = self._clock()
        now = datetime.fromtimestamp(at, tz=UTC)
        if not refs:
            return Answer(render_node_metrics_list([], window=self._window, now=now))
        names = [ref.name for ref in refs]
        cpu, memory = await asyncio.gather(
            self._query(build_node_usage_query(rule=self._rules.cpu, labels=self._cpu,
                                               nodes=names),
                        at=at, what="resourceRules.cpu.nodeQuery",
                        backend=self._node_client(self._rules.cpu, what="cpu")),
            self._query(build_node_usage_query(rule=self._rules.memory, labels=self._memory,
                                               nodes=names),
                        at=at, what="resourceRules.memory.nodeQuery",
                        backend=self._node_client(self._rules.memory, what="memory")))
        usages, missing = assemble_node_usage(refs, cpu=cpu, memory=memory,
                                              node_label=self._cpu.node)
        cpu_nodes = {labels.get(self._cpu.node) for labels, _, _ in cpu}
        memory_nodes = {labels.get(self._memory.node) for labels, _, _ in memory}
        why = _missing_reason(sum(1 for r in missing if r.name not in cpu_nodes),
                              sum(1 for r in missing if r.name not in memory_nodes),
                              query="nodeQuery", label=self._cpu.node)
        if route.name is not None:
            if not usages:
                logger.info("node %s has no metrics: %s", route.name, why)
                raise ApiError(usage_not_found("nodes", namespace=None, name=route.name),
                               warnings=(why,))
            return Answer(render_node_metrics(usages[0], window=self._window, now=now))
        body = render_node_metrics_list(usages, window=self._window, now=now)
        if not missing:
            return Answer(body)
        warning = f"{len(missing)} of {len(refs)} nodes have no metrics: {why}"
        logger.info("%s (first: %s)", warning, missing[0].name)
        return Answer(body, warnings=(warning,))

    # -- I/O -----------------------------------------------------------------------------

    @staticmethod
    async def _cached(call: Awaitable[T]) -> T:
        try:
            return await call
        except KubeUnavailable as error:
            logger.warning("cannot read the object caches: %s", error)
            raise ApiError(service_unavailable(
                message=f"unable to list objects: {error}",
                retry_after_seconds=_RETRY_AFTER_SECONDS)) from None
        except KubeCacheFailed as error:
            logger.error("cannot read the object caches: %s", error)
            raise ApiError(internal_error("unable to list objects")) from None

    def _client(self, rule: ResourceRule, *, namespace: str | None) -> QueryBackend | None:
        """The client of `rule`'s backend for `namespace`'s tenant; None: not served."""
        return self._backends.client_for(rule.backend, namespace=namespace, tenants=None)

    def _node_client(self, rule: ResourceRule, *, what: str) -> QueryBackend:
        backend = self._client(rule, namespace=None)
        if backend is None:
            # The configuration requires a default tenant for resourceRules: not reached.
            raise ApiError(internal_error(
                f"unable to fetch metrics: {_no_tenant_reason(rule, what=what, namespace=None)}"))
        return backend

    async def _query(self, promql: str, *, at: float, what: str,
                     backend: QueryBackend) -> Sequence[Sample]:
        try:
            result = await backend.query(promql, at=at)
        except PrometheusUnavailable as error:
            logger.warning("%s: Prometheus unavailable: %s (%s)", what, error, error.detail)
            raise ApiError(service_unavailable(
                message=f"unable to fetch metrics: {error}",
                retry_after_seconds=_RETRY_AFTER_SECONDS)) from None
        except UnexpectedResultType as error:
            logger.warning("%s: %s: %s", what, error, promql)
            raise ApiError(internal_error(f"unable to fetch metrics: {error}")) from None
        except PrometheusError as error:
            logger.warning("%s: the query failed: %s (%s); query: %s", what, error,
                           error.detail, promql)
            raise ApiError(internal_error(f"unable to fetch metrics: the {what} failed")) \
                from None
        if isinstance(result, Scalar):
            logger.warning("%s returned a scalar; it must return a vector: %s", what, promql)
            raise ApiError(internal_error(f"unable to fetch metrics: the {what} returned a "
                                          "scalar"))
        return result.samples  # each a (labels, timestamp, value) Sample already


@dataclass
class _Unserved:
    """The pods of namespaces whose tenant a backend does not serve, and why (the first)."""

    pods: list[PodMeta] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    why: str = ""


class _NamespaceUsage(NamedTuple):
    found: list[str] | list[PodUsage]  # encoded list items, or a single pod's usage
    missing: Sequence[PodLike]
    no_cpu: int
    no_memory: int


def _pod_list_warnings(*, pods: Sequence[PodMeta], unserved: _Unserved,
                       missing: Sequence[PodLike], why: str) -> tuple[str, ...]:
    """The `Warning`s of a pod list: pods left out as unserved, then pods without samples."""
    warnings = []
    if unserved.pods:
        more = len(unserved.namespaces) - 1
        warning = (f"{len(unserved.pods)} of {len(pods)} running pods are left out: "
                   f"{unserved.why}" + (f"; and {more} more namespaces" if more else ""))
        logger.info("%s (first: %s/%s)", warning, unserved.pods[0].namespace,
                    unserved.pods[0].name)
        warnings.append(warning)
    if missing:
        warning = f"{len(missing)} of {len(pods)} running pods have no metrics: {why}"
        logger.info("%s (first: %s/%s)", warning, missing[0].namespace, missing[0].name)
        warnings.append(warning)
    return tuple(warnings)


def _no_tenant_reason(rule: ResourceRule, *, what: str, namespace: str | None) -> str:
    where = f"namespace {namespace}" if namespace else "cluster-scoped requests"
    return (f"backend {rule.backend!r} of resourceRules.{what} does not serve the tenant of "
            f"{where} (not in its tenants, or not discovered yet)")


def _missing_reason(no_cpu: int, no_memory: int, *, query: str, label: str = "") -> str:
    parts = []
    if no_cpu:
        parts.append(f"{no_cpu} without a CPU sample (resourceRules.cpu.{query})")
    if no_memory:
        parts.append(f"{no_memory} without a memory sample (resourceRules.memory.{query})")
    reason = "; ".join(parts) or "no samples"
    if label:
        reason += f"; the node name is read from the label {label!r}"
    return reason
