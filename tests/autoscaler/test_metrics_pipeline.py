"""The controller on the metrics pipeline's real answers: the real adapter serving from a real
Prometheus behind the fake API server's aggregator (custom metrics from an exporter,
metrics.k8s.io from cAdvisor's series, the default rules with their rate windows cut to 5s).
A ContainerResource metric reads its own container only; when Prometheus stops, the adapter
answers 503, nothing scales down and the conditions carry the API's words, for a Pods and a
Resource metric alike.

(CPU utilization through metrics.k8s.io on the real control plane, beside upstream's HPA:
tests/cluster/test_upstream_hpa_twins.py; the decisions themselves, on the injected clock:
tests/autoscaler/test_controller_*.py.)"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter.rules.defaults import DEFAULT_CONFIG_YAML
from testbed.fakes.cadvisor import CAdvisor
from testbed.fakes.exporter import Exporter
from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.prometheus import PrometheusServer
from testbed.fakes.prometheus_fixtures import PrometheusFactory
from tests.autoscaler.fake_cluster import (
    GROUP,
    NS,
    PLURAL,
    VERSION,
    Workload,
    autoscaler,
    cadvisor_publisher,
    condition,
    controller,
    cpu_metric,
    events_of,
    exporter_publisher,
    holds,
    pods_metric,
    pods_rule,
    prometheus_adapter,
    replicas_of,
    until,
)

pytestmark = pytest.mark.prometheus

CONFIG = DEFAULT_CONFIG_YAML.replace("[5m]", "[5s]").replace("window: 5m", "window: 5s")
SERIES = "mspipe_http_requests"
FAST_UP: dict[str, Any] = {
    "scaleUp": {"stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 10, "periodSeconds": 1}]},
    "scaleDown": {"stabilizationWindowSeconds": 0}}


def config_with_pods_rule(job: str) -> str:
    """The default rules (5s windows) and one Pods rule for SERIES of exporter `job`."""
    config = yaml.safe_load(CONFIG)
    config["rules"].extend(yaml.safe_load(pods_rule(
        series_query=f'__name__="{SERIES}"', prefix="mspipe_", job=job)))
    return str(yaml.safe_dump(config))


async def settled(prometheus: PrometheusServer, deployment: str, pods: int,
                  cores: float) -> None:
    """Until the deployment's pods have 5s CPU rates that add up to `cores` (within 10%)."""
    await prometheus.wait_for_async(
        f'rate(container_cpu_usage_seconds_total{{namespace="{NS}",pod=~"{deployment}-.*",'
        'container="app"}[5s])',
        lambda samples: len(samples) == pods
        and abs(sum(float(s.value) for s in samples) - cores) < 0.1 * cores, timeout=60)


def sizes(fake: FakeKubeAPI, name: str) -> list[int]:
    return [int(e["note"].split(";")[0].removeprefix("New size: "))
            for e in events_of(fake, name) if e["reason"] == "SuccessfulRescale"]


async def test_a_container_resource_metric_reads_only_its_container(
        autoscaler_api: FakeKubeAPI, tmp_path: Path, prometheus: PrometheusServer,
        exporter: Exporter) -> None:
    fake_kube = autoscaler_api
    cadvisor = CAdvisor(exporter)
    # A busy sidecar (not in the pod spec's requests) would push a pod-wide figure up; the
    # ContainerResource metric sees container "app" only.
    async with cadvisor, Workload(fake_kube, "boxweb", replicas=2, total=Decimal("0.4"),
                                  publish=cadvisor_publisher(cadvisor, sidecar_cpu=2.0),
                                  cpu_request="500m"):
        await settled(prometheus, "boxweb", 2, 0.4)
        async with prometheus_adapter(fake_kube, tmp_path, prometheus_url=prometheus.url,
                                      rules=CONFIG, resource_metrics=True):
            fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                "boxweb", target="boxweb", min_replicas=1, max_replicas=10, behavior=FAST_UP,
                metrics=[{"type": "ContainerResource", "containerResource": {
                    "name": "cpu", "container": "app",
                    "target": {"type": "Utilization", "averageUtilization": 20}}}]))
            async with controller(fake_kube):
                # app uses 0.2 cores of 0.5 requested per pod: 40% against 20%: 4 pods.
                await until(lambda: replicas_of(fake_kube, "boxweb") == 4,
                            what="the scale-up to 4 on container app alone")
                await until(lambda: (condition(fake_kube, "boxweb", "ScalingActive")
                                     or ("", "", ""))[2].endswith(
                    "cpu container resource utilization (percentage of request)"),
                    what="the container resource condition")


