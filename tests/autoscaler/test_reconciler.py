"""autoscaler.controller.reconciler: one reconcile, read-decide-write, against in-memory doubles of
the Kubernetes and metrics APIs: what it asks, what it writes (and only when it changed), events,
dry run, errors that leave everything else running, history that survives a restart; and the
Kubernetes double held to what the real client answers against the real kube-apiserver."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.controller.leader import NotLeader
from autoscaler.controller.reconciler import Reconciler, metric_input_from_error
from autoscaler.controller.stats import ControllerMetrics
from autoscaler.controller.watching import AutoscalerKey, project_pod
from autoscaler.decision.persistence import DRY_RUN_ANNOTATION, HISTORY_ANNOTATION
from autoscaler.decision.settings import Settings
from autoscaler.kube.metrics_api import MetricsError
from autoscaler.kube.operations import KubeClient, ScaleTargetRef
from autoscaler.model.history import parse_history
from autoscaler.model.metrics import MetricFetchError, MetricValueList
from metricscale.kube.discovery import ResourceMapping
from metricscale.kube.errors import KindNotFound, TooManyRequests
from metricscale.kube.http import open_kube_http
from testbed.controlplane import ControlPlane
from testbed.fakes.kube_objects import Container, pod
from tests.autoscaler.controller_support import (
    DEPLOYMENTS,
    MemoryCaches,
    MemoryKube,
    MemoryMetrics,
    conflict,
)

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
NS = "shop"
KEY = AutoscalerKey("Autoscaler", NS, "web")
HPA_KEY = AutoscalerKey("HorizontalPodAutoscaler", NS, "web")
QPS = {"type": "Pods", "pods": {"metric": {"name": "qps"},
                                "target": {"type": "AverageValue", "averageValue": "10"}}}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def autoscaler(name: str = "web", *, target: str = "web", kind: str = "Autoscaler",
               generation: int = 1, annotations: dict[str, str] | None = None,
               status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    api_version = "autoscaling/v2" if kind == "HorizontalPodAutoscaler" \
        else "metricscale.dev/v1alpha1"
    body: dict[str, Any] = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                               "name": target},
                            "minReplicas": 1, "maxReplicas": 10, "metrics": [QPS]}
    body.update(spec)
    obj: dict[str, Any] = {"apiVersion": api_version, "kind": kind,
                           "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                                        "generation": generation,
                                        "annotations": annotations or {}},
                           "spec": body}
    if status is not None:
        obj["status"] = status
    return obj


class World:
    """A namespace with one Deployment `web` of `replicas` pods and an autoscaler on it."""

    def __init__(self, *, replicas: int = 2, qps: str = "10", settings: Settings | None = None,
                 dry_run: bool = False, **autoscaler_args: Any) -> None:
        self.caches = MemoryCaches()
        self.kube = MemoryKube(self.caches)
        self.metrics = MemoryMetrics()
        self.registry = CollectorRegistry()
        self.settings = settings or Settings()
        self.stats = ControllerMetrics(self.registry)
        self.dry_run = dry_run
        self.caches.put(autoscaler(**autoscaler_args))
        self.kube.set_scale(NS, "web", replicas=replicas, selector="app=web")
        self.set_pods(replicas, qps)
        self.reconciler = self.new_reconciler()

    def new_reconciler(self, **kwargs: Any) -> Reconciler:
        return Reconciler(kube=self.kube, metrics=self.metrics, watching=self.caches,
                          settings=self.settings, dry_run=self.dry_run,
                          controller_metrics=self.stats, **kwargs)

    def set_pods(self, count: int, qps: str) -> None:
        for index in range(count):
            name = f"web-{index}"
            self.caches.add_pod(project_pod(pod(name, namespace=NS, now=T0 - timedelta(hours=1),
                                                labels={"app": "web"},
                                                containers=(Container(cpu_request="500m"),))))
            self.metrics.pod_values.setdefault("qps", {})[name] = qps

    def load(self, qps: str) -> None:
        for name in self.metrics.pod_values["qps"]:
            self.metrics.pod_values["qps"][name] = qps

    def status(self, key: AutoscalerKey = KEY) -> dict[str, Any]:
        entry = self.caches.get(key)
        assert entry is not None
        return dict(entry.status)

    def conditions(self, key: AutoscalerKey = KEY) -> dict[str, tuple[str, str]]:
        return {c["type"]: (c["status"], c["reason"])
                for c in self.status(key).get("conditions", [])}

    def outcome(self, outcome: str) -> float:
        return self.registry.get_sample_value("metricscale_autoscaler_decisions_total",
                                              {"outcome": outcome}) or 0


# ------------------------------------------------------------------------------ steady state


async def test_a_steady_reconcile_asks_for_the_scale_and_each_metric_and_writes_nothing() -> None:
    world = World(replicas=2, qps="10")
    await world.reconciler.reconcile_once(KEY, at(0))
    assert world.kube.count("write_status") == 1  # the first status, with the history
    world.kube.calls.clear()
    world.metrics.calls.clear()
    for step in range(1, 6):
        result = await world.reconciler.reconcile_once(KEY, at(15 * step))
        assert (result.outcome, result.failed) == ("no_change", False)
    assert world.kube.calls == ["get_scale"] * 5
    assert world.metrics.calls == ["pods/qps"] * 5
    assert world.kube.events == []


async def test_the_first_status_carries_columns_generation_and_history() -> None:
    world = World(replicas=2, qps="10", generation=4)
    await world.reconciler.reconcile_once(KEY, at(0))
    status = world.status()
    assert status["reference"] == "Deployment/web"
    assert status["targets"] == "10/10"
    assert status["observedGeneration"] == 4
    assert (status["currentReplicas"], status["desiredReplicas"]) == (2, 2)
    assert parse_history(status["history"]).recommendations is not None
    assert world.conditions() == {"AbleToScale": ("True", "ReadyForNewScale"),
                                  "ScalingActive": ("True", "ValidMetricFound"),
                                  "ScalingLimited": ("False", "DesiredWithinRange")}


# ---------------------------------------------------------------------------------- scaling


async def test_load_above_target_scales_up_writes_status_and_records_the_event() -> None:
    world = World(replicas=2, qps="30")
    result = await world.reconciler.reconcile_once(KEY, at(0))
    assert result.outcome == "scale_up"
    assert world.kube.scale_writes == [(NS, "web", 4)]  # legacy limit: max(2*2, 4)
    (event,) = world.kube.events
    assert (event.type, event.reason, event.note) == (
        "Normal", "SuccessfulRescale", "New size: 4; reason: pods metric qps above target")
    status = world.status()
    assert (status["currentReplicas"], status["desiredReplicas"]) == (2, 4)
    assert status["lastScaleTime"] == "2026-11-21T10:00:00Z"
    assert world.conditions()["AbleToScale"] == ("True", "SucceededRescale")
    assert world.conditions()["ScalingLimited"] == ("True", "ScaleUpLimit")
    assert world.outcome("scale_up") == 1


@pytest.mark.parametrize("how", ["flag", "annotation"])
async def test_dry_run_says_what_would_happen_and_scales_nothing(how: str) -> None:
    world = World(replicas=2, qps="30", dry_run=how == "flag",
                  annotations={DRY_RUN_ANNOTATION: "true"} if how == "annotation" else None)
    result = await world.reconciler.reconcile_once(KEY, at(0))
    assert result.outcome == "dry_run_scale_up"
    assert world.kube.count("update_scale") == 0
    assert world.kube.replicas(NS, "web") == 2
    (event,) = world.kube.events
    assert (event.type, event.reason) == ("Normal", "DryRunRescale")
    assert event.note == ("New size: 4; reason: pods metric qps above target; dry run: the "
                          "target was not scaled")
    status = world.status()
    assert (status["currentReplicas"], status["desiredReplicas"]) == (2, 4)
    assert "lastScaleTime" not in status
    assert world.conditions()["AbleToScale"] == ("True", "DryRun")
    ((_, _, written),) = world.kube.status_writes
    able = next(c for c in written["conditions"] if c["type"] == "AbleToScale")
    assert able["message"] == ("dry run: the HPA controller would have updated the target "
                               "scale to 4")
    # The next sync sees the same size and says the same thing: no scale event was recorded.
    await world.reconciler.reconcile_once(KEY, at(15))
    assert [e.reason for e in world.kube.events] == ["DryRunRescale", "DryRunRescale"]
    assert world.kube.count("write_status") == 1


async def test_a_scale_write_that_keeps_conflicting_is_failed_rescale_and_backs_off() -> None:
    world = World(replicas=2, qps="30")
    world.kube.fail["update_scale"] = [conflict()]
    result = await world.reconciler.reconcile_once(KEY, at(0))
    assert (result.outcome, result.failed) == ("failed_rescale", True)
    (event,) = world.kube.events
    assert event.reason == "FailedRescale"
    assert event.note.startswith("New size: 4; reason: pods metric qps above target; error: "
                                 "Operation cannot be fulfilled")
    assert world.conditions()["AbleToScale"] == ("False", "FailedUpdateScale")
    assert world.status()["desiredReplicas"] == 0  # upstream keeps the old value


# --------------------------------------------------------------------------- what goes wrong


async def test_a_missing_target_is_failed_get_scale_and_asks_no_metrics() -> None:
    world = World(target="gone")
    result = await world.reconciler.reconcile_once(KEY, at(0))
    assert (result.outcome, result.failed) == ("failed_get_scale", False)
    assert world.metrics.calls == []
    (event,) = world.kube.events
    assert (event.type, event.reason, event.note) == (
        "Warning", "FailedGetScale", 'deployments.apps "gone" not found')
    assert world.conditions() == {"AbleToScale": ("False", "FailedGetScale")}


async def test_a_kind_without_scale_is_failed_get_scale() -> None:
    world = World()
    world.caches.put(autoscaler(scaleTargetRef={"apiVersion": "apps/v1",
                                                "kind": "DaemonSet", "name": "x"}))
    await world.reconciler.reconcile_once(KEY, at(0))
    assert world.kube.events[0].note == 'no matches for kind "DaemonSet" in group "apps"'
    assert world.conditions()["AbleToScale"] == ("False", "FailedGetScale")


async def test_too_many_requests_on_the_scale_backs_off_with_retry_after() -> None:
    world = World()
    world.kube.fail["get_scale"] = [TooManyRequests("slow down", retry_after=7.0)]
    result = await world.reconciler.reconcile_once(KEY, at(0))
    assert (result.failed, result.retry_after) == (True, 7.0)
    assert world.conditions()["AbleToScale"] == ("False", "FailedGetScale")


async def test_failing_metrics_block_a_scale_down_and_the_condition_says_why() -> None:
    world = World(replicas=4, qps="1")
    world.metrics.errors["qps"] = MetricsError(
        "the server is currently unable to handle the request (get pods.custom.metrics.k8s.io *)",
        api="custom")
    result = await world.reconciler.reconcile_once(KEY, at(0))
    assert (result.outcome, result.failed) == ("failed_metrics", False)
    assert world.kube.count("update_scale") == 0
    assert world.conditions()["ScalingActive"] == ("False", "FailedGetPodsMetric")
    condition = next(c for c in world.status()["conditions"] if c["type"] == "ScalingActive")
    assert condition["message"] == (
        "the HPA was unable to compute the replica count: unable to get metric qps: unable to "
        "fetch metrics from custom metrics API: the server is currently unable to handle the "
        "request (get pods.custom.metrics.k8s.io *)")
    assert [e.reason for e in world.kube.events] == ["FailedGetPodsMetric",
                                                     "FailedComputeMetricsReplicas"]
    assert world.registry.get_sample_value("metricscale_autoscaler_errors_total",
                                           {"reason": "FailedGetPodsMetric"}) == 1


def test_an_empty_metrics_answer_becomes_the_empty_list_the_decision_reports() -> None:
    # The typed inputs the decision reads, without a detour through wire JSON.
    empty = metric_input_from_error("Pods", MetricsError.no_metrics("custom"))
    assert empty == MetricValueList(items=())
    failed = metric_input_from_error("External", MetricsError("boom", api="external"))
    assert failed == MetricFetchError("boom")
    assert str(MetricsError("boom", api="external")) == (
        "unable to fetch metrics from external metrics API: boom")


async def test_a_failed_status_write_is_reported_and_retried_on_the_next_sync() -> None:
    world = World()
    world.kube.fail["write_status"] = [TooManyRequests("slow down", retry_after=1.0)]
    result = await world.reconciler.reconcile_once(KEY, at(0))
    assert result.failed
    assert [e.reason for e in world.kube.events] == ["FailedUpdateStatus"]
    await world.reconciler.reconcile_once(KEY, at(15))
    assert world.kube.count("write_status") == 2
    assert "history" in world.status()


async def test_an_invalid_autoscaler_is_reported_once_and_others_carry_on() -> None:
    world = World()
    bad = autoscaler("bad")
    bad["spec"]["maxReplicas"] = "lots"
    world.caches.put(bad)
    bad_key = AutoscalerKey("Autoscaler", NS, "bad")
    for step in range(3):
        result = await world.reconciler.reconcile_once(bad_key, at(step))
        assert result.outcome == "invalid"
    (event,) = world.kube.events
    assert event.reason == "InvalidSpec" and "spec.maxReplicas" in event.note
    assert (await world.reconciler.reconcile_once(KEY, at(5))).outcome == "no_change"


async def test_a_lost_lease_stops_every_write() -> None:
    world = World(replicas=2, qps="30")

    class Lost:
        def ensure(self) -> None:
            raise NotLeader("no")

    reconciler = world.new_reconciler(leader=Lost())
    with pytest.raises(NotLeader):
        await reconciler.reconcile_once(KEY, at(0))
    assert world.kube.count("update_scale") == world.kube.count("write_status") == 0
    assert world.kube.events == []


async def test_pods_shared_with_another_autoscaler_are_ambiguous() -> None:
    world = World()
    world.caches.put(autoscaler("web-2", target="web2"))
    world.kube.set_scale(NS, "web2", replicas=2, selector="app=web")
    other = AutoscalerKey("Autoscaler", NS, "web-2")
    await world.reconciler.reconcile_once(KEY, at(0))
    await world.reconciler.reconcile_once(other, at(0))
    assert world.conditions(other)["ScalingActive"] == ("False", "AmbiguousSelector")
    await world.reconciler.reconcile_once(KEY, at(15))
    assert world.conditions()["ScalingActive"] == ("False", "AmbiguousSelector")


async def test_forgetting_an_autoscaler_drops_its_memory_and_selector() -> None:
    world = World()
    await world.reconciler.reconcile_once(KEY, at(0))
    assert world.reconciler.history_of(KEY) is not None
    world.reconciler.forget(KEY)
    assert world.reconciler.history_of(KEY) is None
    assert world.caches.registry.selector_of(KEY) is None


# ------------------------------------------------------------------- history that survives


BEHAVIOR = {"scaleDown": {"stabilizationWindowSeconds": 0,
                          "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}


async def test_a_restarted_controller_keeps_the_scale_down_rate_limit() -> None:
    """Pods 1 per 60 s: after one step down, a new controller process must wait the rest of
    the period, as the old one would have; without the persisted events it would not."""
    world = World(replicas=5, qps="1", behavior=BEHAVIOR)
    await world.reconciler.reconcile_once(KEY, at(0))
    assert world.kube.replicas(NS, "web") == 4
    restarted = world.new_reconciler()
    await restarted.reconcile_once(KEY, at(30))
    assert world.kube.replicas(NS, "web") == 4
    assert world.conditions()["ScalingLimited"] == ("True", "ScaleDownLimit")
    await restarted.reconcile_once(KEY, at(61))
    assert world.kube.replicas(NS, "web") == 3

    amnesiac = World(replicas=4, qps="1", behavior=BEHAVIOR)
    await amnesiac.reconciler.reconcile_once(KEY, at(30))
    assert amnesiac.kube.replicas(NS, "web") == 3  # what losing the history would have done


async def test_a_restarted_controller_keeps_the_scale_down_window() -> None:
    world = World(replicas=2, qps="30", behavior={
        "scaleDown": {"stabilizationWindowSeconds": 120}})
    await world.reconciler.reconcile_once(KEY, at(0))  # 2 pods at 3x the target: 6
    assert world.kube.replicas(NS, "web") == 6
    world.load("1")  # the load falls; the window holds the highest recent recommendation
    restarted = world.new_reconciler()
    await restarted.reconcile_once(KEY, at(60))
    assert world.kube.replicas(NS, "web") == 6
    assert world.conditions()["AbleToScale"] == ("True", "ScaleDownStabilized")
    await restarted.reconcile_once(KEY, at(200))
    assert world.kube.replicas(NS, "web") == 1


async def test_native_hpa_status_has_no_extras_and_history_goes_to_an_annotation() -> None:
    world = World(replicas=2, qps="30", kind="HorizontalPodAutoscaler")
    await world.reconciler.reconcile_once(HPA_KEY, at(0))
    ((_, _, status),) = world.kube.status_writes
    assert set(status) <= {"currentReplicas", "desiredReplicas", "lastScaleTime",
                           "currentMetrics", "conditions"}
    ((_, _, annotations),) = world.kube.annotation_writes
    assert parse_history(__import__("json").loads(annotations[HISTORY_ANNOTATION]))
    restarted = world.new_reconciler()
    await restarted.reconcile_once(HPA_KEY, at(15))
    history = restarted.history_of(HPA_KEY)
    assert history is not None and history.recommendations is not None
    assert history.recommendations[0].timestamp == at(0)


async def test_native_hpa_pause_annotations_hold_the_size_and_resume() -> None:
    """Pause works as annotations on a native HPA too (under --enable-native-hpa): decided and
    reported, never written; paused-replicas sets its size; removing the annotation resumes."""
    world = World(replicas=2, qps="30", kind="HorizontalPodAutoscaler",
                  annotations={"metricscale.dev/paused": "true"})
    await world.reconciler.reconcile_once(HPA_KEY, at(0))
    assert world.kube.replicas(NS, "web") == 2
    assert world.kube.count("update_scale") == 0
    assert world.conditions(HPA_KEY)["Paused"] == ("True", "Paused")
    assert world.status(HPA_KEY)["desiredReplicas"] == 4  # what it would have set
    world.caches.put(autoscaler(kind="HorizontalPodAutoscaler",
                                annotations={"metricscale.dev/paused-replicas": "4"}))
    await world.reconciler.reconcile_once(HPA_KEY, at(15))
    assert world.kube.replicas(NS, "web") == 4
    assert world.conditions(HPA_KEY)["Paused"] == ("True", "PausedAtReplicas")
    world.caches.put(autoscaler(kind="HorizontalPodAutoscaler"))
    await world.reconciler.reconcile_once(HPA_KEY, at(30))
    assert "Paused" not in world.conditions(HPA_KEY)
    assert world.kube.replicas(NS, "web") > 4  # scaling resumed


async def test_feature_series_exist_only_while_a_feature_is_in_use() -> None:
    world = World(replicas=2, qps="10", annotations={"metricscale.dev/paused": "true"},
                  behavior={"syncPeriodSeconds": 30})

    def sample(name: str, **labels: str) -> float | None:
        value: float | None = world.registry.get_sample_value(
            name, {"namespace": NS, "autoscaler": "web", **labels})
        return value

    await world.reconciler.reconcile_once(KEY, at(0))
    assert sample("metricscale_autoscaler_feature_condition", condition="Paused") == 1
    assert sample("metricscale_autoscaler_sync_period_seconds") == 30
    assert sample("metricscale_autoscaler_feature_condition", condition="Fallback") is None
    world.caches.put(autoscaler())
    await world.reconciler.reconcile_once(KEY, at(15))
    assert sample("metricscale_autoscaler_feature_condition", condition="Paused") is None
    assert sample("metricscale_autoscaler_sync_period_seconds") is None
    world.caches.put(autoscaler(annotations={"metricscale.dev/paused": "true"}))
    await world.reconciler.reconcile_once(KEY, at(30))
    world.reconciler.forget(KEY)
    assert sample("metricscale_autoscaler_feature_condition", condition="Paused") is None


async def test_a_failing_metric_with_a_fallback_counts_its_failures_on_metrics() -> None:
    fallback_qps = {**QPS, "pods": {**QPS["pods"], "fallback": {"replicas": 5,
                                                                 "failureThreshold": 2}}}
    world = World(replicas=2, qps="10", metrics=[fallback_qps])
    world.metrics.errors["qps"] = MetricsError.no_metrics("custom")
    await world.reconciler.reconcile_once(KEY, at(0))
    labels = {"namespace": NS, "autoscaler": "web", "metric": "0"}
    assert world.registry.get_sample_value("metricscale_autoscaler_metric_read_failures",
                                           labels) == 1
    await world.reconciler.reconcile_once(KEY, at(15))
    assert world.conditions()["Fallback"] == ("True", "FallbackActive")
    assert world.registry.get_sample_value("metricscale_autoscaler_feature_condition", {
        "namespace": NS, "autoscaler": "web", "condition": "Fallback"}) == 1
    del world.metrics.errors["qps"]
    await world.reconciler.reconcile_once(KEY, at(30))
    assert world.registry.get_sample_value("metricscale_autoscaler_metric_read_failures",
                                           labels) is None


@pytest.mark.parametrize("kind", ["Deployment", "Rollout"])
async def test_the_kube_double_resolves_scale_targets_as_the_real_client_does(
        kind: str, control_plane: ControlPlane) -> None:
    """Every test above stands on MemoryKube's resolve_scale_target: the real client, against
    the session's real kube-apiserver's discovery, answers the same (the mapping, or the
    error's text: the group apps has no kind Rollout)."""
    async with open_kube_http(control_plane.api_client_configuration(),
                              user_agent="metricscale-tests") as http:
        real = KubeClient(http, registry=CollectorRegistry(), reporting_instance="a")
        double = MemoryKube(MemoryCaches())
        ref = ScaleTargetRef(api_version="apps/v1", kind=kind, name="web")

        async def answer(kube: KubeClient | MemoryKube) -> ResourceMapping | str:
            try:
                return await kube.resolve_scale_target(ref)
            except KindNotFound as error:
                return f"KindNotFound: {error}"

        expected: ResourceMapping | str = (
            DEPLOYMENTS if kind == "Deployment"
            else f'KindNotFound: no matches for kind "{kind}" in group "apps"')
        assert await answer(real) == expected
        assert await answer(double) == expected
