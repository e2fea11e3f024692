"""Metric fallback, end to end (the fake API server, the real adapter behind its aggregator, a
real Prometheus): when Prometheus stops, or the metrics API itself goes away (its APIService
deleted), a metric with `fallback` proposes its fallback size after failureThreshold failed
reads in a row; the Fallback condition, a FallbackActive event and status.history's
metricFailures say so; once the metrics read again the fallback ends (FallbackEnded)."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from testbed.fakes.exporter import Exporter
from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.kube_http import KubeHTTPClient
from testbed.fakes.prometheus import PrometheusServer
from tests.e2e.test_adapter_auth_support import SERVICE_NAME, SERVICE_NAMESPACE
from tests.e2e.test_autoscaler_support import (
    GROUP,
    NS,
    PLURAL,
    VERSION,
    Workload,
    autoscaler,
    condition,
    controller,
    events_of,
    exporter_publisher,
    install_crd,
    pods_metric,
    prometheus_adapter,
    replicas_of,
    status_of,
    until,
)

pytestmark = pytest.mark.prometheus

PODS_SERIES = "msfallback_http_requests"
QUEUE_SERIES = "msfallback_queue_messages"
EXTERNAL_APISERVICE = "v1beta1.external.metrics.k8s.io"

# No scale-down window: once the metrics read again their size is written at once.
BEHAVIOR: dict[str, Any] = {
    "scaleUp": {"stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 10, "periodSeconds": 1}]},
    "scaleDown": {"stabilizationWindowSeconds": 0,
                  "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}]},
}


def rules(job: str) -> str:
    return f"""\
rules:
- seriesQuery: '{{__name__="{PODS_SERIES}",job="{job}",namespace!="",pod!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  name: {{matches: "^msfallback_(.*)$", as: "${{1}}"}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>,job="{job}"}}) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: '{{__name__="{QUEUE_SERIES}",job="{job}",namespace!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
  name: {{matches: "^msfallback_(.*)$", as: "${{1}}"}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>,job="{job}"}}) by (queue)'
