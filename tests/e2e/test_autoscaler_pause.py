"""Pause by annotation, end to end (the fake API server, the real adapter behind its aggregator,
a real Prometheus): `metricscale.dev/paused` decides and reports but never writes the scale,
removing it resumes (with an event); `paused-replicas` sets its size once and holds it;
`paused-scale-in` holds a scale-down while a scale-up still goes through. The annotations are
changed by merge patches through the API, as `kubectl annotate` sends them."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from metricscale.core.quantity import parse_quantity
from testbed.fakes.exporter import Exporter
from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.kube_http import KubeHTTPClient
from testbed.fakes.prometheus import PrometheusServer
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
    holds,
    install_crd,
    pods_metric,
    pods_rule,
    prometheus_adapter,
    replicas_of,
    scale_writes,
    status_of,
    until,
)

pytestmark = pytest.mark.prometheus

SERIES = "mspause_http_requests"
METRIC = "http_requests"
PAUSED = "metricscale.dev/paused"
PAUSED_REPLICAS = "metricscale.dev/paused-replicas"
PAUSED_SCALE_IN = "metricscale.dev/paused-scale-in"

# Whole steps at once, no scale-down window: what the metrics want is what would be written.
BEHAVIOR: dict[str, Any] = {
    "scaleUp": {"stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 10, "periodSeconds": 1}]},
    "scaleDown": {"stabilizationWindowSeconds": 0,
                  "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}]},
}


def rules(job: str) -> str:
    return "rules:\n" + pods_rule(series_query=f'__name__="{SERIES}"',
                                  prefix="mspause_", job=job)


async def annotate(http: KubeHTTPClient, name: str, annotations: dict[str, str | None]) -> None:
    """`kubectl annotate autoscaler name k=v` (a value of None: `k-`): a JSON merge patch."""
    reply = await http.patch(f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}/{name}",
                             {"metadata": {"annotations": annotations}},
                             content_type="application/merge-patch+json")
    assert reply.status == 200, reply.text


def paused(fake: FakeKubeAPI) -> tuple[str, str, str] | None:
    return condition(fake, "web", "Paused")


def reasons(fake: FakeKubeAPI) -> list[str]:
    return [e["reason"] for e in events_of(fake, "web")]


def rescales(fake: FakeKubeAPI) -> list[int]:
    return [int(e["note"].split(";")[0].removeprefix("New size: "))
            for e in events_of(fake, "web") if e["reason"] == "SuccessfulRescale"]


def average(fake: FakeKubeAPI) -> str | None:
    """The Pods metric's current average in the status."""
    for item in status_of(fake, "web").get("currentMetrics") or []:
        if item.get("type") == "Pods":
            return str(item["pods"]["current"].get("averageValue"))
    return None


