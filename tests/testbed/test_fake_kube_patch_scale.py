"""Fake kube-apiserver: PATCH formats (merge, JSON, strategic vs 415 for CRs) and the scale
subresource of workloads and CRDs."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.kube_http import KubeHTTPClient

DEPLOYMENT = "/apis/apps/v1/namespaces/demo/deployments/web"
HPA = "/apis/autoscaling/v2/namespaces/demo/horizontalpodautoscalers/web"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
WIDGETS = "/apis/example.com/v1/namespaces/demo/widgets"

WIDGET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {"type": "object", "properties": {
            "replicas": {"type": "integer", "minimum": 0},
            "mode": {"type": "string", "enum": ["fast", "slow"], "default": "fast"}}},
        "status": {"type": "object", "properties": {
            "replicas": {"type": "integer"}, "selector": {"type": "string"},
            "conditions": {"type": "array", "items": {
                "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}},
    },
}


@pytest.fixture
def widgets(fake_kube: FakeKubeAPI) -> None:
    fake_kube.create_crd(group="example.com", kind="Widget", plural="widgets",
                         schema=WIDGET_SCHEMA,
                         scale={"specReplicasPath": ".spec.replicas",
                                "statusReplicasPath": ".status.replicas",
                                "labelSelectorPath": ".status.selector"})


def _containers(reply: Any) -> list[dict[str, Any]]:
    return reply.json["spec"]["template"]["spec"]["containers"]  # type: ignore[no-any-return]


async def test_merge_patch_replaces_lists_and_deletes_with_null(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    fake_kube.create_deployment("web", namespace="demo", labels={"app": "web", "x": "1"})
    reply = await kube_http.patch(DEPLOYMENT, {"metadata": {"labels": {"x": None}},
                                               "spec": {"replicas": 4}}, content_type=MERGE)
    assert reply.status == 200
    assert reply.json["metadata"]["labels"] == {"app": "web"}
    assert reply.json["spec"]["replicas"] == 4


async def test_json_patch_operations_and_failed_test(fake_kube: FakeKubeAPI,
                                                     kube_http: KubeHTTPClient) -> None:
    fake_kube.create_deployment("web", namespace="demo", replicas=2)
    ok = await kube_http.patch(DEPLOYMENT, [
        {"op": "test", "path": "/spec/replicas", "value": 2},
        {"op": "replace", "path": "/spec/replicas", "value": 3},
        {"op": "add", "path": "/metadata/annotations", "value": {"a/b": "c"}},
    ], content_type=JSON_PATCH)
    assert ok.status == 200
    assert ok.json["spec"]["replicas"] == 3
    assert ok.json["metadata"]["annotations"] == {"a/b": "c"}
    failed = await kube_http.patch(DEPLOYMENT, [{"op": "test", "path": "/spec/replicas",
                                                 "value": 2}], content_type=JSON_PATCH)
    assert failed.status == 422 and failed.json["reason"] == "Invalid"


async def test_strategic_merge_merges_containers_by_name(fake_kube: FakeKubeAPI,
                                                         kube_http: KubeHTTPClient) -> None:
    fake_kube.create_deployment("web", namespace="demo")
    reply = await kube_http.patch(DEPLOYMENT, {"spec": {"template": {"spec": {"containers": [
        {"name": "sidecar", "image": "busybox"},
        {"name": "app", "image": "nginx:2"}]}}}}, content_type=STRATEGIC)
    assert reply.status == 200, reply.text
    containers = _containers(reply)
    assert [c["name"] for c in containers] == ["app", "sidecar"]
    assert containers[0]["image"] == "nginx:2"
    assert containers[0]["resources"] == {"requests": {"cpu": "100m"}}  # kept from before


async def test_merge_patch_of_containers_replaces_the_list(fake_kube: FakeKubeAPI,
                                                           kube_http: KubeHTTPClient) -> None:
    fake_kube.create_deployment("web", namespace="demo")
    reply = await kube_http.patch(DEPLOYMENT, {"spec": {"template": {"spec": {"containers": [
        {"name": "app", "image": "nginx:2"}]}}}}, content_type=MERGE)
    assert _containers(reply)[0].get("resources") == {}  # the old requests are gone


async def test_strategic_merge_merges_hpa_conditions_by_type(kube_http: KubeHTTPClient) -> None:
    await kube_http.post("/apis/autoscaling/v2/namespaces/demo/horizontalpodautoscalers", {
        "metadata": {"name": "web"}, "spec": {"scaleTargetRef": {
            "apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}, "maxReplicas": 5}})
    conditions = [
        {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    first = await kube_http.patch(f"{HPA}/status", {"status": {
        "desiredReplicas": 2, "currentReplicas": 2, "conditions": conditions}},
        content_type=STRATEGIC)
    assert first.status == 200, first.text
    second = await kube_http.patch(f"{HPA}/status", {"status": {"conditions": [
        {"type": "ScalingActive", "status": "False", "reason": "FailedGetPodsMetric",
         "lastTransitionTime": "2026-01-01T00:01:00.5+01:00"}]}}, content_type=STRATEGIC)
    merged = second.json["status"]["conditions"]
    assert [c["type"] for c in merged] == ["AbleToScale", "ScalingActive"]
    assert merged[1]["status"] == "False"
    assert merged[1]["lastTransitionTime"] == "2025-12-31T23:01:00Z"  # metav1.Time on the wire
    assert second.json["status"]["desiredReplicas"] == 2


async def test_strategic_merge_on_a_custom_resource_is_415(widgets: None,
                                                           kube_http: KubeHTTPClient) -> None:
    await kube_http.post(WIDGETS, {"apiVersion": "example.com/v1", "kind": "Widget",
                                   "metadata": {"name": "w"}, "spec": {"replicas": 1}})
    reply = await kube_http.patch(f"{WIDGETS}/w", {"spec": {"replicas": 2}},
                                  content_type=STRATEGIC)
    assert reply.status == 415
    assert reply.json["reason"] == "UnsupportedMediaType"
    assert reply.json["message"] == (
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml")
    merged = await kube_http.patch(f"{WIDGETS}/w", {"spec": {"replicas": 2}}, content_type=MERGE)
    assert merged.json["spec"] == {"replicas": 2, "mode": "fast"}


async def test_custom_resources_are_pruned_defaulted_and_validated(
        widgets: None, kube_http: KubeHTTPClient) -> None:
    created = await kube_http.post(WIDGETS, {
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
        "spec": {"replicas": 1, "colour": "red"}, "status": {"replicas": 3}})
    assert created.status == 201
    assert created.json["spec"] == {"replicas": 1, "mode": "fast"}
    assert "status" not in created.json  # create cannot set status with a status subresource
    invalid = await kube_http.post(WIDGETS, {
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "v"},
        "spec": {"replicas": -1, "mode": "medium"}})
    assert invalid.status == 422
    assert sorted(c["field"] for c in invalid.json["details"]["causes"]) == [
        "spec.mode", "spec.replicas"]
    assert invalid.json["message"].startswith('Widget.example.com "v" is invalid: [')


async def test_custom_resource_generation_ignores_status(widgets: None,
                                                         kube_http: KubeHTTPClient) -> None:
    await kube_http.post(WIDGETS, {"apiVersion": "example.com/v1", "kind": "Widget",
                                   "metadata": {"name": "w"}, "spec": {"replicas": 1}})
    status = await kube_http.patch(f"{WIDGETS}/w/status", {"status": {"replicas": 1}},
                                   content_type=MERGE)
    assert status.json["metadata"]["generation"] == 1
    spec = await kube_http.patch(f"{WIDGETS}/w", {"spec": {"replicas": 2}}, content_type=MERGE)
    assert spec.json["metadata"]["generation"] == 2


async def test_unknown_patch_content_type_is_415(fake_kube: FakeKubeAPI,
                                                 kube_http: KubeHTTPClient) -> None:
    fake_kube.create_deployment("web", namespace="demo")
    reply = await kube_http.patch(DEPLOYMENT, {}, content_type="application/json")
    assert reply.status == 415


# --- scale --------------------------------------------------------------------------------------


async def test_deployment_scale_reads_replicas_and_string_selector(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    created = fake_kube.create_deployment("web", namespace="demo", replicas=3,
                                          labels={"app": "web", "tier": "front"},
                                          status_replicas=2)
    scale = (await kube_http.get(f"{DEPLOYMENT}/scale")).json
    assert scale["apiVersion"] == "autoscaling/v1" and scale["kind"] == "Scale"
    assert scale["spec"] == {"replicas": 3}
    assert scale["status"] == {"replicas": 2, "selector": "app=web,tier=front"}
    assert scale["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert scale["metadata"]["uid"] == created["metadata"]["uid"]


async def test_scale_selector_from_match_expressions(kube_http: KubeHTTPClient) -> None:
    await kube_http.post("/apis/apps/v1/namespaces/demo/statefulsets", {
        "metadata": {"name": "db"}, "spec": {
            "serviceName": "db", "replicas": 1,
            "selector": {"matchLabels": {"app": "db"}, "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["b", "a"]},
                {"key": "canary", "operator": "DoesNotExist"}]},
            "template": {"metadata": {"labels": {"app": "db", "tier": "a"}},
                         "spec": {"containers": [{"name": "db", "image": "x"}]}}}})
    scale = (await kube_http.get("/apis/apps/v1/namespaces/demo/statefulsets/db/scale")).json
    assert scale["status"]["selector"] == "app=db,!canary,tier in (a,b)"  # sorted by key


async def test_scale_update_changes_spec_and_stale_version_conflicts(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    fake_kube.create_deployment("web", namespace="demo", replicas=2)
    scale = (await kube_http.get(f"{DEPLOYMENT}/scale")).json
    scale["spec"]["replicas"] = 5
    updated = await kube_http.put(f"{DEPLOYMENT}/scale", scale)
    assert updated.status == 200 and updated.json["spec"]["replicas"] == 5
    deployment = (await kube_http.get(DEPLOYMENT)).json
    assert deployment["spec"]["replicas"] == 5 and deployment["metadata"]["generation"] == 2
    scale["spec"]["replicas"] = 6  # stale resourceVersion
    conflict = await kube_http.put(f"{DEPLOYMENT}/scale", scale)
    assert conflict.status == 409
    assert conflict.json["message"].startswith(
        'Operation cannot be fulfilled on deployments.apps "web": the object has been modified')


async def test_negative_scale_is_invalid(fake_kube: FakeKubeAPI,
                                         kube_http: KubeHTTPClient) -> None:
    fake_kube.create_deployment("web", namespace="demo")
    reply = await kube_http.patch(f"{DEPLOYMENT}/scale", {"spec": {"replicas": -1}},
                                  content_type=MERGE)
    assert reply.status == 422
    assert reply.json["message"] == ('Scale.autoscaling "web" is invalid: spec.replicas: '
                                     "Invalid value: -1: must be greater than or equal to 0")


async def test_scale_of_a_missing_deployment_is_not_found(kube_http: KubeHTTPClient) -> None:
    reply = await kube_http.get("/apis/apps/v1/namespaces/demo/deployments/none/scale")
    assert reply.status == 404
    assert reply.json["message"] == 'deployments.apps "none" not found'


async def test_crd_scale_uses_the_declared_paths(widgets: None,
                                                 kube_http: KubeHTTPClient) -> None:
    await kube_http.post(WIDGETS, {"apiVersion": "example.com/v1", "kind": "Widget",
                                   "metadata": {"name": "w"}, "spec": {"replicas": 1}})
    await kube_http.patch(f"{WIDGETS}/w/status", {"status": {"replicas": 1,
                                                             "selector": "app=w"}},
                          content_type=MERGE)
    scale = (await kube_http.get(f"{WIDGETS}/w/scale")).json
    assert scale["spec"] == {"replicas": 1}
    assert scale["status"] == {"replicas": 1, "selector": "app=w"}
    patched = await kube_http.patch(f"{WIDGETS}/w/scale", {"spec": {"replicas": 4}},
                                    content_type=MERGE)
    assert patched.json["spec"]["replicas"] == 4
    assert (await kube_http.get(f"{WIDGETS}/w")).json["spec"]["replicas"] == 4
    strategic = await kube_http.patch(f"{WIDGETS}/w/scale", {"spec": {"replicas": 5}},
                                      content_type=STRATEGIC)
    assert strategic.status == 415
