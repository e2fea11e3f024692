"""The autoscaler against faults the real kube-apiserver cannot be made to produce on demand,
injected by the fault proxy in front of it: a stalled Autoscaler watch (and the re-list after
it stalled too) is restarted, /readyz says so meanwhile, and the spec change the stale cache
missed is synced at once; conflicts on the scale write are read again and retried.

The controller here runs in-process, watching only the test's namespace through the proxy;
the installed one (which talks to kube-apiserver directly) may reconcile the same objects, so
what is checked is this controller's own caches, reconciles and requests."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from autoscaler.controller.leader import LeaderElectionConfig
from autoscaler.decision.settings import Settings
from autoscaler.kube.operations import KubeClient, ScaleTargetRef
from autoscaler.server import Options, serve_autoscaler
from metricscale.kube.http import open_kube_http
from metricscale.kube.retry import Backoff
from testbed.controlplane import ControlPlane
from testbed.faultproxy import FaultProxy, ServerError, StallWatch
from testbed.install import Installation
from tests.cluster.support import deployment, until

STALL = 2.0      # the informers' stall timeout (production: bookmark interval + 15 s)
LIST_READ = 2.0  # how long a stalled LIST is waited for
SYNC_PERIOD = timedelta(minutes=10)  # longer than the test: only an immediate sync acts
GROUP_VERSION = "metricscale.dev/v1alpha1"


def web_autoscaler(namespace: str) -> dict[str, Any]:
    return {"apiVersion": GROUP_VERSION, "kind": "Autoscaler",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": "web"},
                     "minReplicas": 1, "maxReplicas": 4,
                     "metrics": [{"type": "Pods", "pods": {
                         "metric": {"name": "faults_unserved"},
                         "target": {"type": "AverageValue", "averageValue": "10"}}}]}}


async def test_a_stalled_autoscaler_watch_restarts_reports_unready_and_syncs_the_change(
        installation: Installation, fault_proxy: FaultProxy, namespace: str) -> None:
    cluster = installation.cluster
    cluster.apply(deployment(namespace, replicas=3))
    cluster.apply(web_autoscaler(namespace))
    options = Options(
        settings=Settings(sync_period=SYNC_PERIOD), namespace=namespace,
        leader_election=LeaderElectionConfig(enabled=False), concurrent_syncs=2,
        identity="faults", lease_namespace=namespace, reporting_instance="faults",
        metrics_bind_address="127.0.0.1:0",
        informer_options={"watch_timeout_seconds": 1, "stall_timeout": STALL,
                          "list_read_timeout": LIST_READ,
                          "backoff": Backoff(initial=0.1, cap=0.2)})
    configuration = cluster.api_client_configuration(server=fault_proxy.server)
    async with serve_autoscaler(configuration, options) as server, \
            aiohttp.ClientSession() as http:
        assert server.watching is not None and server.controller is not None
        controller = server.controller
        informer = server.watching.autoscalers
        base = f"http://127.0.0.1:{server.port}"

        async def readyz() -> tuple[int, str]:
            async with http.get(f"{base}/readyz") as response:
                return response.status, await response.text()

        await until(lambda: controller.reconciled >= 1, what="the first reconcile")
        assert (await readyz())[0] == 200
        reconciled = controller.reconciled

        # The next watch (and the re-list after it) stall: the proxy answers the headers and
        # then nothing. The spec change made meanwhile reaches the cache only by the re-list.
        collection = rf"^/apis/metricscale\.dev/v1alpha1/namespaces/{namespace}/autoscalers\?"
        stall = fault_proxy.add_fault(collection, StallWatch(), method="GET", times=2)
        await until(lambda: stall.hits == 1, what="the re-watch stalling")
        cluster.request("PATCH", f"/apis/{GROUP_VERSION}/namespaces/{namespace}/autoscalers/web",
                        {"spec": {"maxReplicas": 2}},
                        content_type="application/merge-patch+json")

        stale_seen = False

        async def reported_stale() -> bool:
            nonlocal stale_seen
            status, body = await readyz()
            stale_seen = stale_seen or (
                status == 503 and "[-]informer-autoscalers failed" in body)
            return stale_seen

        await until(reported_stale, what="/readyz reporting the stale cache")

        def cached_max() -> object:
            entry = next(iter(informer.items()), (None, None))[1]
            return entry is not None and entry.raw["spec"].get("maxReplicas")

        await until(lambda: cached_max() == 2, what="the change in the cache after a re-list")
        # A sync period of 10 minutes: only the immediate sync of the changed spec reconciles.
        await until(lambda: controller.reconciled > reconciled,
                    what="the changed autoscaler reconciled at once")
        assert informer.restarts.get("stalled", 0) >= 1
        await until(lambda: informer.stale_reason() is None, what="fresh again")
        status, body = await readyz()
        assert status == 200, body
        async with http.get(f"{base}/metrics") as response:
            text = await response.text()
    assert 'metricscale_cache_watch_restarts_total{cache="autoscalers",reason="stalled"}' in text
    assert 'metricscale_cache_last_event_age_seconds{cache="autoscalers"}' in text
    assert stall.hits == 2


async def test_conflicts_on_the_scale_write_are_read_again_and_retried(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str) -> None:
    control_plane.apply(deployment(namespace, replicas=2))
    scale_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/web/scale"
    configuration = control_plane.api_client_configuration(server=fault_proxy.server)
    async with open_kube_http(configuration, user_agent="metricscale-tests") as http:
        kube = KubeClient(http, registry=CollectorRegistry(), reporting_instance="tests")
        target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
        scale = await kube.get_scale(target, namespace=namespace, name="web")
        fault_proxy.add_fault(f"^{scale_path}$", ServerError(409, "the object has been "
                                                                  "modified"),
                              method="PUT", times=2)
        written = await kube.update_scale(target, namespace=namespace, name="web", scale=scale,
                                          replicas=4)
    assert written.spec_replicas == 4
    stored = control_plane.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/web")
    assert stored["spec"]["replicas"] == 4
    # update, re-read, update, re-read, update: retry.RetryOnConflict with a fresh GET each time
    calls = [(r.method, r.status) for r in fault_proxy.requests_to(f"^{scale_path}$")]
    assert calls == [("GET", 200), ("PUT", 409), ("GET", 200), ("PUT", 409), ("GET", 200),
                     ("PUT", 200)]
