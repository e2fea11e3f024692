"""`metricscale autoscaler`'s server against the fake API server, with a metrics API of the
test's own behind the fake's aggregator: what it asks the API server in a steady state over
HTTP (the scale and one read per metric a reconcile, nothing else), and its /metrics, /healthz
and /readyz. (The controller's decisions: tests/autoscaler/test_controller_*.py, on the
injected clock.)"""

from __future__ import annotations

import asyncio
from decimal import Decimal

import aiohttp

from testbed.fakes.kube_api import FakeKubeAPI
from tests.autoscaler.fake_cluster import (
    GROUP,
    PLURAL,
    VERSION,
    MetricsBackend,
    Workload,
    autoscaler,
    condition,
    controller,
    cpu_metric,
    pods_metric,
    replicas_of,
    until,
)


async def test_steady_state_costs_a_scale_get_and_one_metrics_get_per_metric(
        autoscaler_api: FakeKubeAPI, metrics_backend: MetricsBackend) -> None:
    fake_kube, backend = autoscaler_api, metrics_backend
    async with Workload(fake_kube, "web", replicas=2, total=Decimal(20),
                        publish=backend.publisher("http_requests")) as web:
        backend.publisher("cpu")({pod: Decimal("0.2") for pod in web.pods()})
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric("http_requests", "10"),
                                          cpu_metric(80)], min_replicas=2))
        async with controller(fake_kube, sync=0.1) as server:
            await until(lambda: condition(fake_kube, "web", "ScalingActive") is not None,
                        what="a first decision")
            assert server.controller is not None
            await until(lambda: server.controller.reconciled >= 3, what="settling")
            fake_kube.requests.clear()
            start = server.controller.reconciled
            await until(lambda: server.controller.reconciled >= start + 10,
                        what="ten steady reconciles")
            done = server.controller.reconciled - start
            seen = list(fake_kube.requests)
    by_kind = {"scale": 0, "custom": 0, "resource": 0, "other": []}
    for request in seen:
        if request.path.endswith("/deployments/web/scale"):
            by_kind["scale"] += 1  # type: ignore[operator]
        elif request.path.startswith("/apis/custom.metrics.k8s.io/v1beta2/namespaces/"):
            by_kind["custom"] += 1  # type: ignore[operator]
        elif request.path.startswith("/apis/metrics.k8s.io/v1beta1/namespaces/"):
            by_kind["resource"] += 1  # type: ignore[operator]
        elif "watch=true" not in str(request.query).lower() and request.path not in (
                "/apis", "/api") and not request.path.startswith("/apis/coordination"):
            by_kind["other"].append((request.method, request.path))  # type: ignore[union-attr]
    assert by_kind["other"] == []  # no status writes, no events, nothing else
    for kind in ("scale", "custom", "resource"):
        assert abs(by_kind[kind] - done) <= 1, by_kind  # type: ignore[operator]


async def test_metrics_health_and_readiness_endpoints(
        autoscaler_api: FakeKubeAPI, metrics_backend: MetricsBackend) -> None:
    names = ('metricscale_autoscaler_reconciles_total{result="ok"}',
             "metricscale_autoscaler_reconcile_duration_seconds_count",
             'metricscale_autoscaler_decisions_total{outcome="scale_up"} 1.0',
             "metricscale_autoscaler_api_request_duration_seconds_count",
             "metricscale_autoscaler_leader 1.0")
    fake_kube = autoscaler_api
    async with Workload(fake_kube, "web", replicas=2, total=Decimal(40),
                        publish=metrics_backend.publisher("http_requests")):
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric("http_requests", "10")]))
        async with controller(fake_kube) as server, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{server.port}"
            await until(lambda: replicas_of(fake_kube, "web") == 4, what="a scale-up")
            async with http.get(f"{base}/healthz") as response:
                assert response.status == 200
            async with http.get(f"{base}/readyz") as response:
                assert response.status == 200
            # The scale is written first; the decision is counted after the events and the
            # status write, and the reconcile once it returns: read /metrics until they are
            # (bounded by the test's timeout alone).
            while True:
                async with http.get(f"{base}/metrics") as response:
                    text = await response.text()
                if all(name in text for name in names):
                    break
                await asyncio.sleep(0.05)
    for name in names:
        assert name in text, name
