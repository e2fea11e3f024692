"""Fake kube-apiserver: object semantics over HTTP (CRUD, conflicts, Status bodies, selectors,
pruning, defaults, generation, status subresource, paging)."""

from __future__ import annotations

import re

from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.kube_http import KubeHTTPClient

PODS = "/api/v1/namespaces/demo/pods"
DEPLOYMENTS = "/apis/apps/v1/namespaces/demo/deployments"
CONFIGMAPS = "/api/v1/namespaces/demo/configmaps"


def _configmap(name: str, **data: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


# --- create / get / conflicts ----------------------------------------------------------------


async def test_create_fills_server_fields_and_get_returns_the_object(
        kube_http: KubeHTTPClient) -> None:
    created = await kube_http.post(CONFIGMAPS, _configmap("a", k="v"))
    assert created.status == 201
    metadata = created.json["metadata"]
    assert metadata["namespace"] == "demo"
    assert re.fullmatch(r"[0-9a-f-]{36}", metadata["uid"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", metadata["creationTimestamp"])
    assert "generation" not in metadata  # configmaps do not track generation
    fetched = await kube_http.get(f"{CONFIGMAPS}/a")
    assert fetched.json == created.json
    assert fetched.json["kind"] == "ConfigMap" and fetched.json["apiVersion"] == "v1"


async def test_resource_versions_come_from_one_global_counter(kube_http: KubeHTTPClient) -> None:
    first = (await kube_http.post(CONFIGMAPS, _configmap("a"))).json
    second = (await kube_http.post(PODS, {"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "x"}]}})).json
    assert int(second["metadata"]["resourceVersion"]) == \
        int(first["metadata"]["resourceVersion"]) + 1


async def test_generate_name_appends_five_random_characters(kube_http: KubeHTTPClient) -> None:
    reply = await kube_http.post(CONFIGMAPS, {"metadata": {"generateName": "web-"}})
    assert reply.status == 201
    assert re.fullmatch(r"web-[bcdfghjklmnpqrstvwxz2456789]{5}", reply.json["metadata"]["name"])


async def test_missing_name_is_invalid_with_upstream_message(kube_http: KubeHTTPClient) -> None:
    reply = await kube_http.post(CONFIGMAPS, {"metadata": {}})
    assert reply.status == 422
    assert reply.json["reason"] == "Invalid"
    assert reply.json["message"] == ('ConfigMap "" is invalid: metadata.name: Required value: '
                                     "name or generateName is required")
    assert reply.json["details"]["causes"] == [{
        "reason": "FieldValueRequired", "message": "Required value: name or generateName is "
                                                   "required", "field": "metadata.name"}]


async def test_create_twice_is_already_exists(kube_http: KubeHTTPClient) -> None:
    await kube_http.post(CONFIGMAPS, _configmap("a"))
    reply = await kube_http.post(CONFIGMAPS, _configmap("a"))
    assert reply.status == 409
    assert reply.json == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                          "status": "Failure", "message": 'configmaps "a" already exists',
                          "reason": "AlreadyExists",
                          "details": {"name": "a", "kind": "configmaps"}, "code": 409}


async def test_get_missing_is_not_found_with_group_in_message(kube_http: KubeHTTPClient) -> None:
    reply = await kube_http.get(f"{DEPLOYMENTS}/nope")
    assert reply.status == 404
    assert reply.json["message"] == 'deployments.apps "nope" not found'
    assert reply.json["details"] == {"name": "nope", "group": "apps", "kind": "deployments"}


async def test_put_with_stale_resource_version_is_conflict(kube_http: KubeHTTPClient) -> None:
    created = (await kube_http.post(DEPLOYMENTS, _deployment("web"))).json
    created["spec"]["replicas"] = 3
    assert (await kube_http.put(f"{DEPLOYMENTS}/web", created)).status == 200
    created["spec"]["replicas"] = 4  # still carries the old resourceVersion
    reply = await kube_http.put(f"{DEPLOYMENTS}/web", created)
    assert reply.status == 409
    assert reply.json["reason"] == "Conflict"
    assert reply.json["message"] == (
        'Operation cannot be fulfilled on deployments.apps "web": the object has been '
        "modified; please apply your changes to the latest version and try again")
    assert reply.json["details"] == {"name": "web", "group": "apps", "kind": "deployments"}


async def test_put_without_resource_version_is_unconditional(kube_http: KubeHTTPClient) -> None:
    await kube_http.post(CONFIGMAPS, _configmap("a", k="1"))
    reply = await kube_http.put(f"{CONFIGMAPS}/a", _configmap("a", k="2"))
    assert reply.status == 200 and reply.json["data"] == {"k": "2"}


async def test_put_name_mismatch_and_missing_object(kube_http: KubeHTTPClient) -> None:
    await kube_http.post(CONFIGMAPS, _configmap("a"))
    mismatch = await kube_http.put(f"{CONFIGMAPS}/a", _configmap("b"))
    assert mismatch.status == 400
    assert mismatch.json["message"] == ("the name of the object (b) does not match the name on "
                                        "the URL (a)")
    missing = await kube_http.put(f"{CONFIGMAPS}/zzz", _configmap("zzz"))
    assert missing.status == 404


async def test_noop_update_keeps_the_resource_version(kube_http: KubeHTTPClient) -> None:
    created = (await kube_http.post(CONFIGMAPS, _configmap("a", k="v"))).json
    again = (await kube_http.put(f"{CONFIGMAPS}/a", created)).json
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_namespace_mismatch_is_bad_request(kube_http: KubeHTTPClient) -> None:
    body = _configmap("a")
    body["metadata"]["namespace"] = "other"  # type: ignore[index]
    reply = await kube_http.post(CONFIGMAPS, body)
    assert reply.status == 400
    assert "does not match the namespace" in reply.json["message"]


async def test_enforced_namespaces_must_exist(fake_kube: FakeKubeAPI,
                                              kube_http: KubeHTTPClient) -> None:
    fake_kube.enforce_namespaces = True
    reply = await kube_http.post("/api/v1/namespaces/ghost/configmaps", _configmap("a"))
    assert reply.status == 404 and reply.json["message"] == 'namespaces "ghost" not found'


async def test_unauthenticated_and_bad_tokens_get_401(fake_kube: FakeKubeAPI) -> None:
    async with KubeHTTPClient(fake_kube, anonymous=True) as anonymous:
        reply = await anonymous.get(PODS)
        assert reply.status == 401 and reply.json["reason"] == "Unauthorized"
        assert (await anonymous.get("/livez")).text == "ok"
    async with KubeHTTPClient(fake_kube, token="wrong") as bad:
        assert (await bad.get("/livez")).status == 401


async def test_client_certificates_authenticate_as_cn_and_o(fake_kube: FakeKubeAPI) -> None:
    seen = []
    fake_kube.authorizer = lambda attributes: seen.append(attributes.user) or True
    cert, key = fake_kube.issue_client_certificate(username="alice", groups=["dev"])
    async with KubeHTTPClient(fake_kube, client_certificate=(str(cert), str(key))) as http:
        assert (await http.get(PODS)).status == 200
    assert seen[0].user == "alice"
    assert seen[0].groups == ("dev", "system:authenticated")


async def test_authorizer_denial_is_forbidden_with_upstream_message(
        fake_kube: FakeKubeAPI) -> None:
    fake_kube.add_user(token="bob-token", username="bob", groups=["dev"])
    fake_kube.authorizer = lambda attributes: (False, "no rule") if attributes.user.user == "bob" \
        else True
    async with KubeHTTPClient(fake_kube, token="bob-token") as http:
        reply = await http.get(f"{DEPLOYMENTS}/web/scale")
    assert reply.status == 403
    assert reply.json["message"] == (
        'deployments.apps "web" is forbidden: User "bob" cannot get resource '
        '"deployments/scale" in API group "apps" in the namespace "demo": no rule')


async def test_delete_returns_status_or_object_as_upstream(kube_http: KubeHTTPClient) -> None:
    await kube_http.post(CONFIGMAPS, _configmap("a"))
    deleted = await kube_http.delete(f"{CONFIGMAPS}/a")
    assert deleted.status == 200
    assert deleted.json["kind"] == "Status" and deleted.json["status"] == "Success"
    assert deleted.json["details"]["name"] == "a" and deleted.json["details"]["kind"] == \
        "configmaps"
    await kube_http.post(PODS, _pod("p"))
    pod = await kube_http.delete(f"{PODS}/p")
    assert pod.json["kind"] == "Pod"  # pods set ReturnDeletedObject
    assert (await kube_http.delete(f"{PODS}/p")).status == 404


async def test_finalizers_delay_deletion_until_removed(kube_http: KubeHTTPClient) -> None:
    body = _configmap("a")
    body["metadata"]["finalizers"] = ["example.com/keep"]  # type: ignore[index]
    await kube_http.post(CONFIGMAPS, body)
    marked = await kube_http.delete(f"{CONFIGMAPS}/a")
    assert marked.json["metadata"]["deletionTimestamp"]
    current = (await kube_http.get(f"{CONFIGMAPS}/a")).json
    current["metadata"]["finalizers"] = []
    await kube_http.put(f"{CONFIGMAPS}/a", current)
    assert (await kube_http.get(f"{CONFIGMAPS}/a")).status == 404


async def test_marking_deletion_bumps_a_tracked_generation(kube_http: KubeHTTPClient) -> None:
    # apiserver/pkg/registry/generic/registry/store.go markAsDeleting: the first deletion
    # timestamp on an object with a generation raises it by one; configmaps have none.
    body = _deployment("web")
    body["metadata"]["finalizers"] = ["example.com/keep"]  # type: ignore[index]
    created = (await kube_http.post(DEPLOYMENTS, body)).json
    assert created["metadata"]["generation"] == 1
    marked = (await kube_http.delete(f"{DEPLOYMENTS}/web")).json
    assert marked["metadata"]["deletionTimestamp"]
    assert marked["metadata"]["generation"] == 2
    again = (await kube_http.delete(f"{DEPLOYMENTS}/web")).json
    assert again["metadata"]["generation"] == 2  # only the first mark counts
    config = _configmap("a")
    config["metadata"]["finalizers"] = ["example.com/keep"]  # type: ignore[index]
    await kube_http.post(CONFIGMAPS, config)
    assert "generation" not in (await kube_http.delete(f"{CONFIGMAPS}/a")).json["metadata"]


# --- lists and selectors -----------------------------------------------------------------------


async def test_list_has_resource_version_and_typed_items(fake_kube: FakeKubeAPI,
                                                         kube_http: KubeHTTPClient) -> None:
    fake_kube.create_pod("a", namespace="demo", labels={"app": "web"})
    listing = (await kube_http.get(PODS)).json
    assert listing["kind"] == "PodList" and listing["apiVersion"] == "v1"
    assert listing["metadata"]["resourceVersion"] == str(fake_kube.resource_version)
    assert "kind" not in listing["items"][0]  # typed lists omit kind/apiVersion on items


async def test_label_selectors_use_the_full_grammar(fake_kube: FakeKubeAPI,
                                                    kube_http: KubeHTTPClient) -> None:
    fake_kube.create_pod("a", namespace="demo", labels={"app": "web", "tier": "front"})
    fake_kube.create_pod("b", namespace="demo", labels={"app": "web", "tier": "back"})
    fake_kube.create_pod("c", namespace="demo", labels={"app": "db"})
    cases = {
        "app=web": ["a", "b"],
        "app==web,tier!=back": ["a"],
        "tier in (front, back)": ["a", "b"],
        "app notin (web)": ["c"],
        "tier": ["a", "b"],
        "!tier": ["c"],
        "": ["a", "b", "c"],
    }
    for selector, expected in cases.items():
        reply = await kube_http.get(PODS, params={"labelSelector": selector})
        assert [i["metadata"]["name"] for i in reply.json["items"]] == expected, selector


async def test_bad_label_selector_is_bad_request(kube_http: KubeHTTPClient) -> None:
    reply = await kube_http.get(PODS, params={"labelSelector": "==="})
    assert reply.status == 400 and reply.json["reason"] == "BadRequest"


async def test_field_selectors_on_name_namespace_and_pod_fields(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    fake_kube.create_pod("a", namespace="demo")
    fake_kube.create_pod("b", namespace="demo", phase="Pending")
    fake_kube.create_pod("a", namespace="other")
    by_name = await kube_http.get("/api/v1/pods", params={"fieldSelector": "metadata.name=a"})
    assert sorted(i["metadata"]["namespace"] for i in by_name.json["items"]) == ["demo", "other"]
    both = await kube_http.get("/api/v1/pods", params={
        "fieldSelector": "metadata.namespace=demo,status.phase!=Pending"})
    assert [i["metadata"]["name"] for i in both.json["items"]] == ["a"]
    unknown = await kube_http.get(CONFIGMAPS, params={"fieldSelector": "data.x=y"})
    assert unknown.status == 400
    assert unknown.json["message"] == "field label not supported: data.x"


async def test_list_paging_with_limit_and_continue(kube_http: KubeHTTPClient) -> None:
    for name in "abcde":
        await kube_http.post(CONFIGMAPS, _configmap(name))
    first = (await kube_http.get(CONFIGMAPS, params={"limit": "2"})).json
    assert [i["metadata"]["name"] for i in first["items"]] == ["a", "b"]
    assert first["metadata"]["remainingItemCount"] == 3
    second = (await kube_http.get(CONFIGMAPS, params={
        "limit": "2", "continue": first["metadata"]["continue"]})).json
    assert [i["metadata"]["name"] for i in second["items"]] == ["c", "d"]
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


async def test_list_with_future_resource_version_times_out_as_too_large(
        kube_http: KubeHTTPClient, fake_kube: FakeKubeAPI) -> None:
    reply = await kube_http.get(CONFIGMAPS, params={
        "resourceVersion": str(fake_kube.resource_version + 100)})
    assert reply.status == 504
    assert reply.json["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"


# --- decoding, defaults, generation, status ---------------------------------------------------


async def test_unknown_fields_are_dropped_with_a_warning(kube_http: KubeHTTPClient) -> None:
    body = _deployment("web")
    body["spec"]["replicaz"] = 3  # type: ignore[index]
    reply = await kube_http.post(DEPLOYMENTS, body)
    assert reply.status == 201
    assert "replicaz" not in reply.json["spec"]
    assert reply.headers_named("Warning") == ['299 - "unknown field \\"spec.replicaz\\""']
    strict = await kube_http.post(DEPLOYMENTS, {**body, "metadata": {"name": "w2"}},
                                  params={"fieldValidation": "Strict"})
    assert strict.status == 400
    assert strict.json["message"] == ('Deployment in version "v1" cannot be handled as a '
                                      'Deployment: strict decoding error: unknown field '
                                      '"spec.replicaz"')


async def test_wrong_json_types_are_bad_request(kube_http: KubeHTTPClient) -> None:
    body = _deployment("web")
    body["spec"]["replicas"] = "3"  # type: ignore[index]
    reply = await kube_http.post(DEPLOYMENTS, body)
    assert reply.status == 400
    assert "cannot unmarshal string" in reply.json["message"]


async def test_defaults_are_applied_like_the_apiserver(kube_http: KubeHTTPClient) -> None:
    body = _deployment("web")
    del body["spec"]["replicas"]  # type: ignore[attr-defined]
    created = (await kube_http.post(DEPLOYMENTS, body)).json
    assert created["spec"]["replicas"] == 1
    assert created["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": "25%",
                                                           "maxSurge": "25%"}
    hpa = (await kube_http.post("/apis/autoscaling/v2/namespaces/demo/horizontalpodautoscalers",
                                _hpa("web"))).json
    assert hpa["spec"]["minReplicas"] == 1
    assert hpa["spec"]["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]


async def test_invalid_deployment_selector_is_rejected(kube_http: KubeHTTPClient) -> None:
    body = _deployment("web")
    body["spec"]["template"]["metadata"]["labels"] = {"app": "other"}  # type: ignore[index]
    reply = await kube_http.post(DEPLOYMENTS, body)
    assert reply.status == 422
    assert reply.json["details"]["causes"][0]["field"] == "spec.template.metadata.labels"


async def test_generation_moves_with_spec_not_status_or_labels(
        kube_http: KubeHTTPClient) -> None:
    created = (await kube_http.post(DEPLOYMENTS, _deployment("web"))).json
    assert created["metadata"]["generation"] == 1
    created["metadata"]["labels"] = {"extra": "x"}
    relabelled = (await kube_http.put(f"{DEPLOYMENTS}/web", created)).json
    assert relabelled["metadata"]["generation"] == 1
    relabelled["status"] = {"replicas": 2}
    status = (await kube_http.put(f"{DEPLOYMENTS}/web/status", relabelled)).json
    assert status["metadata"]["generation"] == 1 and status["status"] == {"replicas": 2}
    status["spec"]["replicas"] = 5
    scaled = (await kube_http.put(f"{DEPLOYMENTS}/web", status)).json
    assert scaled["metadata"]["generation"] == 2


async def test_create_and_main_update_cannot_set_status(kube_http: KubeHTTPClient) -> None:
    body = _deployment("web")
    body["status"] = {"replicas": 7}
    created = (await kube_http.post(DEPLOYMENTS, body)).json
    assert "status" not in created or created["status"] == {}
    created["status"] = {"replicas": 9}
    updated = (await kube_http.put(f"{DEPLOYMENTS}/web", created)).json
    assert updated.get("status", {}).get("replicas") is None


async def test_status_update_ignores_spec_changes(kube_http: KubeHTTPClient) -> None:
    created = (await kube_http.post(DEPLOYMENTS, _deployment("web"))).json
    created["spec"]["replicas"] = 99
    created["status"] = {"replicas": 2}
    updated = (await kube_http.put(f"{DEPLOYMENTS}/web/status", created)).json
    assert updated["spec"]["replicas"] == 2 and updated["status"]["replicas"] == 2


async def test_hpa_v1_and_v2_share_storage(kube_http: KubeHTTPClient) -> None:
    body = _hpa("web")
    body["spec"]["metrics"] = [  # type: ignore[index]
        {"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization", "averageUtilization": 60}}},
        {"type": "Pods", "pods": {"metric": {"name": "rps"}, "target": {
            "type": "AverageValue", "averageValue": "10"}}}]
    await kube_http.post("/apis/autoscaling/v2/namespaces/demo/horizontalpodautoscalers", body)
    v1 = (await kube_http.get(
        "/apis/autoscaling/v1/namespaces/demo/horizontalpodautoscalers/web")).json
    assert v1["apiVersion"] == "autoscaling/v1"
    assert v1["spec"]["targetCPUUtilizationPercentage"] == 60
    assert "autoscaling.alpha.kubernetes.io/metrics" in v1["metadata"]["annotations"]


async def test_events_api_and_core_events_share_storage(kube_http: KubeHTTPClient) -> None:
    event = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
             "metadata": {"generateName": "web-", "namespace": "demo"},
             "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "example.com/x",
             "reportingInstance": "x-1", "action": "Scale", "reason": "SuccessfulRescale",
             "type": "Normal", "note": "New size: 4",
             "regarding": {"kind": "HorizontalPodAutoscaler", "name": "web", "namespace": "demo"}}
    created = await kube_http.post("/apis/events.k8s.io/v1/namespaces/demo/events", event)
    assert created.status == 201, created.text
    core = (await kube_http.get("/api/v1/namespaces/demo/events")).json["items"][0]
    assert core["message"] == "New size: 4" and core["involvedObject"]["name"] == "web"
    bad = dict(event, eventTime="2026-01-01T00:00:00Z")
    reply = await kube_http.post("/apis/events.k8s.io/v1/namespaces/demo/events", bad)
    assert reply.status == 400  # MicroTime needs exactly six fractional digits
    # As the real server: a generated name's prefix may end in '-', never in '.'.
    dotted = dict(event, metadata={"generateName": "web.", "namespace": "demo"})
    reply = await kube_http.post("/apis/events.k8s.io/v1/namespaces/demo/events", dotted)
    assert reply.status == 422 and "metadata.generateName" in reply.text, reply.text


async def test_unknown_routes_answer_like_the_apiserver(kube_http: KubeHTTPClient) -> None:
    page = await kube_http.get("/nothing/here")
    assert page.status == 404 and page.text == "404 page not found\n"
    assert (await kube_http.get("/api/v1/widgets")).json["reason"] == "NotFound"
    assert (await kube_http.request("POST", f"{CONFIGMAPS}/x", body={})).status == 405


def _pod(name: str) -> dict[str, object]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "x"}]}}


def _deployment(name: str) -> dict[str, object]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "app", "image": "x"}]}}}}


def _hpa(name: str) -> dict[str, object]:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": name}, "maxReplicas": 5}}


async def test_lease_times_are_micro_times(kube_http: KubeHTTPClient) -> None:
    leases = "/apis/coordination.k8s.io/v1/namespaces/demo/leases"
    spec = {"holderIdentity": "a", "leaseDurationSeconds": 15,
            "acquireTime": "2026-01-01T00:00:00.000000Z",
            "renewTime": "2026-01-01T01:00:00.123456+01:00"}
    created = await kube_http.post(leases, {"metadata": {"name": "leader"}, "spec": spec})
    assert created.status == 201
    assert created.json["spec"]["renewTime"] == "2026-01-01T00:00:00.123456Z"
    naive = await kube_http.post(leases, {"metadata": {"name": "other"}, "spec": {
        **spec, "renewTime": "2026-01-01T00:00:00Z"}})  # datetime.isoformat() drops micros
    assert naive.status == 400
    zero = await kube_http.post(leases, {"metadata": {"name": "zero"}, "spec": {
        **spec, "leaseDurationSeconds": 0}})
    assert zero.status == 422
