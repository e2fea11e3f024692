"""The controller on the metrics pipeline's real answers, on the session's real control plane:
real Deployments (kube-controller-manager's controllers make their pods, kube-scheduler binds
them, the kubelet stand-in runs them and serves their cAdvisor series), load spread over their
Ready pods (testbed.load), a real Prometheus of the test's own scraping the stand-in and an
exporter, and the real adapter (a process) behind kube-apiserver's aggregator (custom metrics
from the exporter, metrics.k8s.io from cAdvisor's series, the default rules with their rate
windows cut to 5s). A ContainerResource metric reads its own container only; when Prometheus
stops, the adapter answers 503, nothing scales down and the conditions carry the API's words,
for a Pods and a Resource metric alike.

The controller runs in-process, watching only the test's namespace, through the fault proxy
(which records its requests: a hold is proven by its scale reads). The installed controller of
the session (`installation`, when another module made it) may reconcile the same Autoscalers
through the same aggregator; it reads the same answers, so what is checked holds for both. The
metric APIServices are pointed at this module's adapter and given back afterwards.

(CPU utilization through metrics.k8s.io on the real control plane, beside upstream's HPA:
tests/cluster/test_upstream_hpa_twins.py; the decisions themselves, on the injected clock:
tests/autoscaler/test_controller_*.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter.rules.defaults import DEFAULT_CONFIG_YAML
from autoscaler.controller.leader import LeaderElectionConfig
from autoscaler.decision.settings import Settings
from autoscaler.server import AutoscalerServer, Options, serve_autoscaler
from testbed.controlplane import ControlPlane, KubeError, Kubelet
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer
from testbed.fakes.prometheus_fixtures import PrometheusFactory
from testbed.faultproxy import FaultProxy
from testbed.kubelet import ANNOTATION_PREFIX
from testbed.load import Load
from testbed.metricscale_adapter import MetricscaleAdapter
from tests.adapter.cluster import Names
from tests.autoscaler.autoscaler_objects import (
    GROUP,
    PLURAL,
    VERSION,
    autoscaler,
    cpu_metric,
    pods_metric,
    pods_rule,
)
from tests.autoscaler.real_cluster_support import install_crd, metric_apiservices_given_back

pytestmark = pytest.mark.prometheus

CONFIG = DEFAULT_CONFIG_YAML.replace("[5m]", "[5s]").replace("window: 5m", "window: 5s")
SERIES = "mspipe_http_requests"
FAST_UP: dict[str, Any] = {
    "scaleUp": {"stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 10, "periodSeconds": 1}]},
    "scaleDown": {"stabilizationWindowSeconds": 0}}
# The adapter's namespace (its ExternalName Service, its account): the module's own.
ADAPTER_NAMESPACE = Names.unique("mspipe").namespace("adapter")
APISERVICES = (("custom.metrics.k8s.io", "v1beta2"), ("custom.metrics.k8s.io", "v1beta1"),
               ("metrics.k8s.io", "v1beta1"))
# Guards against a hang on a busy machine, not measures (the test's own timeout is 900 s).
SETTLE_SECONDS = 240.0


def config_with_pods_rule(job: str) -> str:
    """The default rules (5s windows) and one Pods rule for SERIES of exporter `job`."""
    config = yaml.safe_load(CONFIG)
    config["rules"].extend(yaml.safe_load(pods_rule(
        series_query=f'__name__="{SERIES}"', prefix="mspipe_", job=job)))
    return str(yaml.safe_dump(config))


# --------------------------------------------------------------------------------------------
# The cluster


@pytest.fixture
async def autoscaler_crd(control_plane: ControlPlane) -> None:
    """The shipped Autoscaler CRD, Established (left installed, as every module leaves it)."""
    await asyncio.to_thread(install_crd, control_plane)


@pytest.fixture
def given_back(control_plane: ControlPlane) -> Iterator[None]:
    """The metric APIServices this module points at its adapter, as they were before."""
    with metric_apiservices_given_back(control_plane):
        yield


def deployment(namespace: str, name: str, *, replicas: int,
               sidecar_cpu: str | None = None) -> dict[str, Any]:
    """Deployment `name` (pods app=`name`): container `app` requesting 500m, and with
    `sidecar_cpu` a container `sidecar` requesting nothing and using that many cores from its
    start (the kubelet stand-in's usage annotation)."""
    containers: list[dict[str, Any]] = [{"name": "app", "image": "registry.invalid/app:1",
                                         "resources": {"requests": {"cpu": "500m"}}}]
    annotations: dict[str, str] = {}
    if sidecar_cpu is not None:
        containers.append({"name": "sidecar", "image": "registry.invalid/sidecar:1"})
        annotations[ANNOTATION_PREFIX + "usage"] = json.dumps(
            {"sidecar": {"cpu": sidecar_cpu, "memory": 16 << 20}})
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name},
                                               "annotations": annotations},
                                  "spec": {"containers": containers}}}}