async def test_when_prometheus_stops_nothing_scales_down_and_the_conditions_say_why(
        autoscaler_api: FakeKubeAPI, tmp_path: Path,
        prometheus_factory: PrometheusFactory) -> None:
    fake_kube = autoscaler_api
    own = prometheus_factory()
    with Exporter() as exporter:
        own.add_target(exporter)
        cadvisor = CAdvisor(exporter)
        async with cadvisor, \
                Workload(fake_kube, "web", replicas=4, total=Decimal(40),
                         publish=exporter_publisher(exporter, SERIES)) as web, \
                Workload(fake_kube, "cpuweb", replicas=4, total=Decimal(1),
                         publish=cadvisor_publisher(cadvisor), cpu_request="500m") as cpuweb:
            await own.wait_for_async(f'{SERIES}{{job="{exporter.job}"}}',
                                     lambda samples: len(samples) >= 4, timeout=60)
            await settled(own, "cpuweb", 4, 1.0)
            async with prometheus_adapter(fake_kube, tmp_path, prometheus_url=own.url,
                                          rules=config_with_pods_rule(exporter.job),
                                          resource_metrics=True):
                fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                    "web", target="web", metrics=[pods_metric("http_requests", "10")],
                    min_replicas=1, max_replicas=8,
                    behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}))
                fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                    "cpuweb", target="cpuweb", metrics=[cpu_metric(50)], min_replicas=1,
                    max_replicas=8, behavior=FAST_UP))

                def active(name: str) -> tuple[str, str, str]:
                    return condition(fake_kube, name, "ScalingActive") or ("", "", "")

                async with controller(fake_kube):
                    await until(lambda: active("web")[0] == active("cpuweb")[0] == "True",
                                what="a decision for each")
                    assert replicas_of(fake_kube, "web") == replicas_of(fake_kube, "cpuweb") == 4
                    await asyncio.to_thread(own.stop)
                    # Each would be a scale-down to 1, if anyone could see it.
                    web.set_load(1)
                    cpuweb.set_load("0.1")
                    await until(lambda: active("web")[1] == "FailedGetPodsMetric"
                                and active("cpuweb")[1] == "FailedGetResourceMetric",
                                what="the failing metrics in the conditions")
                    for name in ("web", "cpuweb"):
                        await holds(lambda name=name: replicas_of(fake_kube, name) == 4,  # type: ignore[misc]
                                    fake=fake_kube, target=name, for_seconds=2,
                                    what=f"no scale-down of {name} without metrics")
    assert active("web")[2].startswith(
        "the HPA was unable to compute the replica count: unable to get metric http_requests: "
        "unable to fetch metrics from custom metrics API: ")
    assert active("cpuweb")[2].startswith(
        "the HPA was unable to compute the replica count: failed to get cpu utilization: "
        "unable to get metrics for resource cpu: unable to fetch metrics from resource "
        "metrics API: ")
    reasons = [e["reason"] for e in events_of(fake_kube, "web")]
    assert "FailedGetPodsMetric" in reasons and "FailedComputeMetricsReplicas" in reasons
    assert sizes(fake_kube, "web") == sizes(fake_kube, "cpuweb") == []
