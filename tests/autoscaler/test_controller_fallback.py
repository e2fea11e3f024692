"""Metric fallback through the controller, on the injected clock: a metric with `fallback` whose
reads fail (Prometheus stopped behind the adapter, or the metrics API itself gone) proposes its
fallback size at exactly the failureThreshold-th failed sync in a row; the Fallback condition, a
FallbackActive event and status.history's metricFailures say so; the first sync that reads the
metric again ends it (FallbackEnded) and its own size applies. (The metrics API's APIService
deleted on the real control plane: tests/cluster/test_autoscaler_features_on_cluster.py.)"""

from __future__ import annotations

from typing import Any

from autoscaler.kube.metrics_api import MetricsError
from tests.autoscaler.simulation import AT_ONCE, Cluster, autoscaler, external_metric, pods_metric

SYNC = 15

# What the API server answers for the adapter when its Prometheus is down, and when the
# external metrics API's APIService is gone.
PROMETHEUS_DOWN = MetricsError("the server is currently unable to handle the request (get "
                               "pods.custom.metrics.k8s.io *)", api="custom")
APISERVICE_GONE = MetricsError("the server could not find the requested resource (get "
                               "queue_messages.external.metrics.k8s.io)", api="external")


def with_fallback(metric: dict[str, Any], fallback: dict[str, Any]) -> dict[str, Any]:
    source = metric[metric["type"].lower()]
    return {**metric, metric["type"].lower(): {**source, "fallback": fallback}}


def fallback_condition(cluster: Cluster) -> tuple[str, str, str] | None:
    return cluster.condition("web", "Fallback")


def event_note(cluster: Cluster, reason: str) -> tuple[str, str]:
    (found,) = [e for e in cluster.events("web") if e.reason == reason]
    return found.type, found.note


def metric_failures(cluster: Cluster) -> list[tuple[int, int]]:
    history = cluster.status("web").get("history") or {}
    return [(f["metric"], f["failures"]) for f in history.get("metricFailures") or []]


async def test_prometheus_stops_and_the_pods_metric_falls_back_until_it_is_back() -> None:
    cluster = Cluster()
    cluster.deployment("web", replicas=4, load=40, metric="http_requests")
    metric = with_fallback(pods_metric("http_requests", "10"),
                           {"replicas": 6, "failureThreshold": 3})
    cluster.create(autoscaler("web", target="web", metrics=[metric], min_replicas=1,
                              max_replicas=8, behavior=AT_ONCE))
    cluster.replica()
    await cluster.run_for(0)
    assert (cluster.condition("web", "ScalingActive") or ("",))[0] == "True"
    assert cluster.replicas_of("web") == 4
    assert fallback_condition(cluster) is None and metric_failures(cluster) == []

    cluster.metrics.errors["http_requests"] = PROMETHEUS_DOWN
    await cluster.run_for(2 * SYNC)  # two failed reads: not yet
    assert cluster.replicas_of("web") == 4 and fallback_condition(cluster) is None
    assert metric_failures(cluster) == [(0, 2)]
    await cluster.run_for(SYNC)  # the third
    assert cluster.replicas_of("web") == 6
    # The condition's words hold for as long as the outage lasts; the event's are the moment's.
    assert fallback_condition(cluster) == (
        "True", "FallbackActive", "metric 0 failed 3 or more reads in a row and proposes 6 "
                                  "replicas (fallback static)")
    assert event_note(cluster, "FallbackActive") == (
        "Warning", "metric 0 failed 3 reads in a row and proposes 6 replicas (fallback static)")
    assert metric_failures(cluster) == [(0, 3)]
    active = cluster.condition("web", "ScalingActive") or ("", "", "")
    assert active[:2] == ("True", "ValidMetricFound") and active[2].endswith("(fallback)")
    # The outage goes on: the same size (failures past the threshold decide nothing new, and
    # are not written).
    await cluster.run_for(2 * SYNC)
    assert cluster.replicas_of("web") == 6 and metric_failures(cluster) == [(0, 3)]

    # Prometheus back: the next sync reads the metric, and its own size (4) applies.
    del cluster.metrics.errors["http_requests"]
    await cluster.run_for(SYNC)
    assert "FallbackEnded" in cluster.reasons("web")
    assert fallback_condition(cluster) is None and metric_failures(cluster) == []
    assert cluster.replicas_of("web") == 4
    assert cluster.sizes("web") == [6, 4]


async def test_the_external_metrics_api_gone_falls_back_until_it_serves_again() -> None:
    cluster = Cluster()
    cluster.deployment("web", replicas=3)
    cluster.metrics.external["queue_messages"] = "30"  # at 10 a pod: 3 pods
    metric = with_fallback(external_metric("queue_messages", "10"),
                           {"replicas": 5, "failureThreshold": 2})
    cluster.create(autoscaler("web", target="web", metrics=[metric], min_replicas=1,
                              max_replicas=8, behavior=AT_ONCE))
    cluster.replica()
    await cluster.run_for(0)
    assert (cluster.condition("web", "ScalingActive") or ("",))[0] == "True"
    assert cluster.replicas_of("web") == 3

    cluster.metrics.errors["queue_messages"] = APISERVICE_GONE
    await cluster.run_for(2 * SYNC)
    assert cluster.replicas_of("web") == 5
    assert (fallback_condition(cluster) or ("", ""))[:2] == ("True", "FallbackActive")
    assert event_note(cluster, "FallbackActive") == (
        "Warning", "metric 0 failed 2 reads in a row and proposes 5 replicas (fallback static)")
    assert metric_failures(cluster) == [(0, 2)]
    assert cluster.condition("web", "ScalingActive") == (
        "True", "ValidMetricFound", "the HPA was able to successfully calculate a replica "
        "count from External metric queue_messages (fallback)")

    # Served again: the metric reads, its 3 replicas apply.
    del cluster.metrics.errors["queue_messages"]
    await cluster.run_for(SYNC)
    assert "FallbackEnded" in cluster.reasons("web")
    assert fallback_condition(cluster) is None and metric_failures(cluster) == []
    assert cluster.replicas_of("web") == 3
    assert cluster.sizes("web") == [5, 3]