async def test_pause_annotations_hold_the_scale_and_removing_them_resumes(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient, tmp_path: Path,
        prometheus: PrometheusServer, exporter: Exporter) -> None:
    install_crd(fake_kube)
    async with Workload(fake_kube, "web", replicas=2, total=Decimal(20),
                        publish=exporter_publisher(exporter, SERIES)) as web:
        await prometheus.wait_for_async(f'{SERIES}{{job="{exporter.job}"}}',
                                        lambda samples: len(samples) >= 2, timeout=30)
        async with prometheus_adapter(fake_kube, tmp_path, prometheus_url=prometheus.url,
                                      rules=rules(exporter.job)):
            fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                "web", target="web", metrics=[pods_metric(METRIC, "10")], min_replicas=2,
                max_replicas=8, behavior=BEHAVIOR))
            async with controller(fake_kube):
                await until(lambda: (condition(fake_kube, "web", "ScalingActive") or ("",))[0]
                            == "True", within=20, what="a first decision from real metrics")
                assert replicas_of(fake_kube, "web") == 2 and paused(fake_kube) is None

                # Paused: the load asks for 6 pods; the status says so, nothing is written.
                await annotate(kube_http, "web", {PAUSED: "true"})
                await until(lambda: paused(fake_kube) is not None, within=10,
                            what="the Paused condition")
                assert paused(fake_kube) == ("True", "Paused",
                                             f"paused by annotation {PAUSED}")
                writes = len(scale_writes(fake_kube, "web"))
                web.set_load(60)
                await until(lambda: status_of(fake_kube, "web").get("desiredReplicas") == 6
                            and average(fake_kube) == "30", within=20,
                            what="the paused decision in the status")
                await holds(lambda: len(scale_writes(fake_kube, "web")) == writes
                            and replicas_of(fake_kube, "web") == 2, fake=fake_kube,
                            target="web", for_seconds=2, what="no scale write while paused")
                assert (condition(fake_kube, "web", "ScalingActive") or ("",))[0] == "True"
                assert rescales(fake_kube) == []

                # Resumed: the held decision is applied, and an event says why.
                await annotate(kube_http, "web", {PAUSED: None})
                await until(lambda: replicas_of(fake_kube, "web") == 6, within=10,
                            what="the scale-up once resumed")
                # The scale is written before the status and the events.
                await until(lambda: paused(fake_kube) is None and "Resumed" in reasons(fake_kube),
                            within=5, what="the Paused condition gone, a Resumed event")

                # Paused at 3: set once, then held whatever the load asks.
                await annotate(kube_http, "web", {PAUSED_REPLICAS: "3"})
                await until(lambda: replicas_of(fake_kube, "web") == 3
                            and (paused(fake_kube) or ("", ""))[1] == "PausedAtReplicas",
                            within=10, what="the paused-replicas size")
                assert paused(fake_kube) == (
                    "True", "PausedAtReplicas",
                    f"paused at 3 replicas by annotation {PAUSED_REPLICAS}")
                writes = len(scale_writes(fake_kube, "web"))
                web.set_load(20)  # 2 pods' worth: held at 3 as well
                await until(lambda: parse_quantity(average(fake_kube) or "20") < 10, within=20,
                            what="the controller seeing the lower load (the status's average)")
                await holds(lambda: len(scale_writes(fake_kube, "web")) == writes
                            and replicas_of(fake_kube, "web") == 3, fake=fake_kube,
                            target="web", for_seconds=2,
                            what="the paused size is written once and then held")

                # Scale-in paused: the scale-down to 2 is held, a scale-up goes through.
                await annotate(kube_http, "web", {PAUSED_REPLICAS: None, PAUSED_SCALE_IN: "true"})
                await until(lambda: (paused(fake_kube) or ("", ""))[1] == "ScaleInPaused",
                            within=10, what="the ScaleInPaused condition")
                await until(lambda: status_of(fake_kube, "web").get("desiredReplicas") == 2,
                            within=10, what="the held scale-down in the status")
                await holds(lambda: len(scale_writes(fake_kube, "web")) == writes
                            and replicas_of(fake_kube, "web") == 3, fake=fake_kube,
                            target="web", for_seconds=2,
                            what="no scale-down while scale-in is paused")
                web.set_load(80)
                await until(lambda: replicas_of(fake_kube, "web") == 8, within=20,
                            what="the scale-up while scale-in is paused")
                # The scale is written before the events and the status.
                await until(lambda: status_of(fake_kube, "web").get("desiredReplicas") == 8,
                            within=5, what="the status of the scale-up")
                assert (paused(fake_kube) or ("", ""))[1] == "ScaleInPaused"

    assert rescales(fake_kube) == [6, 3, 8]
    assert [r for r in reasons(fake_kube) if r in {"Paused", "Resumed", "PausedAtReplicas",
                                                   "ScaleInPaused"}] == [
        "Paused", "Resumed", "PausedAtReplicas", "ScaleInPaused"]
    pause_events = [e for e in events_of(fake_kube, "web") if e["reason"] in {
        "Paused", "Resumed", "PausedAtReplicas", "ScaleInPaused"}]
    assert {e["type"] for e in pause_events} == {"Normal"}
