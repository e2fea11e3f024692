"""One controller over many autoscalers, one per path through the decision, on the injected
clock: every condition reason it can set, each metric source's current value, each error path
(a missing target, unreadable metrics of every source type, a failed scale write, ambiguous
selectors, a spec the API should have refused), dry run, pause, fallback, activation, external
scale changes, pod selection and the persisted history with scale events.

Shared by tests/autoscaler/test_controller_status_shapes.py (each status against the CRD's
schema and CEL rules) and tests/cluster/test_status_shapes_on_cluster.py (each status and
Event written to the real kube-apiserver)."""

from __future__ import annotations

from typing import Any

from autoscaler.decision.settings import Settings
from autoscaler.kube.metrics_api import MetricsError
from metricscale.kube.errors import ServerError
from tests.autoscaler.simulation import (
    NS,
    Cluster,
    autoscaler,
    cpu_metric,
    external_metric,
    pods_metric,
)

SYNC = 15
SLOW_UP = {"scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                       "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}
SLOW_DOWN = {"scaleDown": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                           "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}

# name -> the conditions (type -> (status, reason)) its status must reach
EXPECTED: dict[str, dict[str, tuple[str, str]]] = {
    "grow": {"AbleToScale": ("True", "SucceededRescale"),
             "ScalingActive": ("True", "ValidMetricFound"),
             "ScalingLimited": ("True", "ScaleUpLimit")},
    "shrink": {"ScalingLimited": ("True", "ScaleDownLimit")},
    "calm": {"AbleToScale": ("True", "ScaleDownStabilized")},
    "cpu": {"ScalingActive": ("True", "ValidMetricFound"),
            "ScalingLimited": ("True", "TooFewReplicas")},
    "box": {"ScalingActive": ("True", "ValidMetricFound")},
    "capped": {"ScalingLimited": ("True", "TooManyReplicas")},
    "steady": {"AbleToScale": ("True", "ReadyForNewScale"),
               "ScalingLimited": ("False", "DesiredWithinRange")},
    "dry": {"AbleToScale": ("True", "DryRun")},
    "gone": {"AbleToScale": ("False", "FailedGetScale")},
    "nometric": {"ScalingActive": ("False", "FailedGetPodsMetric")},
    "external": {"ScalingActive": ("False", "FailedGetExternalMetric")},
    "object": {"ScalingActive": ("False", "FailedGetObjectMetric")},
    "memory": {"ScalingActive": ("False", "FailedGetResourceMetric")},
    "sidecar": {"ScalingActive": ("False", "FailedGetContainerResourceMetric")},
    "writefail": {"AbleToScale": ("False", "FailedUpdateScale")},
    "disabled": {"ScalingActive": ("False", "ScalingDisabled")},
    "twin-a": {"ScalingActive": ("False", "AmbiguousSelector")},
    "twin-b": {"ScalingActive": ("False", "AmbiguousSelector")},
    "unknown": {"ScalingActive": ("False", "InvalidMetricSourceType")},
    "paused": {"Paused": ("True", "Paused")},
    "pinned": {"Paused": ("True", "PausedAtReplicas")},
    "scalein": {"Paused": ("True", "ScaleInPaused")},
    "fallback": {"Fallback": ("True", "FallbackActive"),
                 "ScalingActive": ("True", "ValidMetricFound")},
    "idle": {"Active": ("False", "ScalerNotActive")},
    "awake": {"Active": ("True", "ScalerActive")},
    "conflict": {"ScalingConflict": ("True", "ExternalScaleChanges")},
    "owners": {"ScalingActive": ("True", "ValidMetricFound")},
}
# Written straight to storage, as objects made before a schema change would be: their specs
# are invalid on purpose.
INVALID_SPECS = frozenset({"unknown"})


def _object_metric() -> dict[str, Any]:
    return {"type": "Object", "object": {
        "describedObject": {"apiVersion": "v1", "kind": "Service", "name": "front"},
        "metric": {"name": "requests"}, "target": {"type": "Value", "value": "10"}}}


def _container_metric(container: str = "app") -> dict[str, Any]:
    return {"type": "ContainerResource", "containerResource": {
        "name": "cpu", "container": container,
        "target": {"type": "AverageValue", "averageValue": "100m"}}}


def reached(cluster: Cluster, name: str) -> bool:
    """Some status written for `name` had all its EXPECTED conditions at once."""
    def has(status: Any) -> bool:
        found = {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions") or []}
        return all(found.get(kind) == wanted for kind, wanted in EXPECTED[name].items())
    return any(has(status) for namespace, written, status in cluster.kube.status_writes
               if (namespace, written) == (NS, name))


async def every_status_shape() -> Cluster:
    """The cluster after the controller has reconciled every autoscaler for a while."""
    cluster = Cluster()
    kube, metrics = cluster.kube, cluster.metrics
    for name, replicas, load in (("grow", 2, 60), ("shrink", 5, 10), ("capped", 2, 500),
                                 ("calm", 2, 10), ("steady", 2, 20), ("dry", 2, 60),
                                 ("writefail", 2, 60), ("disabled", 0, 0), ("twin", 2, 20),
                                 ("paused", 2, 60), ("pinned", 2, 20), ("scalein", 4, 10),
                                 ("fallback", 2, 20), ("conflict", 2, 20), ("owners", 2, 20)):
        cluster.deployment(name, replicas=replicas, load=load, metric=f"rps_{name}")
    cluster.deployment("cpu", replicas=2, load="0.1", metric="cpu")
    cluster.deployment("box", replicas=2, load="0.2", metric="cpu")
    for name in ("memory", "sidecar", "nometric", "external", "object", "unknown", "idle",
                 "awake"):
        cluster.deployment(name, replicas=2 if name not in {"idle", "awake"} else 0)
    kube.failing_scale_writes[(NS, "writefail")] = ServerError(
        "etcd is sad", status=500, reason="InternalError")
    metrics.errors["queue_depth"] = MetricsError(
        "the server could not find the requested resource (get "
        "queue_depth.external.metrics.k8s.io)", api="external")
    metrics.errors["rps_fallback"] = MetricsError(
        "the server is currently unable to handle the request (get "
        "pods.custom.metrics.k8s.io *)", api="custom")
    metrics.external.update(queue_idle="2", queue_awake="25")
    # A Job's busy pod sharing the Deployment's labels: left out by OwnerReferences.
    cluster.add_pod("migrate-x", labels={"app": "owners"},
                    owner={"apiVersion": "batch/v1", "kind": "Job", "name": "migrate"})
    metrics.pod_values["rps_owners"]["migrate-x"] = "70"

    def pods(name: str) -> list[dict[str, Any]]:
        return [pods_metric(f"rps_{name}", "10")]

    idle = {"replicas": 0, "cooldownSeconds": 300}
    definitions = [
        autoscaler("grow", target="grow", metrics=pods("grow"), behavior=SLOW_UP),
        autoscaler("shrink", target="shrink", metrics=pods("shrink"), behavior=SLOW_DOWN),
        autoscaler("calm", target="calm", metrics=pods("calm")),
        autoscaler("cpu", target="cpu", metrics=[cpu_metric(50)], min_replicas=2,
                   behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}),
        autoscaler("box", target="box", metrics=[_container_metric()], min_replicas=2,
                   max_replicas=2),
        autoscaler("capped", target="capped", metrics=pods("capped"), max_replicas=3),
        autoscaler("steady", target="steady", metrics=pods("steady")),
        autoscaler("dry", target="dry", metrics=pods("dry"),
                   annotations={"metricscale.dev/dry-run": "true"}),
        autoscaler("gone", target="nowhere", metrics=[pods_metric("rps_x", "10")]),
        # The metrics API serves cpu of container "app" only.
        autoscaler("memory", target="memory", metrics=[{
            "type": "Resource", "resource": {"name": "memory", "target": {
                "type": "AverageValue", "averageValue": "100Mi"}}}]),
        autoscaler("sidecar", target="sidecar", metrics=[_container_metric("sidecar")]),
        autoscaler("nometric", target="nometric",
                   metrics=[pods_metric("never_published", "10")]),
        autoscaler("external", target="external", metrics=[external_metric(
            "queue_depth", "30")]),
        autoscaler("object", target="object", metrics=[_object_metric()]),
        autoscaler("writefail", target="writefail", metrics=pods("writefail")),
        autoscaler("disabled", target="disabled", metrics=pods("disabled")),
        autoscaler("twin-a", target="twin", metrics=pods("twin")),
        autoscaler("twin-b", target="twin", metrics=pods("twin")),
        autoscaler("unknown", target="unknown", metrics=[{"type": "Prometheus", "pods": {}}]),
        autoscaler("paused", target="paused", metrics=pods("paused"),
                   annotations={"metricscale.dev/paused": "true"}),
        autoscaler("pinned", target="pinned", metrics=pods("pinned"),
                   annotations={"metricscale.dev/paused-replicas": "3"}),
        autoscaler("scalein", target="scalein", metrics=pods("scalein"),
                   annotations={"metricscale.dev/paused-scale-in": "true"}),
        autoscaler("fallback", target="fallback", metrics=[{"type": "Pods", "pods": {
            **pods("fallback")[0]["pods"], "fallback": {"replicas": 4, "failureThreshold": 1}}}]),
        autoscaler("idle", target="idle", idle=idle, metrics=[external_metric(
            "queue_idle", "10", activationThreshold="5")]),
        autoscaler("awake", target="awake", idle=idle, metrics=[external_metric(
            "queue_awake", "10", activationThreshold="5")]),
        autoscaler("conflict", target="conflict", metrics=pods("conflict")),
        autoscaler("owners", target="owners", metrics=pods("owners"),
                   podSelectionStrategy="OwnerReferences"),
    ]
    for obj in definitions:
        cluster.create(obj)
    cluster.replica(settings=Settings(scale_to_zero=True))
    await cluster.run_for(SYNC)
    # Two changes behind the controller's back, a sync apart: a conflict.
    for replicas in (5, 7):
        cluster.scale_externally("conflict", replicas)
        await cluster.run_for(SYNC)
    await cluster.run_for(4 * SYNC)
    return cluster