@dataclass(frozen=True)
class AppContainer(Kubelet):
    """The kubelet stand-in with a Load's CPU set on container `app` alone (the stand-in
    otherwise spreads a pod's usage over its containers): the sidecar keeps its own."""

    def set_usage(self, namespace: str, pod: str, *, cpu: float | str | None = None,
                  memory: int | None = None, container: str | None = None) -> bool:
        return super().set_usage(namespace, pod, cpu=cpu, memory=memory,
                                 container=container or "app")


def placed(cluster: ControlPlane, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["namespace"] = namespace
    cluster.apply(obj)
    return obj


def status_of(cluster: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    obj = cluster.get(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}")
    return dict(obj.get("status") or {})


def condition(cluster: ControlPlane, namespace: str, name: str,
              kind: str) -> tuple[str, str, str]:
    for item in status_of(cluster, namespace, name).get("conditions") or []:
        if item.get("type") == kind:
            return item.get("status", ""), item.get("reason", ""), item.get("message", "")
    return "", "", ""


def replicas_of(cluster: ControlPlane, namespace: str, deployment: str) -> int:
    obj = cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}")
    return int(obj["spec"].get("replicas", 0))


def events_of(cluster: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    """events.k8s.io Events about autoscaler `name`, oldest first."""
    listed = cluster.get(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")["items"]
    found = [e for e in listed if (e.get("regarding") or {}).get("name") == name]
    return sorted(found, key=lambda e: e.get("eventTime") or "")


def sizes(cluster: ControlPlane, namespace: str, name: str) -> list[int]:
    return [int(e["note"].split(";")[0].removeprefix("New size: "))
            for e in events_of(cluster, namespace, name) if e["reason"] == "SuccessfulRescale"]


async def until(check: Callable[[], object], *, what: str,
                within: float = SETTLE_SECONDS) -> None:
    """Until `check` holds. It is a blocking call (the cluster's client), run in a thread: the
    controller under test runs on this event loop."""
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within:.0f} s: {what}")
        await asyncio.sleep(0.1)


async def holds(check: Callable[[], object], *, proxy: FaultProxy, namespace: str, target: str,
                for_seconds: float, what: str, within: float = SETTLE_SECONDS) -> None:
    """`check` stays true for at least `for_seconds`, and through at least one whole reconcile
    of the autoscaler of Deployment `target` that began inside that window.

    The controller's reconciles of one autoscaler never overlap (one worker a key) and each
    reads the target's scale once (through the proxy, which records it): two reads after the
    window opened mean the first of those reconciles started inside it and had ended (its
    writes done) by the second. A controller too starved to get there in `within` seconds
    fails the hold instead of passing it vacuously."""
    path = f"^/apis/apps/v1/namespaces/{namespace}/deployments/{target}/scale$"
    seen = len(proxy.requests_to(path, method="GET"))
    started = time.monotonic()
    while True:
        assert await asyncio.to_thread(check), what
        reads = len(proxy.requests_to(path, method="GET")) - seen
        waited = time.monotonic() - started
        if reads >= 2 and waited >= for_seconds:
            return
        if waited > within:
            raise AssertionError(f"{what}: held {waited:.1f}s, but {target}'s autoscaler was "
                                 f"not reconciled from start to end meanwhile ({reads} scale "
                                 "reads): the hold proves nothing")
        await asyncio.sleep(0.1)


async def settled(prometheus: PrometheusServer, namespace: str, deployment: str, pods: int,
                  cores: float) -> None:
    """Until the deployment's pods have 5s CPU rates of container app that add up to `cores`
    (within 10%)."""
    await prometheus.wait_for_async(
        f'rate(container_cpu_usage_seconds_total{{namespace="{namespace}",'
        f'pod=~"{deployment}-.*",container="app"}}[5s])',
        lambda samples: len(samples) == pods
        and abs(sum(float(s.value) for s in samples) - cores) < 0.1 * cores,
        timeout=SETTLE_SECONDS)


# --------------------------------------------------------------------------------------------
# The adapter and the controller


def _answers_from_ours(cluster: ControlPlane, namespace: str, *, custom_metric: str | None,
                       pods: int) -> bool:
    """The aggregator answers from this test's adapter: metrics.k8s.io windows of 5s (an
    installed adapter's are longer) for the namespace's pods, and the Pods metric (only this
    test's Prometheus has its series) for each of them."""
    try:
        found = cluster.get(f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods")
        items = found.get("items") or []
        if len(items) < pods or {i.get("window") for i in items} != {"5s"}:
            return False
        if custom_metric is None:
            return True
        values = cluster.get(f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/"
                             f"pods/*/{custom_metric}")
        return len(values.get("items") or []) >= pods
    except (KubeError, OSError):
        return False


@contextlib.asynccontextmanager
async def adapter(cluster: ControlPlane, workdir: Path, namespace: str, *, prometheus_url: str,
                  rules: str, custom_metric: str | None, pods: int
                  ) -> AsyncIterator[MetricscaleAdapter]:
    """The adapter serving from `prometheus_url` with the config `rules`, the metric
    APIServices pointed at it and the aggregator answering from it (the caller gives them
    back). It discovers series when it starts: wait until Prometheus has them first."""
    served = MetricscaleAdapter(cluster, workdir=workdir, config_text=rules,
                                prometheus_url=prometheus_url, namespace=ADAPTER_NAMESPACE,
                                relist_interval="2s")
    await asyncio.to_thread(served.start)
    try:
        for group, version in APISERVICES:
            await asyncio.to_thread(served.point, group, version)
        for group, version in APISERVICES:
            await asyncio.to_thread(cluster.wait_apiservice_available, group, version)
        await until(lambda: _answers_from_ours(cluster, namespace, custom_metric=custom_metric,
                                               pods=pods),
                    what="the aggregator answering from the test's adapter")
        yield served
    finally:
        await asyncio.to_thread(served.stop)


@contextlib.asynccontextmanager
async def controller(cluster: ControlPlane, proxy: FaultProxy,
                     namespace: str) -> AsyncIterator[AutoscalerServer]:
    """One controller replica, in-process, watching the test's namespace through the proxy,
    with short periods (no leader election: the namespace has no other replica)."""
    options = Options(
        settings=Settings(sync_period=timedelta(seconds=0.25),
                          downscale_stabilization_window=timedelta(seconds=300)),
        leader_election=LeaderElectionConfig(enabled=False), namespace=namespace,
        concurrent_syncs=3, identity="replica-a", lease_namespace=namespace,
        reporting_instance="replica-a", metrics_bind_address="127.0.0.1:0",
        informer_options={"watch_timeout_seconds": 30})
    configuration = cluster.api_client_configuration(server=proxy.server)
    async with serve_autoscaler(configuration, options) as server:
        yield server
        assert server.fatal is None, f"the controller failed: {server.fatal!r}"


# --------------------------------------------------------------------------------------------
# The tests


@pytest.mark.usefixtures("autoscaler_crd", "given_back")
async def test_a_container_resource_metric_reads_only_its_container(
        control_plane: ControlPlane, kubelet: Kubelet, namespace: str,
        fault_proxy: FaultProxy, tmp_path: Path,
        prometheus_factory: PrometheusFactory) -> None:
    cluster = control_plane
    own = prometheus_factory()
    own.add_target(kubelet.address, job="kubelet")
    # A busy sidecar (not in the pod spec's requests) would push a pod-wide figure up; the
    # ContainerResource metric sees container "app" only.
    cluster.apply(deployment(namespace, "boxweb", replicas=2, sidecar_cpu="2"))
    with Load(cluster, AppContainer(kubelet.control_port, kubelet.node_ports),
              namespace=namespace, selector={"app": "boxweb"}, cpu="0.4"):
        await settled(own, namespace, "boxweb", 2, 0.4)
        async with adapter(cluster, tmp_path / "adapter", namespace, prometheus_url=own.url,
                           rules=CONFIG, custom_metric=None, pods=2):
            placed(cluster, namespace, autoscaler(
                "boxweb", target="boxweb", min_replicas=1, max_replicas=10, behavior=FAST_UP,
                metrics=[{"type": "ContainerResource", "containerResource": {
                    "name": "cpu", "container": "app",
                    "target": {"type": "Utilization", "averageUtilization": 20}}}]))
            async with controller(cluster, fault_proxy, namespace):
                # app uses 0.2 cores of 0.5 requested per pod: 40% against 20%: 4 pods (with
                # the sidecar counted, 440%: the maximum, 10).
                await until(lambda: replicas_of(cluster, namespace, "boxweb") == 4,
                            what="the scale-up to 4 on container app alone")
                await until(lambda: condition(cluster, namespace, "boxweb", "ScalingActive")[2]
                            .endswith("cpu container resource utilization (percentage of "
                                      "request)"),
                            what="the container resource condition")
                # And there it stays: 0.4 cores over 4 pods is 20%.
                await holds(lambda: replicas_of(cluster, namespace, "boxweb") == 4,
                            proxy=fault_proxy, namespace=namespace, target="boxweb",
                            for_seconds=2, what="boxweb staying at 4")


@pytest.mark.usefixtures("autoscaler_crd", "given_back")
async def test_when_prometheus_stops_nothing_scales_down_and_the_conditions_say_why(
        control_plane: ControlPlane, kubelet: Kubelet, namespace: str,
        fault_proxy: FaultProxy, tmp_path: Path,
        prometheus_factory: PrometheusFactory) -> None:
    cluster = control_plane
    own = prometheus_factory()
    own.add_target(kubelet.address, job="kubelet")

    def active(name: str) -> tuple[str, str, str]:
        return condition(cluster, namespace, name, "ScalingActive")

    with Exporter() as exporter:
        own.add_target(exporter)
        cluster.apply(deployment(namespace, "web", replicas=4))
        cluster.apply(deployment(namespace, "cpuweb", replicas=4))
        with Load(cluster, kubelet, namespace=namespace, selector={"app": "web"},
                  exporter=exporter, metric=SERIES, metric_total=40) as web, \
                Load(cluster, kubelet, namespace=namespace, selector={"app": "cpuweb"},
                     cpu=1) as cpuweb:
            await own.wait_for_async(
                f'{SERIES}{{job="{exporter.job}",namespace="{namespace}"}}',
                lambda samples: len(samples) >= 4, timeout=SETTLE_SECONDS)
            await settled(own, namespace, "cpuweb", 4, 1.0)
            async with adapter(cluster, tmp_path / "adapter", namespace,
                               prometheus_url=own.url, rules=config_with_pods_rule(exporter.job),
                               custom_metric="http_requests", pods=4):
                placed(cluster, namespace, autoscaler(
                    "web", target="web", metrics=[pods_metric("http_requests", "10")],
                    min_replicas=1, max_replicas=8,
                    behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}))
                placed(cluster, namespace, autoscaler(
                    "cpuweb", target="cpuweb", metrics=[cpu_metric(50)], min_replicas=1,
                    max_replicas=8, behavior=FAST_UP))
                async with controller(cluster, fault_proxy, namespace):
                    await until(lambda: active("web")[0] == active("cpuweb")[0] == "True",
                                what="a decision for each")
                    assert replicas_of(cluster, namespace, "web") == 4
                    assert replicas_of(cluster, namespace, "cpuweb") == 4
                    await asyncio.to_thread(own.stop)
                    # Each would be a scale-down to 1, if anyone could see it.
                    web.set(metric_total=1)
                    cpuweb.set(cpu="0.1")
                    await until(lambda: active("web")[1] == "FailedGetPodsMetric"
                                and active("cpuweb")[1] == "FailedGetResourceMetric",
                                what="the failing metrics in the conditions")
                    for name in ("web", "cpuweb"):
                        await holds(
                            lambda name=name: replicas_of(  # type: ignore[misc]
                                cluster, namespace, name) == 4,
                            proxy=fault_proxy, namespace=namespace, target=name,
                            for_seconds=2, what=f"no scale-down of {name} without metrics")
                    web_active, cpuweb_active = active("web"), active("cpuweb")
    assert web_active[2].startswith(
        "the HPA was unable to compute the replica count: unable to get metric http_requests: "
        "unable to fetch metrics from custom metrics API: ")
    assert cpuweb_active[2].startswith(
        "the HPA was unable to compute the replica count: failed to get cpu utilization: "
        "unable to get metrics for resource cpu: unable to fetch metrics from resource "
        "metrics API: ")
    reasons = [e["reason"] for e in events_of(cluster, namespace, "web")]
    assert "FailedGetPodsMetric" in reasons and "FailedComputeMetricsReplicas" in reasons
    assert sizes(cluster, namespace, "web") == sizes(cluster, namespace, "cpuweb") == []
