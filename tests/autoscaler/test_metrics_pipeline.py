"""CPU autoscaling end to end on our own parts: the adapter serves metrics.k8s.io from a real
Prometheus fed with cAdvisor's series (the default rules, `rate()` range cut to 5s as in
test_resource_metrics_kubectl.py), behind the fake's aggregator; the controller scales a
Deployment on a `Resource` cpu Utilization metric and on a `ContainerResource` one; when
Prometheus stops, the adapter answers 503 and nothing scales down."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from adapter.rules.defaults import DEFAULT_CONFIG_YAML
from testbed.fakes.cadvisor import CAdvisor
from testbed.fakes.exporter import Exporter
from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.prometheus import PrometheusServer
from tests.e2e.test_adapter_auth_support import (
    GROUP_VERSIONS,
    SERVICE_NAME,
    SERVICE_NAMESPACE,
    ShiftedClock,
    make_pki,
    register_apiservices,
    secured_adapter,
)
from tests.e2e.test_autoscaler_support import (
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
    holds,
    install_crd,
    replicas_of,
    until,
)

pytestmark = pytest.mark.prometheus

AUTOSCALER_USER = "system:serviceaccount:metricscale:autoscaler"
CONFIG = DEFAULT_CONFIG_YAML.replace("[5m]", "[5s]").replace("window: 5m", "window: 5s")
FAST_UP: dict[str, Any] = {
    "scaleUp": {"stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 10, "periodSeconds": 1}]},
    "scaleDown": {"stabilizationWindowSeconds": 0}}
# Fast up, upstream's default 300 s down: a 5s rate() read between scrapes may dip, and the
# first test is about the scale-up and the count it then keeps.
FAST_UP_ONLY: dict[str, Any] = {"scaleUp": FAST_UP["scaleUp"]}


@contextlib.asynccontextmanager
async def adapter_serving_resource_metrics(fake: FakeKubeAPI, workdir: Path, *,
                                           prometheus: PrometheusServer) -> AsyncIterator[None]:
    test_pki = make_pki(workdir / "pki")
    async with secured_adapter(workdir=workdir / "adapter", test_pki=test_pki,
                               kubeconfig=fake.write_kubeconfig(workdir / "kubeconfig"),
                               prometheus_url=prometheus.url, config_text=CONFIG,
                               clock=ShiftedClock()) as adapter:
        await register_apiservices(fake, port=adapter.port,
                                   ca_pem=test_pki.serving_ca.certificate_pem)
        assert ("metrics.k8s.io", "v1beta1", 100) not in GROUP_VERSIONS
        fake.create_apiservice(group="metrics.k8s.io", version="v1beta1",
                               service_namespace=SERVICE_NAMESPACE, service_name=SERVICE_NAME,
                               ca_bundle=test_pki.serving_ca.certificate_pem)
        await fake.wait_for_apiservice("v1beta1.metrics.k8s.io", within=15.0)
        yield


async def settled(prometheus: PrometheusServer, deployment: str, pods: int,
                  cores: float) -> None:
    """Until the deployment's pods have 5s CPU rates that add up to `cores` (within 10%)."""
    await prometheus.wait_for_async(
        f'rate(container_cpu_usage_seconds_total{{namespace="{NS}",pod=~"{deployment}-.*",'
        'container="app"}[5s])',
        lambda samples: len(samples) == pods
        and abs(sum(float(s.value) for s in samples) - cores) < 0.1 * cores, timeout=30)


def sizes(fake: FakeKubeAPI, name: str) -> list[int]:
    return [int(e["note"].split(";")[0].removeprefix("New size: "))
            for e in events_of(fake, name) if e["reason"] == "SuccessfulRescale"]


