"""kube.py against the fake API server: scale targets, scale updates, retries, status, events."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.kube.operations import KubeClient, ObjectReference, ScaleTargetRef, TargetNotFound
from metricscale.kube import errors
from metricscale.kube.http import open_kube_http
from metricscale.kube.retry import RetryPolicy
from testbed.fakes.kube_api import DropConnection, FakeKubeAPI, ServerError, TooManyRequests

NOW = datetime(2024, 5, 1, 12, 0, 21, tzinfo=UTC)
MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
WIDGET_SCALE = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector"}


class Sleeps:
    """An injected sleep: records the delays, never waits."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def kube(fake_kube: FakeKubeAPI, sleeps: Sleeps,
               registry: CollectorRegistry) -> AsyncIterator[KubeClient]:
    async with open_kube_http(fake_kube.api_client_configuration()) as http:
        yield KubeClient(http, registry=registry, reporting_instance="autoscaler-0",
                         sleep=sleeps, jitter=lambda: 0.0)


def requests(fake_kube: FakeKubeAPI, pattern: str) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in fake_kube.requests_to(pattern)]


# --- resolving scaleTargetRef ------------------------------------------------------------------


@pytest.mark.parametrize(("api_version", "kind", "resource"), [
    ("apps/v1", "Deployment", "deployments"),
    ("apps/v1", "StatefulSet", "statefulsets"),
    ("apps/v1", "ReplicaSet", "replicasets"),
    ("apps/v1beta2", "Deployment", "deployments"),  # only the group counts, as upstream
])
async def test_builtin_workloads_resolve_to_their_scale_subresource(
        kube: KubeClient, api_version: str, kind: str, resource: str) -> None:
    mapping = await kube.resolve_scale_target(ScaleTargetRef(api_version, kind, "web"))
    assert (mapping.group, mapping.version, mapping.resource) == ("apps", "v1", resource)
    assert mapping.namespaced and mapping.has_scale


