"""Helpers shared by the controller's tests: bounded waits, and in-memory doubles of the
Kubernetes, metrics and Lease APIs and of the watch caches."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from autoscaler.controller.watching import (
    AutoscalerEntry,
    AutoscalerKey,
    PodIndex,
    SelectorCache,
    SelectorRegistry,
    project_autoscaler,
)
from autoscaler.decision.leadership import Lease, LeaseSpec
from autoscaler.decision.pod_selection import ReplicaSetOwner
from autoscaler.kube.metrics_api import MetricsError
from autoscaler.kube.operations import (
    EventType,
    ObjectReference,
    ScaleTargetRef,
    TargetNotFound,
    merge_patch,
)
from autoscaler.model.pods import Pod, Scale, parse_scale
from metricscale.kube.discovery import ResourceMapping
from metricscale.kube.errors import AlreadyExists, Conflict, KindNotFound, KubeError


async def eventually(check: Callable[[], object], within: float = 60.0,
                     message: str = "") -> None:
    """Poll `check` until it is truthy; fail after `within` seconds (a bound, not a delay)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        if check():
            return
        if loop.time() > deadline:
            raise AssertionError(message or f"condition not met within {within}s")
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------ in-memory doubles


DEPLOYMENTS = ResourceMapping(group="apps", version="v1", resource="deployments",
                              kind="Deployment", namespaced=True, has_scale=True)


@dataclass
class RecordedEvent:
    namespace: str
    name: str
    type: str
    reason: str
    note: str
    time: datetime | None = None  # the reconcile's `now`, the Event's eventTime


class MemoryCaches:
    """The watch caches of autoscaler.controller.watching, filled by hand."""

    def __init__(self) -> None:
        self.entries: dict[AutoscalerKey, AutoscalerEntry] = {}
        self.pods = PodIndex()
        self.selectors = SelectorCache()
        self.registry = SelectorRegistry(self.pods, self.selectors)
        self.replica_set_list: list[ReplicaSetOwner] = []

    def put(self, raw: Mapping[str, Any]) -> AutoscalerEntry:
        entry = project_autoscaler(raw)
        self.entries[entry.key] = entry
        return entry

    def add_pod(self, pod: Pod) -> None:
        self.pods.add(pod)

    def get(self, key: AutoscalerKey) -> AutoscalerEntry | None:
        return self.entries.get(key)

    def select_pods(self, namespace: str, selector: str) -> list[Pod]:
        return self.pods.select(namespace, self.selectors.parse(selector))

    def replica_sets(self, namespace: str) -> dict[str, ReplicaSetOwner]:
        return {rs.name: rs for rs in self.replica_set_list if rs.namespace == namespace}


