"""Fake kube-apiserver: discovery, TokenReview/SubjectAccessReview, the authentication
ConfigMap and front-proxy CA rotation, request recording, fault injection."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from metricscale import pki
from testbed.fakes.kube_api import (
    DropConnection,
    FakeKubeAPI,
    Latency,
    ServerError,
    StallWatch,
    TooManyRequests,
)
from testbed.fakes.kube_http import KubeHTTPClient

AUTH_CONFIGMAP = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"


# --- discovery -----------------------------------------------------------------------------------


async def test_core_discovery(kube_http: KubeHTTPClient) -> None:
    api = (await kube_http.get("/api")).json
    assert api["kind"] == "APIVersions" and api["versions"] == ["v1"]
    core = (await kube_http.get("/api/v1")).json
    by_name = {r["name"]: r for r in core["resources"]}
    assert {"pods", "pods/status", "namespaces", "nodes", "services", "configmaps", "secrets",
            "events", "endpoints", "serviceaccounts"} <= set(by_name)
    assert by_name["pods"]["shortNames"] == ["po"] and by_name["pods"]["namespaced"] is True
    assert by_name["nodes"]["namespaced"] is False


async def test_group_discovery_lists_builtins_in_priority_order(
        kube_http: KubeHTTPClient) -> None:
    groups = (await kube_http.get("/apis")).json["groups"]
    names = [g["name"] for g in groups]
    assert names[:3] == ["apiregistration.k8s.io", "apps", "events.k8s.io"]
    for group in ("autoscaling", "coordination.k8s.io", "apiextensions.k8s.io",
                  "authentication.k8s.io", "authorization.k8s.io"):
        assert group in names
    autoscaling = next(g for g in groups if g["name"] == "autoscaling")
    assert [v["version"] for v in autoscaling["versions"]] == ["v2", "v1"]
    assert autoscaling["preferredVersion"]["version"] == "v2"
    assert (await kube_http.get("/apis/autoscaling")).json["kind"] == "APIGroup"


async def test_apps_discovery_lists_scale_and_status_subresources(
        kube_http: KubeHTTPClient) -> None:
    apps = (await kube_http.get("/apis/apps/v1")).json
    scale = next(r for r in apps["resources"] if r["name"] == "deployments/scale")
    assert scale == {"name": "deployments/scale", "singularName": "", "namespaced": True,
                     "group": "autoscaling", "version": "v1", "kind": "Scale",
                     "verbs": ["get", "patch", "update"]}
    names = {r["name"] for r in apps["resources"]}
    assert {"statefulsets/scale", "replicasets/scale", "deployments/status"} <= names


async def test_a_new_crd_is_served_and_discovered_at_once(fake_kube: FakeKubeAPI,
                                                          kube_http: KubeHTTPClient) -> None:
    fake_kube.create_crd(group="example.com", kind="Widget", plural="widgets", scope="Cluster",
                         versions=("v1", "v1beta1"), short_names=["wd"],
                         scale={"specReplicasPath": ".spec.replicas",
                                "statusReplicasPath": ".status.replicas"})
    resources = (await kube_http.get("/apis/example.com/v1")).json["resources"]
    assert [r["name"] for r in resources] == ["widgets", "widgets/status", "widgets/scale"]
    assert resources[0]["namespaced"] is False and resources[0]["shortNames"] == ["wd"]
    groups = (await kube_http.get("/apis")).json["groups"]
    example = next(g for g in groups if g["name"] == "example.com")
    assert example["preferredVersion"]["version"] == "v1"
    created = await kube_http.post("/apis/example.com/v1/widgets", {
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
    assert created.status == 201
    crd = (await kube_http.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                               "widgets.example.com")).json
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == \
        "True"


async def test_crd_created_over_http_is_served(kube_http: KubeHTTPClient) -> None:
    reply = await kube_http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", {
        "metadata": {"name": "gadgets.example.org"},
        "spec": {"group": "example.org", "scope": "Namespaced",
                 "names": {"plural": "gadgets", "kind": "Gadget"},
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object"}}}]}})
    assert reply.status == 201, reply.text
    listing = await kube_http.get("/apis/example.org/v1alpha1/namespaces/demo/gadgets")
    assert listing.json["kind"] == "GadgetList"
    bad = await kube_http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", {
        "metadata": {"name": "wrong.example.org"},
        "spec": {"group": "example.org", "scope": "Namespaced",
                 "names": {"plural": "things", "kind": "Thing"}, "versions": []}})
    assert bad.status == 422


async def test_aggregated_discovery_only_accept_gets_406(kube_http: KubeHTTPClient) -> None:
    reply = await kube_http.get("/apis", headers={
        "Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"})
    assert reply.status == 406 and reply.json["reason"] == "NotAcceptable"


async def test_kubectl_style_table_request(fake_kube: FakeKubeAPI,
                                           kube_http: KubeHTTPClient) -> None:
    fake_kube.create_pod("web-1", namespace="demo")
    reply = await kube_http.get("/api/v1/namespaces/demo/pods", headers={
        "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"})
    table = reply.json
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Ready", "Status",
                                                                "Restarts", "Age"]
    assert table["rows"][0]["cells"][:3] == ["web-1", "1/1", "Running"]


# --- reviews and the ConfigMap ------------------------------------------------------------------


async def test_token_review_authenticates_registered_tokens(fake_kube: FakeKubeAPI,
                                                            kube_http: KubeHTTPClient) -> None:
    fake_kube.add_user(token="t-alice", username="alice", groups=["dev"], uid="42",
                       extra={"scopes": ["a"]})
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": "t-alice"}}
    reply = await kube_http.post("/apis/authentication.k8s.io/v1/tokenreviews", body)
    assert reply.status == 201
    assert reply.json["status"] == {
        "authenticated": True, "audiences": ["https://kubernetes.default.svc.cluster.local"],
        "user": {"username": "alice", "uid": "42", "groups": ["dev", "system:authenticated"],
                 "extra": {"scopes": ["a"]}}}
    unknown = await kube_http.post("/apis/authentication.k8s.io/v1/tokenreviews",
                                   {"spec": {"token": "nope"}})
    assert unknown.json["status"] == {"user": {}}
    assert fake_kube.token_reviews == [body, {"spec": {"token": "nope"}}]


async def test_token_review_answers_can_be_scripted(fake_kube: FakeKubeAPI,
                                                    kube_http: KubeHTTPClient) -> None:
    fake_kube.token_review_answer = lambda body: {"authenticated": False,
                                                  "error": "token expired"}
    reply = await kube_http.post("/apis/authentication.k8s.io/v1/tokenreviews",
                                 {"spec": {"token": "x"}})
    assert reply.json["status"] == {"authenticated": False, "error": "token expired"}
    empty = await kube_http.post("/apis/authentication.k8s.io/v1/tokenreviews", {"spec": {}})
    assert empty.status == 400


async def test_subject_access_reviews_are_recorded_and_answered(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    body = {"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": {"resourceAttributes": {"namespace": "shop", "verb": "get",
                                            "group": "custom.metrics.k8s.io",
                                            "version": "v1beta2", "resource": "pods",
                                            "subresource": "http_requests", "name": "*"},
                     "user": "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
                     "groups": ["system:serviceaccounts", "system:authenticated"]},
            "status": {"allowed": False}}
    path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    allowed = await kube_http.post(path, body)
    assert allowed.status == 201 and allowed.json["status"] == {"allowed": True}
    fake_kube.authorizer = lambda a: (a.user.user != "bob", "no RBAC rule")
    denied = await kube_http.post(path, {"spec": {"user": "bob", "nonResourceAttributes": {
        "path": "/apis", "verb": "get"}}})
    assert denied.json["status"] == {"allowed": False, "reason": "no RBAC rule"}
    fake_kube.subject_access_review_answer = lambda b: {"allowed": False, "denied": True}
    scripted = await kube_http.post(path, body)
    assert scripted.json["status"] == {"allowed": False, "denied": True}
    assert fake_kube.subject_access_reviews[0] == body and len(
        fake_kube.subject_access_reviews) == 3
    invalid = await kube_http.post(path, {"spec": {"resourceAttributes": {"verb": "get"}}})
    assert invalid.status == 422
    assert invalid.json["details"]["causes"][0]["field"] == "spec.user"


async def test_reviews_only_accept_create(kube_http: KubeHTTPClient) -> None:
    reply = await kube_http.get("/apis/authorization.k8s.io/v1/subjectaccessreviews")
    assert reply.status == 405 and reply.json["reason"] == "MethodNotAllowed"


async def test_authentication_configmap_is_written_as_kube_apiserver_does(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    data = (await kube_http.get(AUTH_CONFIGMAP)).json["data"]
    assert json.loads(data["requestheader-allowed-names"]) == ["front-proxy-client"]
    assert data["requestheader-username-headers"] == '["X-Remote-User"]'
    assert data["requestheader-group-headers"] == '["X-Remote-Group"]'
    assert data["requestheader-extra-headers-prefix"] == '["X-Remote-Extra-"]'
    assert pki.load_certificates_pem(data["client-ca-file"].encode())
    front_proxy = pki.load_certificates_pem(data["requestheader-client-ca-file"].encode())
    assert front_proxy[0].subject.rfc4514_string() == "CN=front-proxy-ca"


async def test_front_proxy_rotation_rewrites_the_configmap_for_watchers(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    before = (await kube_http.get(AUTH_CONFIGMAP)).json
    stream = kube_http.watch("/api/v1/namespaces/kube-system/configmaps", {
        "fieldSelector": "metadata.name=extension-apiserver-authentication",
        "resourceVersion": before["metadata"]["resourceVersion"]})
    fake_kube.rotate_front_proxy_ca()
    async with asyncio.timeout(5):
        event = await anext(stream)
    await stream.aclose()
    assert event["type"] == "MODIFIED"
    bundle = pki.load_certificates_pem(
        event["object"]["data"]["requestheader-client-ca-file"].encode())
    assert len(bundle) == 2  # new CA first, old one kept during the rotation
    fake_kube.rotate_front_proxy_ca(keep_old=False)
    after = (await kube_http.get(AUTH_CONFIGMAP)).json["data"]["requestheader-client-ca-file"]
    assert len(pki.load_certificates_pem(after.encode())) == 1


# --- recording and faults -------------------------------------------------------------------


async def test_requests_are_recorded_without_credentials(fake_kube: FakeKubeAPI,
                                                         kube_http: KubeHTTPClient) -> None:
    await kube_http.get("/api/v1/namespaces/demo/pods", params={"labelSelector": "app=web"})
    recorded = fake_kube.requests_to(r"/pods$", method="GET")
    assert len(recorded) == 1
    assert recorded[0].param("labelSelector") == "app=web"
    assert recorded[0].header("Authorization") == "<redacted>"
    assert recorded[0].user == "kubernetes-admin"


async def test_latency_fault_delays_then_serves(fake_kube: FakeKubeAPI,
                                                kube_http: KubeHTTPClient) -> None:
    fault = fake_kube.add_fault(r"/pods$", Latency(0.2))
    started = time.monotonic()
    reply = await kube_http.get("/api/v1/namespaces/demo/pods")
    assert reply.status == 200 and time.monotonic() - started >= 0.2
    assert fault.hits == 1
    await kube_http.get("/api/v1/namespaces/demo/pods")
    assert fault.hits == 1  # times=1 by default: the second request was not delayed


async def test_too_many_requests_fault_has_retry_after(fake_kube: FakeKubeAPI,
                                                       kube_http: KubeHTTPClient) -> None:
    fake_kube.add_fault(r"/pods", TooManyRequests(retry_after=3), method="GET", times=2)
    for _ in range(2):
        reply = await kube_http.get("/api/v1/namespaces/demo/pods")
        assert reply.status == 429 and reply.headers["Retry-After"] == "3"
        assert reply.json["details"] == {"retryAfterSeconds": 3}
    assert (await kube_http.get("/api/v1/namespaces/demo/pods")).status == 200


@pytest.mark.parametrize(("code", "reason"), [(500, "InternalError"),
                                              (503, "ServiceUnavailable"), (504, "Timeout")])
async def test_server_error_faults_are_status_bodies(fake_kube: FakeKubeAPI,
                                                     kube_http: KubeHTTPClient, code: int,
                                                     reason: str) -> None:
    fake_kube.add_fault(r"/pods", ServerError(code), times=None)
    reply = await kube_http.get("/api/v1/namespaces/demo/pods")
    assert reply.status == code and reply.json["reason"] == reason


async def test_dropped_connection_fault(fake_kube: FakeKubeAPI,
                                        kube_http: KubeHTTPClient) -> None:
    # aiohttp retries an idempotent request once on a dropped connection: drop both tries.
    fault = fake_kube.add_fault(r"/pods", DropConnection(), times=2)
    with pytest.raises(aiohttp.ClientError):
        await kube_http.get("/api/v1/namespaces/demo/pods")
    assert fault.hits == 2
    assert (await kube_http.get("/api/v1/namespaces/demo/pods")).status == 200


async def test_stalled_watch_sends_headers_then_nothing(fake_kube: FakeKubeAPI) -> None:
    fake_kube.add_fault(r"/pods", StallWatch())
    async with KubeHTTPClient(fake_kube) as http:
        assert http._session is not None
        timeout = aiohttp.ClientTimeout(sock_read=0.3)
        headers = {"Authorization": f"Bearer {fake_kube.admin_token}"}
        async with http._session.get(
                fake_kube.url + "/api/v1/namespaces/demo/pods",
                params={"watch": "1", "resourceVersion": "0"}, headers=headers,
                ssl=http._context, timeout=timeout) as response:
            assert response.status == 200
            with pytest.raises(asyncio.TimeoutError):
                await response.content.readline()




async def test_deleting_a_crd_stops_serving_its_kind(fake_kube: FakeKubeAPI,
                                                     kube_http: KubeHTTPClient) -> None:
    fake_kube.create_crd(group="example.com", kind="Widget", plural="widgets")
    await kube_http.post("/apis/example.com/v1/namespaces/demo/widgets", {
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
    deleted = await kube_http.delete(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
    assert deleted.status == 200 and deleted.json["kind"] == "CustomResourceDefinition"
    gone = await kube_http.get("/apis/example.com/v1/namespaces/demo/widgets")
    assert gone.status == 404
    assert "example.com" not in [g["name"] for g in (await kube_http.get("/apis")).json["groups"]]
