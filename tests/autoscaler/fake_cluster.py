"""The autoscaler against the fake API server, for the tests that need its HTTP shell: the
Autoscaler CRD installed (fixture `autoscaler_api`), a stand-in for the Deployment and
ReplicaSet controllers (pods follow `spec.replicas`, as the fake runs no controllers), load
spread over those pods and published through a real Prometheus and the real adapter behind the
fake's aggregator, or through a metrics API of the test's own (fixture `metrics_backend`), and
controller replicas run in-process exactly as `metricscale autoscaler` wires them.

The controller's logic is tested on the injected clock (tests/autoscaler/simulation.py), and
the real API's part on the real control plane (tests/cluster); what is left here is what sits
between: the program's requests, endpoints, process and the metrics pipeline's answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from autoscaler.controller.leader import LeaderElectionConfig
from autoscaler.decision.settings import Settings
from autoscaler.server import AutoscalerServer, Options, serve_autoscaler
from metricscale import pki
from metricscale.core.selectors import parse_selector
from testbed.fakes.cadvisor import CAdvisor
from testbed.fakes.exporter import Exporter
from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.kube_store import StoreEvent
from tests.adapter.auth_support import (
    SERVICE_NAME,
    SERVICE_NAMESPACE,
    ShiftedClock,
    make_pki,
    register_apiservices,
    secured_adapter,
)

REPO = Path(__file__).resolve().parents[2]
NS = "shop"
GROUP, VERSION, PLURAL = "metricscale.dev", "v1alpha1", "autoscalers"
BACKEND_NAMESPACE, BACKEND_SERVICE = "metrics", "test-metrics"
YEAR = timedelta(days=365)


def install_crd(fake: FakeKubeAPI) -> None:
    crd = yaml.safe_load((REPO / "manifests" / "autoscaler" / "crd.yaml").read_text())
    fake.create("apiextensions.k8s.io", "v1", "customresourcedefinitions", crd)


@pytest.fixture
def autoscaler_api(fake_kube: FakeKubeAPI) -> FakeKubeAPI:
    """The fake API server with the Autoscaler CRD installed."""
    install_crd(fake_kube)
    return fake_kube


@pytest.fixture
async def metrics_backend(autoscaler_api: FakeKubeAPI,
                          tmp_path: Path) -> AsyncIterator[MetricsBackend]:
    """custom.metrics.k8s.io and metrics.k8s.io of the test's own, behind the fake's
    aggregator (values as the test sets them)."""
    backend = MetricsBackend(autoscaler_api, tmp_path / "metrics")
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()


def pods_metric(name: str, average: str) -> dict[str, Any]:
    return {"type": "Pods", "pods": {"metric": {"name": name},
                                     "target": {"type": "AverageValue", "averageValue": average}}}


def cpu_metric(utilization: int) -> dict[str, Any]:
    return {"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization", "averageUtilization": utilization}}}


def autoscaler(name: str, *, target: str, metrics: list[dict[str, Any]], min_replicas: int = 1,
               max_replicas: int = 10, behavior: dict[str, Any] | None = None,
               annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                               "name": target},
                            "minReplicas": min_replicas, "maxReplicas": max_replicas,
                            "metrics": metrics}
    if behavior is not None:
        spec["behavior"] = behavior
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Autoscaler",
            "metadata": {"name": name, "namespace": NS, "annotations": dict(annotations or {})},
            "spec": spec}


def status_of(fake: FakeKubeAPI, name: str) -> dict[str, Any]:
    obj = fake.store.try_get(GROUP, VERSION, PLURAL, name, namespace=NS)
    return dict((obj or {}).get("status") or {})


def condition(fake: FakeKubeAPI, name: str, kind: str) -> tuple[str, str, str] | None:
    for item in status_of(fake, name).get("conditions") or []:
        if item.get("type") == kind:
            return item.get("status", ""), item.get("reason", ""), item.get("message", "")
    return None


def replicas_of(fake: FakeKubeAPI, deployment: str) -> int:
    obj = fake.store.get("apps", "v1", "deployments", deployment, namespace=NS)
    return int(obj["spec"].get("replicas", 0))


def events_of(fake: FakeKubeAPI, name: str) -> list[dict[str, Any]]:
    """events.k8s.io Events about autoscaler `name`, oldest first."""
    found = [e for e in fake.store.list("events.k8s.io", "v1", "events", namespace=NS)
             if (e.get("regarding") or {}).get("name") == name]
    return sorted(found, key=lambda e: e.get("eventTime", ""))


async def until(check: Callable[[], object], *, what: str, within: float = 120.0) -> float:
    """Poll `check`; returns the monotonic time it first held. `within` is a guard against a
    hang, not a measure (the test's own timeout is 900 s)."""
    deadline = time.monotonic() + within
    while True:
        if check():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(0.02)


def _scale_path(deployment: str) -> str:
    return f"/apis/apps/v1/namespaces/{NS}/deployments/{deployment}/scale"


async def holds(check: Callable[[], object], *, fake: FakeKubeAPI, target: str,
                for_seconds: float, what: str, within: float = 120.0) -> None:
    """`check` stays true for at least `for_seconds`, and through at least one whole reconcile
    of the autoscaler of Deployment `target` that began inside that window.

    The controller's reconciles of one autoscaler never overlap (one worker a key) and each
    reads the target's scale once: two reads after the window opened mean the first of those
    reconciles started inside it and had ended (its writes done) by the second. A controller
    too starved to get there in `within` seconds fails the hold instead of passing it
    vacuously; on a busy machine the window stretches until it does.
    """
    path = _scale_path(target)
    log = fake.requests
    seen, reads = len(log), 0
    started = time.monotonic()
    while True:
        assert check(), what
        if len(log) < seen:  # the test trimmed the log meanwhile
            seen = 0
        reads += sum(1 for r in log[seen:] if r.method == "GET" and r.path == path)
        seen = len(log)
        waited = time.monotonic() - started
        if reads >= 2 and waited >= for_seconds:
            return
        if waited > within:
            raise AssertionError(f"{what}: held {waited:.1f}s, but {target}'s autoscaler was "
                                 f"not reconciled from start to end meanwhile ({reads} scale "
                                 "reads): the hold proves nothing")
        await asyncio.sleep(0.02)


# --------------------------------------------------------------------------------------------
# The Deployment's pods, and the load on them


class Workload:
    """Plays the Deployment and ReplicaSet controllers: as many ready pods as spec.replicas
    asks for (web-0, web-1, ...), status.replicas in step, and `total` load spread evenly over
    the pods, handed to `publish(pod -> value)`.

    It watches the fake's store (its write callbacks) rather than polling it: a pass runs when
    the Deployment or one of its pods was written, and the pods' names are kept from the
    events, so an idle workload costs nothing and none lists or copies the namespace's pods
    (twelve polling workloads starved the controller sharing their event loop)."""

    def __init__(self, fake: FakeKubeAPI, name: str, *, replicas: int, total: Decimal,
                 publish: Callable[[dict[str, Decimal]], None], cpu_request: str = "500m"
                 ) -> None:
        self.fake = fake
        self.name = name
        self.total = total
        self.publish = publish
        self.cpu_request = cpu_request
        fake.create_deployment(name, namespace=NS, replicas=replicas, labels={"app": name},
                               cpu_request=cpu_request)
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._pods = self._listed()
        self._unsubscribe: Callable[[], None] | None = None
        self.sync()

    def _listed(self) -> set[str]:
        return {p["metadata"]["name"] for p in self.fake.store.list(
            "", "v1", "pods", namespace=NS, label_selector=f"app={self.name}")}

    def _on_write(self, event: StoreEvent) -> None:
        """The store's callback after every write (synchronous: bookkeeping only)."""
        if event.namespace != NS:
            return
        if (event.key.group, event.key.resource) == ("apps", "deployments"):
            if event.name == self.name:
                self._changed.set()
        elif (event.key.group, event.key.resource) == ("", "pods"):
            labels = (event.object.get("metadata") or {}).get("labels") or {}
            if event.type != "DELETED" and labels.get("app") == self.name:
                self._pods.add(event.name)
            elif event.name in self._pods:
                self._pods.discard(event.name)
            else:
                return
            self._changed.set()

    def pods(self) -> list[str]:
        return sorted(self._pods)

    def set_load(self, total: Decimal | int | str) -> None:
        self.total = Decimal(total)
        self._publish(self.pods())

    def _publish(self, pods: list[str]) -> None:
        share = self.total / len(pods) if pods else Decimal(0)
        self.publish({pod: share for pod in pods})

    def sync(self) -> None:
        """One pass of the controllers."""
        deployment = self.fake.store.try_get("apps", "v1", "deployments", self.name,
                                             namespace=NS)
        if deployment is None:
            return
        wanted = int(deployment["spec"].get("replicas", 0))
        changed = False
        for index in range(wanted):
            pod = f"{self.name}-{index}"
            if pod not in self._pods:
                self.fake.create_pod(pod, namespace=NS, labels={"app": self.name},
                                     cpu_request=self.cpu_request)
                self._pods.add(pod)  # the callback does too, once subscribed
                changed = True
        for pod in self.pods():
            if int(pod.rsplit("-", 1)[1]) >= wanted:
                self.fake.store.delete("", "v1", "pods", pod, namespace=NS)
                self._pods.discard(pod)
                changed = True
        if (deployment.get("status") or {}).get("replicas", 0) != wanted:
            def settle(obj: dict[str, Any]) -> None:
                status = obj.setdefault("status", {})
                for key in ("replicas", "readyReplicas", "availableReplicas", "updatedReplicas"):
                    status[key] = wanted
            self.fake.store.mutate("apps", "v1", "deployments", self.name, settle, namespace=NS)
        if changed:
            self._publish(self.pods())

    async def _run(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            self.sync()

    async def __aenter__(self) -> Workload:
        self._unsubscribe = self.fake.store.subscribe(self._on_write)
        self._pods = self._listed()  # what was written before the subscription
        self.sync()
        self._publish(self.pods())
        self._task = asyncio.create_task(self._run(), name=f"workload {self.name}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def pods_rule(*, series_query: str, prefix: str, job: str) -> str:
    """One prometheus-adapter rule serving per-pod gauges of `job` as Pods metrics (the name
    without `prefix`), its metricsQuery pinned to the job (the e2e modules share a Prometheus).
    `series_query` is the inside of the seriesQuery's braces before the job."""
    return f"""\
- seriesQuery: '{{{series_query},job="{job}",namespace!="",pod!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  name: {{matches: "^{prefix}(.*)$", as: "${{1}}"}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>,job="{job}"}}) by (<<.GroupBy>>)'
"""


def exporter_publisher(exporter: Exporter, metric: str) -> Callable[[dict[str, Decimal]], None]:
    """Publish per-pod values as a gauge `metric{namespace, pod}`; pods gone lose their series."""
    shown: set[str] = set()

    def publish(values: dict[str, Decimal]) -> None:
        for pod in shown - set(values):
            exporter.remove(metric, {"namespace": NS, "pod": pod})
        for pod, value in values.items():
            exporter.set(metric, {"namespace": NS, "pod": pod}, value, type="gauge")
        shown.clear()
        shown.update(values)

    return publish


# --------------------------------------------------------------------------------------------
# A metrics API of the test's own, behind the fake's aggregator


def cadvisor_publisher(cadvisor: CAdvisor, *, node: str = "node-1", memory: int = 64 << 20,
                       sidecar_cpu: float | None = None,
                       ) -> Callable[[dict[str, Decimal]], None]:
    """Publish per-pod CPU use (cores) as cAdvisor's series of container `app` (plus a
    `sidecar` container using `sidecar_cpu` cores, when given); pods gone lose their series."""

    def publish(values: dict[str, Decimal]) -> None:
        for namespace, pod in cadvisor.pods():
            if namespace == NS and pod not in values:
                cadvisor.remove_pod(namespace, pod)
        for pod, cores in values.items():
            cadvisor.set_container(NS, pod, "app", node=node, cpu=float(cores), memory=memory)
            if sidecar_cpu is not None:
                cadvisor.set_container(NS, pod, "sidecar", node=node, cpu=sidecar_cpu,
                                       memory=memory // 4)

    return publish


def _quantity(value: Decimal) -> str:
    milli = int(value * 1000)
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


@dataclass
class MetricsBackend:
    """custom.metrics.k8s.io/v1beta2 pods metrics and metrics.k8s.io/v1beta1 PodMetrics from
    values the test sets (`values[metric][pod]`, cpu usage under "cpu"), over HTTPS."""

    fake: FakeKubeAPI
    workdir: Path
    values: dict[str, dict[str, Decimal]] = field(default_factory=dict)
    up: bool = True
    requests: list[str] = field(default_factory=list)
    _runner: web.AppRunner | None = None

    def publisher(self, metric: str) -> Callable[[dict[str, Decimal]], None]:
        def publish(values: dict[str, Decimal]) -> None:
            self.values[metric] = dict(values)
        return publish

    def _pods(self, request: web.Request, namespace: str) -> list[str]:
        # The stored pods, read in place: a list would deep-copy every pod of the namespace
        # for each of the controller's requests.
        selector = parse_selector(request.query.get("labelSelector", ""))
        pods = self.fake.registry.resolve("", "v1", "pods")
        assert pods is not None
        return sorted(obj["metadata"]["name"]
                      for _, obj in self.fake.store.entries(pods, namespace)
                      if selector.matches(obj["metadata"].get("labels") or {}))

    async def _discovery(self, request: web.Request) -> web.Response:
        group, version = request.match_info["group"], request.match_info["version"]
        resources = ([{"name": "pods", "singularName": "", "namespaced": True,
                       "kind": "PodMetrics", "verbs": ["get", "list"]}]
                     if group == "metrics.k8s.io" else
                     [{"name": f"pods/{metric}", "singularName": "", "namespaced": True,
                       "kind": "MetricValueList", "verbs": ["get"]} for metric in self.values])
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                                  "groupVersion": f"{group}/{version}",
                                  "resources": resources})

    def _unavailable(self) -> web.Response:
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "message": "the metrics backend is down", "reason":
                                  "ServiceUnavailable", "code": 503}, status=503)

    async def _custom(self, request: web.Request) -> web.Response:
        self.requests.append(request.path_qs)
        if not self.up:
            return self._unavailable()
        namespace, metric = request.match_info["namespace"], request.match_info["metric"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        values = self.values.get(metric, {})
        items = [{"describedObject": {"kind": "Pod", "namespace": namespace, "name": pod,
                                      "apiVersion": "/v1"},
                  "metric": {"name": metric}, "timestamp": now, "windowSeconds": 60,
                  "value": _quantity(values[pod])}
                 for pod in self._pods(request, namespace) if pod in values]
        return web.json_response({"kind": "MetricValueList",
                                  "apiVersion": "custom.metrics.k8s.io/v1beta2",
                                  "metadata": {}, "items": items})

    async def _resource(self, request: web.Request) -> web.Response:
        self.requests.append(request.path_qs)
        if not self.up:
            return self._unavailable()
        namespace = request.match_info["namespace"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        values = self.values.get("cpu", {})
        items = [{"metadata": {"name": pod, "namespace": namespace}, "timestamp": now,
                  "window": "30s",
                  "containers": [{"name": "app", "usage": {"cpu": _quantity(values[pod])}}]}
                 for pod in self._pods(request, namespace) if pod in values]
        return web.json_response({"kind": "PodMetricsList",
                                  "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {},
                                  "items": items})

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        now = datetime.now(UTC) - timedelta(minutes=5)
        ca = pki.generate_ca(common_name="test-metrics-ca", now=now, validity=YEAR)
        serving = pki.issue_serving_certificate(
            ca, common_name=BACKEND_SERVICE,
            dns_names=("localhost", f"{BACKEND_SERVICE}.{BACKEND_NAMESPACE}.svc"),
            ip_addresses=("127.0.0.1",), now=now, validity=YEAR)
        cert = pki.write_certificate(self.workdir / "tls.crt", serving.certificate)
        key = pki.write_private_key(self.workdir / "tls.key", serving.private_key)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(cert), str(key))
        app = web.Application()
        app.router.add_get("/apis/{group}/{version}", self._discovery)
        app.router.add_get(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/{name}/{metric}",
            self._custom)
        app.router.add_get("/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods",
                           self._resource)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        port = int(self._runner.addresses[0][1])
        for group, version in (("custom.metrics.k8s.io", "v1beta2"),
                               ("metrics.k8s.io", "v1beta1")):
            self.fake.create_apiservice(group=group, version=version,
                                        service_namespace=BACKEND_NAMESPACE,
                                        service_name=BACKEND_SERVICE,
                                        ca_bundle=ca.certificate_pem)
        self.fake.set_service_endpoint(BACKEND_NAMESPACE, BACKEND_SERVICE, "127.0.0.1", port)
        for name in ("v1beta2.custom.metrics.k8s.io", "v1beta1.metrics.k8s.io"):
            await self.fake.wait_for_apiservice(name, within=15.0)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


# --------------------------------------------------------------------------------------------
# Controller replicas


def election(*, enabled: bool) -> LeaderElectionConfig:
    # The shortest timings the elector accepts (client-go's rules): a takeover within ~2 s.
    return LeaderElectionConfig(enabled=enabled, lease_duration=timedelta(seconds=2),
                                renew_deadline=timedelta(seconds=1.5),
                                retry_period=timedelta(seconds=1),
                                resource_name="metricscale-autoscaler",
                                resource_namespace="metricscale")


@contextlib.asynccontextmanager
async def controller(fake: FakeKubeAPI, *, identity: str = "replica-a",
                     sync: float = 0.25, leader_election: bool = False,
                     token: str | None = None, dry_run: bool = False,
                     downscale_window: float = 300.0, watch_timeout: int = 30,
                     native_hpa: bool = False, scale_to_zero: bool = False,
                     ) -> AsyncIterator[AutoscalerServer]:
    """One controller replica against the fake, with short periods (`scale_to_zero`: the
    controller's --scale-to-zero flag)."""
    options = Options(
        settings=Settings(sync_period=timedelta(seconds=sync),
                          downscale_stabilization_window=timedelta(seconds=downscale_window),
                          scale_to_zero=scale_to_zero),
        leader_election=election(enabled=leader_election),
        concurrent_syncs=3, dry_run=dry_run, native_hpa=native_hpa, identity=identity,
        lease_namespace="metricscale",
        reporting_instance=identity, metrics_bind_address="127.0.0.1:0",
        informer_options={"watch_timeout_seconds": watch_timeout})
    async with serve_autoscaler(fake.api_client_configuration(token), options) as server:
        yield server
        assert server.fatal is None, f"the controller failed: {server.fatal!r}"


# --------------------------------------------------------------------------------------------
# The real adapter, over a real Prometheus


@dataclass(frozen=True)
class RealAdapter:
    """Where the adapter listens and the CA of its serving certificate (to register its
    APIServices again after a test removed them)."""

    port: int
    ca_pem: bytes


@contextlib.asynccontextmanager
async def prometheus_adapter(fake: FakeKubeAPI, workdir: Path, *, prometheus_url: str,
                             rules: str, resource_metrics: bool = False
                             ) -> AsyncIterator[RealAdapter]:
    """The adapter serving the metrics APIs from `prometheus_url` with the config `rules`, its
    APIServices (metrics.k8s.io too with `resource_metrics`) Available behind the fake's
    aggregator. It discovers series when it starts: wait until Prometheus has them first."""
    test_pki = make_pki(workdir / "pki")
    async with secured_adapter(workdir=workdir / "adapter", test_pki=test_pki,
                               kubeconfig=fake.write_kubeconfig(workdir / "kubeconfig"),
                               prometheus_url=prometheus_url, config_text=rules,
                               clock=ShiftedClock()) as adapter:
        ca_pem = test_pki.serving_ca.certificate_pem
        await register_apiservices(fake, port=adapter.port, ca_pem=ca_pem)
        if resource_metrics:
            fake.create_apiservice(group="metrics.k8s.io", version="v1beta1",
                                   service_namespace=SERVICE_NAMESPACE,
                                   service_name=SERVICE_NAME, ca_bundle=ca_pem)
            await fake.wait_for_apiservice("v1beta1.metrics.k8s.io", within=15.0)
        yield RealAdapter(adapter.port, ca_pem)