@dataclass
class MemoryKube:
    """KubeWrites in memory: scales by (namespace, name), status writes applied to the caches
    (as the watch would), every call counted by method."""

    caches: MemoryCaches
    scales: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    events: list[RecordedEvent] = field(default_factory=list)
    status_writes: list[tuple[str, str, Mapping[str, Any]]] = field(default_factory=list)
    scale_writes: list[tuple[str, str, int]] = field(default_factory=list)
    annotation_writes: list[tuple[str, str, Mapping[str, str | None]]] = field(
        default_factory=list)
    fail: dict[str, list[KubeError]] = field(default_factory=dict)
    kinds: dict[str, ResourceMapping] = field(
        default_factory=lambda: {"Deployment": DEPLOYMENTS})
    # True: status writes are not (yet) seen by the caches, as when the watch lags behind.
    lagging_watch: bool = False
    # (namespace, name) -> what every scale write of that target fails with.
    failing_scale_writes: dict[tuple[str, str], KubeError] = field(default_factory=dict)

    def set_scale(self, namespace: str, name: str, *, replicas: int, selector: str,
                  status_replicas: int | None = None) -> None:
        self.scales[(namespace, name)] = {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "spec": {"replicas": replicas},
            "status": {"replicas": replicas if status_replicas is None else status_replicas,
                       "selector": selector}}

    def replicas(self, namespace: str, name: str) -> int:
        return int(self.scales[(namespace, name)]["spec"]["replicas"])

    def _call(self, method: str) -> None:
        self.calls.append(method)
        failures = self.fail.get(method)
        if failures:
            raise failures.pop(0)

    def count(self, method: str) -> int:
        return self.calls.count(method)

    async def resolve_scale_target(self, ref: ScaleTargetRef) -> ResourceMapping:
        mapping = self.kinds.get(ref.kind)
        if mapping is None:
            raise KindNotFound(f'no matches for kind "{ref.kind}" in group "apps"')
        return mapping

    async def get_scale(self, target: ResourceMapping, *, namespace: str, name: str) -> Scale:
        self._call("get_scale")
        obj = self.scales.get((namespace, name))
        if obj is None:
            raise TargetNotFound(f'{target.group_resource} "{name}" not found', status=404,
                                 reason="NotFound")
        scale = parse_scale(obj)
        assert isinstance(scale, Scale)
        return replace(scale, name=name, namespace=namespace)

    async def update_scale(self, target: ResourceMapping, *, namespace: str, name: str,
                           scale: Scale, replicas: int) -> Scale:
        self._call("update_scale")
        failure = self.failing_scale_writes.get((namespace, name))
        if failure is not None:
            raise failure
        obj = self.scales[(namespace, name)]
        obj["spec"]["replicas"] = replicas
        obj["status"]["replicas"] = replicas
        self.scale_writes.append((namespace, name, replicas))
        scale = parse_scale(obj)
        assert isinstance(scale, Scale)
        return replace(scale, name=name, namespace=namespace)

    def _apply_status(self, namespace: str, name: str, kind: str,
                      status: Mapping[str, Any], previous: Mapping[str, Any] | None) -> None:
        if self.lagging_watch:
            return
        key = AutoscalerKey(kind, namespace, name)
        entry = self.caches.entries[key]
        raw = dict(entry.raw)
        metadata = dict(raw.get("metadata") or {})
        metadata["resourceVersion"] = str(int(metadata.get("resourceVersion") or 0) + 1)
        raw["metadata"] = metadata
        patch = merge_patch(previous or {}, status)
        merged = dict(raw.get("status") or {})
        for field_name, value in patch.items():
            if value is None:
                merged.pop(field_name, None)
            else:
                merged[field_name] = status[field_name]
        raw["status"] = merged
        self.caches.put(raw)

    async def write_autoscaler_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any],
        previous: Mapping[str, Any] | None, resource_version: str | None = None,
    ) -> Mapping[str, Any]:
        self._call("write_status")
        self.status_writes.append((namespace, name, status))
        self._apply_status(namespace, name, "Autoscaler", status, previous)
        return status

    async def write_hpa_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any],
        previous: Mapping[str, Any] | None, resource_version: str | None = None,
    ) -> Mapping[str, Any]:
        self._call("write_status")
        self.status_writes.append((namespace, name, status))
        self._apply_status(namespace, name, "HorizontalPodAutoscaler", status, previous)
        return status

    async def patch_hpa_annotations(self, *, namespace: str, name: str,
                                    annotations: Mapping[str, str | None]) -> Mapping[str, Any]:
        self._call("patch_annotations")
        self.annotation_writes.append((namespace, name, annotations))
        key = AutoscalerKey("HorizontalPodAutoscaler", namespace, name)
        raw = dict(self.caches.entries[key].raw)
        metadata = dict(raw["metadata"])
        merged = {**metadata.get("annotations", {}), **annotations}
        metadata["annotations"] = {k: v for k, v in merged.items() if v is not None}
        raw["metadata"] = metadata
        self.caches.put(raw)
        return raw

    async def create_event(self, *, regarding: ObjectReference, event_type: EventType,
                           reason: str, note: str, now: datetime,
                           action: str = "Scale") -> bool:
        self.calls.append("create_event")
        self.events.append(RecordedEvent(regarding.namespace, regarding.name, event_type,
                                         reason, note, now))
        return True


