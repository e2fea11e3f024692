"""Every status shape and Event the controller writes, accepted by the real kube-apiserver: the
statuses of tests/autoscaler/status_shapes.py (one controller on the injected clock over an
autoscaler per path through the decision, pause, fallback, activation, conflicts and pod
selection included), each written in turn through the controller's own Kubernetes client to an
Autoscaler of the same name, under the installed CRD's schema and CEL rules; and each Event
posted as the controller posts it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from autoscaler.kube.operations import KubeClient, ObjectReference
from metricscale.kube.errors import KubeError
from metricscale.kube.http import open_kube_http
from testbed.install import Installation
from tests.autoscaler.simulation import API_VERSIONS
from tests.autoscaler.status_shapes import EXPECTED, INVALID_SPECS, every_status_shape

GROUP_VERSION = API_VERSIONS["Autoscaler"]
# Stands in for a spec the real server would refuse (what a schema change left behind).
VALID_SPEC = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
              "maxReplicas": 3}


async def test_each_status_and_event_the_controller_writes_is_accepted(
        installation: Installation, namespace: str) -> None:
    shapes = await every_status_shape()
    cluster = installation.cluster
    uids: dict[str, str] = {}
    for key, entry in shapes.caches.entries.items():
        spec = VALID_SPEC if key.name in INVALID_SPECS else dict(entry.raw["spec"])
        created = cluster.request(
            "POST", f"/apis/{GROUP_VERSION}/namespaces/{namespace}/autoscalers",
            {"apiVersion": GROUP_VERSION, "kind": "Autoscaler",
             "metadata": {"name": key.name, "namespace": namespace}, "spec": spec})
        uids[key.name] = created["metadata"]["uid"]
    assert set(uids) >= set(EXPECTED)

    refused: list[tuple[str, str]] = []
    events: list[tuple[str, str, str]] = []
    async with open_kube_http(cluster.api_client_configuration(),
                              user_agent="metricscale-tests") as http:
        kube = KubeClient(http, registry=CollectorRegistry(),
                          reporting_instance="metricscale-tests")
        for _, name, status in shapes.kube.status_writes:
            # The installed controller reconciles these objects too: each write replaces
            # whatever the stored status is, so the object is exactly ours when validated.
            stored = cluster.get(f"/apis/{GROUP_VERSION}/namespaces/{namespace}/"
                                 f"autoscalers/{name}")
            try:
                await kube.write_autoscaler_status(namespace=namespace, name=name,
                                                   status=status,
                                                   previous=stored.get("status"))
            except KubeError as error:
                refused.append((name, error.describe()))
        for event in shapes.kube.events:
            assert event.time is not None
            regarding = ObjectReference(api_version=GROUP_VERSION, kind="Autoscaler",
                                        namespace=namespace, name=event.name,
                                        uid=uids[event.name])
            accepted = await kube.create_event(regarding=regarding,
                                               event_type=event.type,  # type: ignore[arg-type]
                                               reason=event.reason, note=event.note,
                                               now=event.time)
            if not accepted:
                events.append((event.name, event.reason, event.note))
    assert len(shapes.kube.status_writes) > len(EXPECTED)
    assert refused == []
    assert events == []
    reasons = {event.reason for event in shapes.kube.events}
    assert {"SuccessfulRescale", "FailedGetScale", "FallbackActive", "ExternalScaleChange",
            "Paused", "DryRunRescale"} <= reasons