async def test_crd_with_scale_resolves(fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    fake_kube.create_crd(group="example.com", kind="Widget", plural="widgets",
                         scale=WIDGET_SCALE)
    mapping = await kube.resolve_scale_target(ScaleTargetRef("example.com/v1", "Widget", "w"))
    assert mapping.group_resource == "widgets.example.com"


async def test_crd_without_scale_is_no_scale_subresource_with_upstreams_text(
        fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    fake_kube.create_crd(group="example.com", kind="Gadget", plural="gadgets")
    with pytest.raises(errors.NoScaleSubresource) as caught:
        await kube.resolve_scale_target(ScaleTargetRef("example.com/v1", "Gadget", "g"))
    assert str(caught.value) == ("could not find scale subresource for example.com/v1, "
                                 "Resource=gadgets in discovery information")


@pytest.mark.parametrize(("api_version", "kind", "message"), [
    ("apps/v1", "Deploymnet", 'no matches for kind "Deploymnet" in group "apps"'),
    ("nothing.example/v1", "Thing", 'no matches for kind "Thing" in group "nothing.example"'),
])
async def test_unknown_kind_is_kind_not_found_with_upstreams_text(
        kube: KubeClient, api_version: str, kind: str, message: str) -> None:
    with pytest.raises(errors.KindNotFound) as caught:
        await kube.resolve_scale_target(ScaleTargetRef(api_version, kind, "x"))
    assert str(caught.value) == message


async def test_discovery_is_cached_and_refreshed_on_a_miss(
        fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "StatefulSet", "db"))
    assert len(requests(fake_kube, r"^/apis$")) == 1
    # A CRD installed after the first lookup is found by refreshing on the miss.
    fake_kube.create_crd(group="example.com", kind="Widget", plural="widgets",
                         scale=WIDGET_SCALE)
    await kube.resolve_scale_target(ScaleTargetRef("example.com/v1", "Widget", "w"))
    assert len(requests(fake_kube, r"^/apis$")) == 2


async def test_concurrent_resolutions_share_one_discovery_fetch(
        fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    refs = [ScaleTargetRef("apps/v1", kind, "x")
            for kind in ("Deployment", "StatefulSet", "ReplicaSet") * 3]
    await asyncio.gather(*(kube.resolve_scale_target(ref) for ref in refs))
    assert len(requests(fake_kube, r"^/apis$")) == 1
    assert len(requests(fake_kube, r"^/apis/apps/v1$")) == 1


async def test_discovery_expires_after_its_ttl(fake_kube: FakeKubeAPI) -> None:
    now = [0.0]
    async with open_kube_http(fake_kube.api_client_configuration()) as http:
        kube = KubeClient(http, registry=CollectorRegistry(), reporting_instance="a",
                          discovery_ttl=30.0, monotonic=lambda: now[0])
        ref = ScaleTargetRef("apps/v1", "Deployment", "web")
        await kube.resolve_scale_target(ref)
        now[0] = 29.0
        await kube.resolve_scale_target(ref)
        assert len(requests(fake_kube, r"^/apis$")) == 1
        now[0] = 30.0
        await kube.resolve_scale_target(ref)
        assert len(requests(fake_kube, r"^/apis$")) == 2


# --- scale ---------------------------------------------------------------------------------


async def test_get_scale_reads_replicas_selector_and_resource_version(
        fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    stored = fake_kube.create_deployment("web", namespace="shop", replicas=3, status_replicas=2,
                                         labels={"app": "web", "tier": "front"})
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    scale = await kube.get_scale(target, namespace="shop", name="web")
    assert (scale.spec_replicas, scale.status_replicas, scale.selector) == (3, 2,
                                                                            "app=web,tier=front")
    assert scale.resource_version == stored["metadata"]["resourceVersion"]
    assert requests(fake_kube, "/scale$") == [
        ("GET", "/apis/apps/v1/namespaces/shop/deployments/web/scale")]
    assert kube.request_count == len(fake_kube.requests)


async def test_scale_of_a_missing_target_is_target_not_found(kube: KubeClient) -> None:
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "gone"))
    with pytest.raises(TargetNotFound) as caught:
        await kube.get_scale(target, namespace="shop", name="gone")
    assert str(caught.value) == 'deployments.apps "gone" not found'


async def test_crd_scale_reads_and_writes_through_its_paths(
        fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    fake_kube.create_crd(group="example.com", kind="Widget", plural="widgets",
                         scale=WIDGET_SCALE)
    fake_kube.create("example.com", "v1", "widgets", {
        "metadata": {"name": "w", "namespace": "shop"}, "spec": {"replicas": 2},
        "status": {"replicas": 2, "selector": "app=w"}})
    target = await kube.resolve_scale_target(ScaleTargetRef("example.com/v1", "Widget", "w"))
    scale = await kube.get_scale(target, namespace="shop", name="w")
    assert (scale.spec_replicas, scale.selector) == (2, "app=w")
    updated = await kube.update_scale(target, namespace="shop", name="w", scale=scale,
                                      replicas=5)
    assert updated.spec_replicas == 5
    stored = fake_kube.store.try_get("example.com", "v1", "widgets", "w", namespace="shop")
    assert stored is not None and stored["spec"]["replicas"] == 5


async def test_update_scale_puts_with_the_read_resource_version(
        fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    fake_kube.create_deployment("web", namespace="shop", replicas=3)
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    scale = await kube.get_scale(target, namespace="shop", name="web")
    updated = await kube.update_scale(target, namespace="shop", name="web", scale=scale,
                                      replicas=6)
    assert updated.spec_replicas == 6
    assert updated.resource_version != scale.resource_version
    assert [r.method for r in fake_kube.requests_to("/scale$")] == ["GET", "PUT"]
    stored = fake_kube.store.try_get("apps", "v1", "deployments", "web", namespace="shop")
    assert stored is not None and stored["spec"]["replicas"] == 6


async def test_conflict_rereads_the_scale_and_succeeds(
        fake_kube: FakeKubeAPI, kube: KubeClient, sleeps: Sleeps) -> None:
    fake_kube.create_deployment("web", namespace="shop", replicas=3)
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    stale = await kube.get_scale(target, namespace="shop", name="web")
    # Someone else writes the deployment: our resourceVersion is now stale.
    fake_kube.store.mutate("apps", "v1", "deployments", "web", namespace="shop",
                           change=lambda obj: obj["metadata"].setdefault("labels", {}).update(
                               {"touched": "yes"}))
    updated = await kube.update_scale(target, namespace="shop", name="web", scale=stale,
                                      replicas=4)
    assert updated.spec_replicas == 4
    assert [r.method for r in fake_kube.requests_to("/scale$")] == ["GET", "PUT", "GET", "PUT"]
    assert sleeps.delays == [pytest.approx(0.010)]


async def test_persistent_conflicts_give_up_after_five_tries(
        fake_kube: FakeKubeAPI, kube: KubeClient, sleeps: Sleeps) -> None:
    fake_kube.create_deployment("web", namespace="shop", replicas=3)
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    scale = await kube.get_scale(target, namespace="shop", name="web")
    fake_kube.add_fault("/scale$", ServerError(code=409, message="the object has been modified"),
                        method="PUT", times=None)
    with pytest.raises(errors.Conflict, match="the object has been modified"):
        await kube.update_scale(target, namespace="shop", name="web", scale=scale, replicas=4)
    assert [r.method for r in fake_kube.requests_to("/scale$")] == ["GET"] + ["PUT", "GET"] * 5
    assert len(sleeps.delays) == 4
    assert all(0.010 <= d <= 0.011 for d in sleeps.delays)


async def test_non_conflict_update_error_is_not_retried_as_a_conflict(
        fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    fake_kube.create_deployment("web", namespace="shop", replicas=3)
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    scale = await kube.get_scale(target, namespace="shop", name="web")
    with pytest.raises(errors.Invalid):
        await kube.update_scale(target, namespace="shop", name="web", scale=scale, replicas=-1)
    assert [r.method for r in fake_kube.requests_to("/scale$")] == ["GET", "PUT", "GET"]


# --- transient failures -------------------------------------------------------------------------


async def test_429_is_retried_after_exactly_retry_after(
        fake_kube: FakeKubeAPI, kube: KubeClient, sleeps: Sleeps,
        registry: CollectorRegistry) -> None:
    fake_kube.create_deployment("web", namespace="shop", replicas=3)
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    fake_kube.add_fault("/scale$", TooManyRequests(retry_after=2))
    scale = await kube.get_scale(target, namespace="shop", name="web")
    assert scale.spec_replicas == 3
    assert sleeps.delays == [2.0]
    labels = {"operation": "get_scale", "verb": "GET", "resource": "deployments.apps/scale"}
    assert registry.get_sample_value("metricscale_autoscaler_api_request_duration_seconds_count",
                                     {**labels, "code": "429"}) == 1
    assert registry.get_sample_value("metricscale_autoscaler_api_request_duration_seconds_count",
                                     {**labels, "code": "200"}) == 1


async def test_server_errors_back_off_then_surface(
        fake_kube: FakeKubeAPI, sleeps: Sleeps) -> None:
    fake_kube.create_deployment("web", namespace="shop", replicas=3)
    async with open_kube_http(fake_kube.api_client_configuration()) as http:
        kube = KubeClient(http, registry=CollectorRegistry(), reporting_instance="a",
                          retry=RetryPolicy(attempts=3, initial=0.1, cap=1.0), sleep=sleeps,
                          jitter=lambda: 1.0)
        target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
        fake_kube.add_fault("/scale$", ServerError(code=500), times=None)
        with pytest.raises(errors.ServerError, match="Internal error occurred: injected fault"):
            await kube.get_scale(target, namespace="shop", name="web")
    assert sleeps.delays == [pytest.approx(0.1), pytest.approx(0.2)]
    assert len(fake_kube.requests_to("/scale$")) == 3


async def test_dropped_connection_is_retried(fake_kube: FakeKubeAPI, kube: KubeClient,
                                             sleeps: Sleeps) -> None:
    fake_kube.create_deployment("web", namespace="shop", replicas=3)
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    # Two drops: aiohttp itself retries an idempotent request once on a reused connection.
    fake_kube.add_fault("/scale$", DropConnection(), times=2)
    scale = await kube.get_scale(target, namespace="shop", name="web")
    assert scale.spec_replicas == 3
    assert sleeps.delays


async def test_forbidden_is_not_retried(fake_kube: FakeKubeAPI, sleeps: Sleeps) -> None:
    fake_kube.add_user(token="autoscaler-token", username="system:serviceaccount:ops:autoscaler")
    fake_kube.authorizer = lambda attributes: (attributes.subresource != "scale", "")
    configuration = fake_kube.api_client_configuration(token="autoscaler-token")
    async with open_kube_http(configuration) as http:
        kube = KubeClient(http, registry=CollectorRegistry(), reporting_instance="a",
                          sleep=sleeps)
        target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
        with pytest.raises(errors.Forbidden) as caught:
            await kube.get_scale(target, namespace="shop", name="web")
    assert str(caught.value).startswith('deployments.apps "web" is forbidden: User '
                                        '"system:serviceaccount:ops:autoscaler" cannot get '
                                        'resource "deployments/scale"')
    assert sleeps.delays == []


# --- status ----------------------------------------------------------------------------------


def autoscaler_crd(fake_kube: FakeKubeAPI) -> None:
    fake_kube.create_crd(group="metricscale.dev", kind="Autoscaler", plural="autoscalers",
                         versions=("v1alpha1",), status_subresource=True)


async def test_autoscaler_status_is_replaced_through_the_status_subresource(
        fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    autoscaler_crd(fake_kube)
    old_status = {"currentReplicas": 3, "desiredReplicas": 3,
                  "lastScaleTime": "2024-05-01T11:00:00Z",
                  "conditions": [{"type": "AbleToScale", "status": "True"}]}
    created = fake_kube.create("metricscale.dev", "v1alpha1", "autoscalers", {
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"maxReplicas": 10}, "status": old_status})
    new_status = {"currentReplicas": 3, "desiredReplicas": 5,
                  "conditions": [{"type": "AbleToScale", "status": "False"}]}
    written = await kube.write_autoscaler_status(namespace="shop", name="web", status=new_status,
                                                 previous=created["status"])
    assert written["status"] == new_status
    assert written["spec"] == {"maxReplicas": 10}
    [patch] = fake_kube.requests_to("/autoscalers/web/status$", method="PATCH")
    assert patch.path == "/apis/metricscale.dev/v1alpha1/namespaces/shop/autoscalers/web/status"
    assert patch.header("Content-Type") == "application/merge-patch+json"


async def test_status_write_with_a_stale_resource_version_is_a_conflict(
        fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    autoscaler_crd(fake_kube)
    created = fake_kube.create("metricscale.dev", "v1alpha1", "autoscalers", {
        "metadata": {"name": "web", "namespace": "shop"}, "spec": {"maxReplicas": 10}})
    await kube.write_autoscaler_status(namespace="shop", name="web",
                                       status={"desiredReplicas": 1}, previous={},
                                       resource_version=created["metadata"]["resourceVersion"])
    with pytest.raises(errors.Conflict):
        await kube.write_autoscaler_status(
            namespace="shop", name="web", status={"desiredReplicas": 2}, previous={},
            resource_version=created["metadata"]["resourceVersion"])


def hpa(name: str, namespace: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": name},
                     "minReplicas": 1, "maxReplicas": 10,
                     "metrics": [{"type": "Resource", "resource": {
                         "name": "cpu", "target": {"type": "Utilization",
                                                   "averageUtilization": 80}}}]},
            "status": {"currentReplicas": 2, "desiredReplicas": 2,
                       "lastScaleTime": "2024-05-01T11:00:00Z"}}


async def test_hpa_status_is_replaced_through_the_status_subresource(
        fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    created = fake_kube.create("autoscaling", "v2", "horizontalpodautoscalers", hpa("web", "shop"))
    new_status = {"currentReplicas": 2, "desiredReplicas": 4,
                  "conditions": [{"type": "AbleToScale", "status": "True",
                                  "reason": "SucceededRescale",
                                  "message": "the HPA controller was able to update the target "
                                             "scale to 4",
                                  "lastTransitionTime": "2024-05-01T12:00:21Z"}]}
    written = await kube.write_hpa_status(namespace="shop", name="web", status=new_status,
                                          previous=created["status"])
    assert written["status"] == new_status
    assert fake_kube.requests_to("horizontalpodautoscalers/web/status$", method="PATCH")


async def test_hpa_annotations_are_merge_patched_leaving_the_others_and_the_spec(
        fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    body = hpa("web", "shop")
    body["metadata"]["annotations"] = {"team": "shop", "stale": "x"}
    created = fake_kube.create("autoscaling", "v2", "horizontalpodautoscalers", body)
    patched = await kube.patch_hpa_annotations(
        namespace="shop", name="web",
        annotations={"metricscale.dev/history": '{"recommendations":[]}', "stale": None})
    assert patched["metadata"]["annotations"] == {
        "team": "shop", "metricscale.dev/history": '{"recommendations":[]}'}
    stored = fake_kube.store.get("autoscaling", "v2", "horizontalpodautoscalers", "web",
                                 namespace="shop")
    assert stored["metadata"]["annotations"] == patched["metadata"]["annotations"]
    assert stored["spec"] == created["spec"] and stored["status"] == created["status"]
    (request,) = fake_kube.requests_to("horizontalpodautoscalers/web$", method="PATCH")
    assert dict(request.headers)["Content-Type"] == "application/merge-patch+json"


async def test_hpa_annotations_of_a_missing_hpa_are_not_found(kube: KubeClient) -> None:
    with pytest.raises(errors.NotFound):
        await kube.patch_hpa_annotations(namespace="shop", name="gone", annotations={"a": "b"})


# --- events ----------------------------------------------------------------------------------


async def test_event_is_stored_with_six_digit_micro_time(fake_kube: FakeKubeAPI,
                                                        kube: KubeClient) -> None:
    regarding = ObjectReference(api_version="metricscale.dev/v1alpha1", kind="Autoscaler",
                                namespace="shop", name="web", uid="uid-1")
    accepted = await kube.create_event(regarding=regarding, event_type="Normal",
                                       reason="SuccessfulRescale",
                                       note="New size: 4; reason: pods metric qps above target",
                                       now=NOW)
    assert accepted
    [event] = fake_kube.store.list("events.k8s.io", "v1", "events", namespace="shop")
    assert event["eventTime"] == "2024-05-01T12:00:21.000000Z"
    assert MICRO.match(event["eventTime"])
    assert event["reportingController"] == "metricscale.dev/autoscaler"
    assert event["reportingInstance"] == "autoscaler-0"
    assert (event["reason"], event["type"], event["action"]) == ("SuccessfulRescale", "Normal",
                                                                 "Scale")
    assert event["note"] == "New size: 4; reason: pods metric qps above target"
    assert event["regarding"]["name"] == "web" and event["regarding"]["uid"] == "uid-1"


async def test_failed_event_is_swallowed_and_not_retried(fake_kube: FakeKubeAPI,
                                                         kube: KubeClient,
                                                         sleeps: Sleeps) -> None:
    fake_kube.add_fault("/events$", ServerError(code=503), times=None)
    regarding = ObjectReference(api_version="metricscale.dev/v1alpha1", kind="Autoscaler",
                                namespace="shop", name="web")
    assert await kube.create_event(regarding=regarding, event_type="Warning",
                                   reason="FailedGetScale", note="x", now=NOW) is False
    assert len(fake_kube.requests_to("/events$", method="POST")) == 1
    assert sleeps.delays == []


async def test_events_of_one_reconcile_share_its_time_and_all_are_stored(
        fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    regarding = ObjectReference(api_version="metricscale.dev/v1alpha1", kind="Autoscaler",
                                namespace="shop", name="web", uid="uid-1")
    for reason in ("FailedGetPodsMetric", "FailedComputeMetricsReplicas", "FailedUpdateStatus"):
        assert await kube.create_event(regarding=regarding, event_type="Warning", reason=reason,
                                       note="x", now=NOW)
    events = fake_kube.store.list("events.k8s.io", "v1", "events", namespace="shop")
    assert sorted(e["reason"] for e in events) == [
        "FailedComputeMetricsReplicas", "FailedGetPodsMetric", "FailedUpdateStatus"]
    assert {e["eventTime"] for e in events} == {"2024-05-01T12:00:21.000000Z"}
    nanos = int(NOW.timestamp()) * 10**9
    assert sorted(e["metadata"]["name"] for e in events) == [
        f"web.{nanos + i:x}" for i in range(3)]  # client-go's scheme, made unique


async def test_an_event_name_taken_by_another_process_falls_back_to_a_generated_one(
        fake_kube: FakeKubeAPI, kube: KubeClient) -> None:
    nanos = int(NOW.timestamp()) * 10**9
    fake_kube.create("events.k8s.io", "v1", "events", {
        "metadata": {"name": f"web.{nanos:x}", "namespace": "shop"},
        "eventTime": "2024-05-01T12:00:21.000000Z", "reportingController": "other",
        "reportingInstance": "old-replica", "action": "Scale", "reason": "SuccessfulRescale",
        "type": "Normal", "regarding": {"kind": "Autoscaler", "name": "web",
                                        "namespace": "shop"}})
    regarding = ObjectReference(api_version="metricscale.dev/v1alpha1", kind="Autoscaler",
                                namespace="shop", name="web")
    assert await kube.create_event(regarding=regarding, event_type="Normal",
                                   reason="SuccessfulRescale", note="x", now=NOW)
    names = sorted(e["metadata"]["name"] for e in fake_kube.store.list(
        "events.k8s.io", "v1", "events", namespace="shop"))
    assert len(names) == 2 and names[0] != names[1]
    assert all(name.startswith("web.") for name in names)