"""


def with_fallback(metric: dict[str, Any], fallback: dict[str, Any]) -> dict[str, Any]:
    source = metric[metric["type"].lower()]
    return {**metric, metric["type"].lower(): {**source, "fallback": fallback}}


def queue_metric(average: str) -> dict[str, Any]:
    return {"type": "External", "external": {
        "metric": {"name": "queue_messages"},
        "target": {"type": "AverageValue", "averageValue": average}}}


def fallback_condition(fake: FakeKubeAPI) -> tuple[str, str, str] | None:
    return condition(fake, "web", "Fallback")


def reasons(fake: FakeKubeAPI) -> list[str]:
    return [e["reason"] for e in events_of(fake, "web")]


def event_note(fake: FakeKubeAPI, reason: str) -> tuple[str, str]:
    (found,) = [e for e in events_of(fake, "web") if e["reason"] == reason]
    return found["type"], found["note"]


def metric_failures(fake: FakeKubeAPI) -> list[tuple[int, int]]:
    history = status_of(fake, "web").get("history") or {}
    return [(f["metric"], f["failures"]) for f in history.get("metricFailures") or []]


def rescales(fake: FakeKubeAPI) -> list[int]:
    return [int(e["note"].split(";")[0].removeprefix("New size: "))
            for e in events_of(fake, "web") if e["reason"] == "SuccessfulRescale"]


async def test_prometheus_stops_and_the_pods_metric_falls_back_until_it_is_back(
        fake_kube: FakeKubeAPI, tmp_path: Path, prometheus_factory: Any) -> None:
    own: PrometheusServer = prometheus_factory()
    with Exporter() as exporter:
        own.add_target(exporter)
        install_crd(fake_kube)
        async with Workload(fake_kube, "web", replicas=4, total=Decimal(40),
                            publish=exporter_publisher(exporter, PODS_SERIES)):
            await own.wait_for_async(f'{PODS_SERIES}{{job="{exporter.job}"}}',
                                     lambda samples: len(samples) >= 4, timeout=30)
            async with prometheus_adapter(fake_kube, tmp_path, prometheus_url=own.url,
                                          rules=rules(exporter.job)):
                metric = with_fallback(pods_metric("http_requests", "10"),
                                       {"replicas": 6, "failureThreshold": 3})
                fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                    "web", target="web", metrics=[metric], min_replicas=1, max_replicas=8,
                    behavior=BEHAVIOR))
                async with controller(fake_kube):
                    await until(lambda: (condition(fake_kube, "web", "ScalingActive") or
                                         ("",))[0] == "True", within=20, what="a decision")
                    assert replicas_of(fake_kube, "web") == 4
                    assert fallback_condition(fake_kube) is None
                    assert metric_failures(fake_kube) == []

                    await asyncio.to_thread(own.stop)
                    await until(lambda: replicas_of(fake_kube, "web") == 6, within=20,
                                what="the fallback size")
                    await until(lambda: "FallbackActive" in reasons(fake_kube), within=5,
                                what="a FallbackActive event")
                    # A reconcile posts its events before it writes the status (as upstream's
                    # does): the condition may land a moment after the event.
                    await until(lambda: fallback_condition(fake_kube) is not None, within=5,
                                what="the Fallback condition")
                    status, reason, message = fallback_condition(fake_kube) or ("", "", "")
                    assert (status, reason) == ("True", "FallbackActive")
                    assert message.startswith("metric 0 failed ") and message.endswith(
                        " reads in a row and proposes 6 replicas (fallback static)")
                    # Entered at the third failed read, not before.
                    assert event_note(fake_kube, "FallbackActive") == (
                        "Warning", "metric 0 failed 3 reads in a row and proposes 6 replicas "
                                   "(fallback static)")
                    [(index, failures)] = metric_failures(fake_kube)
                    assert index == 0 and failures >= 3
                    active = condition(fake_kube, "web", "ScalingActive") or ("", "", "")
                    assert active[:2] == ("True", "ValidMetricFound")
                    assert active[2].endswith("(fallback)")

                    # Prometheus back: the metric reads again, its own size (4) applies.
                    await asyncio.to_thread(own.start)
                    await until(lambda: "FallbackEnded" in reasons(fake_kube), within=30,
                                what="a FallbackEnded event")
                    await until(lambda: fallback_condition(fake_kube) is None
                                and metric_failures(fake_kube) == [], within=5,
                                what="the Fallback condition and the failures gone")
                    await until(lambda: replicas_of(fake_kube, "web") == 4, within=20,
                                what="the metric's size again")
                    # The scale is written before the events: leaving at once could cut the
                    # SuccessfulRescale event off.
                    await until(lambda: rescales(fake_kube)[-1:] == [4], within=5,
                                what="the rescale event to 4")
    assert rescales(fake_kube) == [6, 4]


async def test_the_external_metrics_apiservice_deleted_falls_back_until_registered_again(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient, tmp_path: Path,
        prometheus: PrometheusServer, exporter: Exporter) -> None:
    install_crd(fake_kube)
    # 30 messages at 10 a pod: 3 pods.
    exporter.set(QUEUE_SERIES, {"namespace": NS, "queue": "orders"}, Decimal(30), type="gauge")
    async with Workload(fake_kube, "web", replicas=3, total=Decimal(0),
                        publish=lambda values: None):
        await prometheus.wait_for_async(f'{QUEUE_SERIES}{{job="{exporter.job}"}}',
                                        lambda samples: len(samples) == 1, timeout=30)
        async with prometheus_adapter(fake_kube, tmp_path, prometheus_url=prometheus.url,
                                      rules=rules(exporter.job)) as adapter:
            metric = with_fallback(queue_metric("10"), {"replicas": 5, "failureThreshold": 2})
            fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                "web", target="web", metrics=[metric], min_replicas=1, max_replicas=8,
                behavior=BEHAVIOR))
            async with controller(fake_kube):
                await until(lambda: (condition(fake_kube, "web", "ScalingActive") or
                                     ("",))[0] == "True", within=20, what="a decision")
                assert replicas_of(fake_kube, "web") == 3

                # `kubectl delete apiservice v1beta1.external.metrics.k8s.io`
                reply = await kube_http.delete(
                    f"/apis/apiregistration.k8s.io/v1/apiservices/{EXTERNAL_APISERVICE}")
                assert reply.status == 200, reply.text
                await until(lambda: replicas_of(fake_kube, "web") == 5, within=20,
                            what="the fallback size")
                await until(lambda: "FallbackActive" in reasons(fake_kube), within=5,
                            what="a FallbackActive event")
                await until(lambda: fallback_condition(fake_kube) is not None, within=5,
                            what="the Fallback condition (written after the events)")
                assert (fallback_condition(fake_kube) or ("", ""))[:2] == ("True",
                                                                           "FallbackActive")
                assert event_note(fake_kube, "FallbackActive") == (
                    "Warning", "metric 0 failed 2 reads in a row and proposes 5 replicas "
                               "(fallback static)")
                [(index, failures)] = metric_failures(fake_kube)
                assert index == 0 and failures >= 2
                assert condition(fake_kube, "web", "ScalingActive") == (
                    "True", "ValidMetricFound", "the HPA was able to successfully calculate a "
                    "replica count from External metric queue_messages (fallback)")

                # Registered again: the metric reads, its 3 replicas apply.
                fake_kube.create_apiservice(group="external.metrics.k8s.io", version="v1beta1",
                                            service_namespace=SERVICE_NAMESPACE,
                                            service_name=SERVICE_NAME, ca_bundle=adapter.ca_pem)
                await fake_kube.wait_for_apiservice(EXTERNAL_APISERVICE, within=15)
                await until(lambda: "FallbackEnded" in reasons(fake_kube), within=20,
                            what="a FallbackEnded event")
                await until(lambda: fallback_condition(fake_kube) is None
                            and metric_failures(fake_kube) == [], within=5,
                            what="the Fallback condition and the failures gone")
                await until(lambda: replicas_of(fake_kube, "web") == 3, within=20,
                            what="the metric's size again")
                # The scale is written before the events: leaving at once could cut the
                # SuccessfulRescale event off.
                await until(lambda: rescales(fake_kube)[-1:] == [3], within=5,
                            what="the rescale event to 3")
    assert rescales(fake_kube) == [5, 3]