@dataclass
class MemoryMetrics:
    """MetricsAPI in memory: per metric name, a value per pod (or an error to raise)."""

    pod_values: dict[str, dict[str, str]] = field(default_factory=dict)
    cpu_usage: dict[str, str] = field(default_factory=dict)
    external: dict[str, str] = field(default_factory=dict)
    errors: dict[str, MetricsError] = field(default_factory=dict)
    timestamp: str = "2026-11-21T10:00:00Z"
    calls: list[str] = field(default_factory=list)

    async def get_resource_metrics(self, *, namespace: str, pod_selector: str) -> dict[str, Any]:
        self.calls.append("resource")
        if "cpu" in self.errors:
            raise self.errors["cpu"]
        return {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "items": [
            {"metadata": {"name": pod, "namespace": namespace}, "timestamp": self.timestamp,
             "window": "30s", "containers": [{"name": "app", "usage": {"cpu": usage}}]}
            for pod, usage in self.cpu_usage.items()]}

    async def get_pods_metric(self, *, namespace: str, metric_name: str, pod_selector: str,
                              metric_selector: Mapping[str, Any] | None) -> dict[str, Any]:
        self.calls.append(f"pods/{metric_name}")
        if metric_name in self.errors:
            raise self.errors[metric_name]
        items = [{"describedObject": {"kind": "Pod", "namespace": namespace, "name": pod,
                                      "apiVersion": "/v1"},
                  "metric": {"name": metric_name}, "timestamp": self.timestamp,
                  "windowSeconds": 60, "value": value}
                 for pod, value in self.pod_values.get(metric_name, {}).items()]
        if not items:
            raise MetricsError.no_metrics("custom")
        return {"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta2",
                "metadata": {}, "items": items}

    async def get_object_metric(self, *, namespace: str, metric_name: str,
                                described_object: Mapping[str, Any],
                                metric_selector: Mapping[str, Any] | None) -> dict[str, Any]:
        raise MetricsError("not served", api="custom")

    async def get_external_metric(self, *, namespace: str, metric_name: str,
                                  metric_selector: Mapping[str, Any] | None) -> dict[str, Any]:
        self.calls.append(f"external/{metric_name}")
        if metric_name in self.errors:
            raise self.errors[metric_name]
        return {"kind": "ExternalMetricValueList",
                "apiVersion": "external.metrics.k8s.io/v1beta1", "metadata": {},
                "items": [{"metricName": metric_name, "metricLabels": {},
                           "timestamp": self.timestamp, "value": self.external[metric_name]}]}


def conflict() -> Conflict:
    return Conflict('Operation cannot be fulfilled on deployments.apps "web": the object has '
                    "been modified; please apply your changes to the latest version and try "
                    "again", status=409, reason="Conflict")


class MemoryLeases:
    """A LeaseStore with the API server's optimistic concurrency, and fault injection."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], Lease] = {}
        self.version = 0
        self.fail: KubeError | None = None
        self.writes = 0

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    def _store(self, namespace: str, name: str, spec: LeaseSpec,
               annotations: Mapping[str, str] | None) -> Lease:
        self.version += 1
        self.writes += 1
        lease = Lease(spec=spec, resource_version=str(self.version),
                      raw={"metadata": {"namespace": namespace, "name": name}},
                      annotations=dict(annotations or {}))
        self.leases[(namespace, name)] = lease
        return lease

    async def read_lease(self, *, namespace: str, name: str) -> Lease | None:
        self._check()
        return self.leases.get((namespace, name))

    async def create_lease(self, *, namespace: str, name: str, spec: LeaseSpec,
                           annotations: Mapping[str, str] | None = None) -> Lease:
        self._check()
        if (namespace, name) in self.leases:
            raise AlreadyExists(f'leases.coordination.k8s.io "{name}" already exists',
                                status=409, reason="AlreadyExists")
        return self._store(namespace, name, spec, annotations)

    async def replace_lease(self, lease: Lease, *, spec: LeaseSpec,
                            annotations: Mapping[str, str] | None = None) -> Lease:
        self._check()
        key = (lease.raw["metadata"]["namespace"], lease.raw["metadata"]["name"])
        if self.leases[key].resource_version != lease.resource_version:
            raise Conflict("the object has been modified", status=409, reason="Conflict")
        return self._store(*key, spec, {**lease.annotations, **(annotations or {})})