async def test_cpu_utilization_scales_a_deployment_through_metrics_k8s_io(
        fake_kube: FakeKubeAPI, tmp_path: Path, prometheus: PrometheusServer,
        exporter: Exporter) -> None:
    install_crd(fake_kube)
    cadvisor = CAdvisor(exporter)
    async with cadvisor, Workload(fake_kube, "cpuweb", replicas=2, total=Decimal("0.4"),
                                  publish=cadvisor_publisher(cadvisor),
                                  cpu_request="500m") as web:
        await settled(prometheus, "cpuweb", 2, 0.4)
        async with adapter_serving_resource_metrics(fake_kube, tmp_path, prometheus=prometheus):
            fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                "cpuweb", target="cpuweb", metrics=[cpu_metric(50)], min_replicas=2,
                max_replicas=10, behavior=FAST_UP_ONLY))
            # A service account, not system:masters (which the adapter lets through without
            # asking, as the generic apiserver does): its requests need SubjectAccessReviews.
            fake_kube.add_user(token="autoscaler-token",
                               username=AUTOSCALER_USER,
                               groups=("system:serviceaccounts",))
            async with controller(fake_kube, token="autoscaler-token"):
                await until(lambda: condition(fake_kube, "cpuweb", "ScalingActive") ==
                            ("True", "ValidMetricFound",
                             "the HPA was able to successfully calculate a replica count from "
                             "cpu resource utilization (percentage of request)"),
                            within=20, what="a first decision from metrics.k8s.io")
                assert replicas_of(fake_kube, "cpuweb") == 2  # 40% of the request, under 50%
                # 1.4 cores over 500m requests at 50% is six pods' worth (5.6 rounded up),
                # from any count on the way (3, 4 or 5 pods all ask for 6). Six then run at
                # 46.7%, inside the 10% tolerance with room for a 5s rate() that overshoots
                # while the load moves to the new pods (up to 55% keeps 6).
                web.set_load("1.4")
                await until(lambda: replicas_of(fake_kube, "cpuweb") == 6, within=30,
                            what="the scale-up to 6")
                await holds(lambda: replicas_of(fake_kube, "cpuweb") == 6, fake=fake_kube,
                            target="cpuweb", for_seconds=3, what="6 pods at 46.7% each stay 6")
    assert sizes(fake_kube, "cpuweb")[-1] == 6
    # Authorized as the other groups are: a SubjectAccessReview for list pods in
    # metrics.k8s.io, in the autoscaler's namespace.
    attributes = [(r.get("spec") or {}).get("resourceAttributes") or {}
                  for r in fake_kube.subject_access_reviews
                  if (r.get("spec") or {}).get("user") == AUTOSCALER_USER]
    assert {"group": "metrics.k8s.io", "resource": "pods", "verb": "list", "namespace": NS,
            "version": "v1beta1"}.items() <= next(
        (a for a in attributes if a.get("group") == "metrics.k8s.io"), {}).items()


async def test_a_container_resource_metric_reads_only_its_container(
        fake_kube: FakeKubeAPI, tmp_path: Path, prometheus: PrometheusServer,
        exporter: Exporter) -> None:
    install_crd(fake_kube)
    cadvisor = CAdvisor(exporter)
    # A busy sidecar (not in the pod spec's requests) would push a pod-wide figure up; the
    # ContainerResource metric sees container "app" only.
    async with cadvisor, Workload(fake_kube, "boxweb", replicas=2, total=Decimal("0.4"),
                                  publish=cadvisor_publisher(cadvisor, sidecar_cpu=2.0),
                                  cpu_request="500m"):
        await settled(prometheus, "boxweb", 2, 0.4)
        async with adapter_serving_resource_metrics(fake_kube, tmp_path, prometheus=prometheus):
            fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                "boxweb", target="boxweb", min_replicas=1, max_replicas=10, behavior=FAST_UP,
                metrics=[{"type": "ContainerResource", "containerResource": {
                    "name": "cpu", "container": "app",
                    "target": {"type": "Utilization", "averageUtilization": 20}}}]))
            async with controller(fake_kube):
                # app uses 0.2 cores of 0.5 requested per pod: 40% against 20%: 4 pods.
                await until(lambda: replicas_of(fake_kube, "boxweb") == 4, within=30,
                            what="the scale-up to 4 on container app alone")
                await until(lambda: (condition(fake_kube, "boxweb", "ScalingActive")
                                     or ("", "", ""))[2].endswith(
                    "cpu container resource utilization (percentage of request)"),
                    within=10, what="the container resource condition")


async def test_when_prometheus_stops_the_adapter_answers_503_and_nothing_scales_down(
        fake_kube: FakeKubeAPI, tmp_path: Path, prometheus_factory: Any) -> None:
    own: PrometheusServer = prometheus_factory()
    with Exporter() as exporter:
        own.add_target(exporter)
        install_crd(fake_kube)
        cadvisor = CAdvisor(exporter)
        async with cadvisor, Workload(fake_kube, "downweb", replicas=4, total=Decimal("1"),
                                      publish=cadvisor_publisher(cadvisor),
                                      cpu_request="500m") as web:
            await settled(own, "downweb", 4, 1.0)
            async with adapter_serving_resource_metrics(fake_kube, tmp_path, prometheus=own):
                fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                    "downweb", target="downweb", metrics=[cpu_metric(50)], min_replicas=1,
                    max_replicas=8, behavior=FAST_UP))
                async with controller(fake_kube):
                    await until(lambda: (condition(fake_kube, "downweb", "ScalingActive")
                                         or ("",))[0] == "True", within=20, what="a decision")
                    assert replicas_of(fake_kube, "downweb") == 4
                    await asyncio.to_thread(own.stop)
                    web.set_load("0.1")  # would be a scale-down to 1, if anyone could see it
                    await until(lambda: (condition(fake_kube, "downweb", "ScalingActive")
                                         or ("", ""))[1] == "FailedGetResourceMetric",
                                within=20, what="the failing metric in the conditions")
                    await holds(lambda: replicas_of(fake_kube, "downweb") == 4,
                                fake=fake_kube, target="downweb", for_seconds=2,
                                what="no scale-down without metrics")
    _, _, message = condition(fake_kube, "downweb", "ScalingActive") or ("", "", "")
    assert message.startswith("the HPA was unable to compute the replica count: failed to get "
                              "cpu utilization: unable to get metrics for resource cpu: "
                              "unable to fetch metrics from resource metrics API: ")
    assert sizes(fake_kube, "downweb") == []
