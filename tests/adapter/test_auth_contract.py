"""The 19 cases of contract §14 against the adapter over HTTPS, the real control plane and
Prometheus.

One adapter and exporter serve the whole module; kube-apiserver is the aggregator (the three
APIServices point at the adapter), answers the adapter's TokenReviews and SubjectAccessReviews
with its real RBAC (the users below may read metrics; `denied-*` and anonymous may not), and
is reached by the adapter through a recording fault proxy, which shows the reviews as sent.
Each test uses identities of its own, so the adapter's review caches never carry an answer
from one test into another.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
from collections.abc import AsyncIterator, Mapping
from decimal import Decimal
from typing import Any

import pytest
import pytest_asyncio

from metricscale.core.quantity import format_quantity, parse_quantity
from testbed.fakes.prometheus import ExporterPool, PrometheusServer
from testbed.faultproxy import ServerError
from tests.adapter.auth_support import (
    AGGREGATED_ACCEPT,
    CUSTOM,
    EXTERNAL,
    HPA_ACCEPT,
    QUANTITY_TABLE,
    Env,
    HandshakeFailed,
    Reply,
    auth_environment,
)
from tests.adapter.cluster import GROUP_VERSIONS, ModuleCluster

pytestmark = [pytest.mark.prometheus, pytest.mark.asyncio(loop_scope="module")]

RFC3339_SECONDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
# The users RBAC lets read metrics in this module (case 06's HPA has its bootstrap role).
READERS = ("case-04-user", "case-05-user", "case-07-user", "case-08-user", "case-09-user",
           "case-10-user", "case-11-user", "case-12-user", "case-17-user", "case-19-user")
# ...and this one may do anything with them (prometheus-adapter's manifests grant verbs "*"):
# its POST is authorized, and so answered by the route (405).
WRITERS = ("case-13-user",)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(cluster: ModuleCluster, tmp_path_factory: pytest.TempPathFactory,
              prometheus: PrometheusServer, exporter_pool: ExporterPool) -> AsyncIterator[Env]:
    async with auth_environment(cluster, tmp_path_factory.mktemp("adapter-auth"),
                                prometheus=prometheus, exporter_pool=exporter_pool,
                                readers=READERS, writers=WRITERS) as running:
        yield running


def assert_status(reply: Reply, code: int, reason: str) -> dict[str, Any]:
    assert reply.status == code, reply
    body: dict[str, Any] = reply.json()
    assert (body["kind"], body["status"], body["code"], body.get("reason")) == \
        ("Status", "Failure", code, reason), body
    return body


def items_by_name(body: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["describedObject"]["name"]: item for item in body["items"]}


def only_review(env: Env, user: str) -> dict[str, Any]:
    reviews = env.reviews_for(user)
    assert len(reviews) == 1, reviews
    return reviews[0]


# --------------------------------------------------------------------------------------------
# 1-5: who is asking


async def test_case_01_aggregator_discovery_is_200_without_any_review(env: Env) -> None:
    for group, version, _ in GROUP_VERSIONS:
        reply = await env.as_proxy(f"/apis/{group}/{version}", user="system:kube-aggregator",
                                   groups=("system:masters",))
        assert reply.status == 200, reply
        body = reply.json()
        assert (body["kind"], body["groupVersion"]) == ("APIResourceList", f"{group}/{version}")
        assert body["resources"]
        # kube-apiserver's own availability check passed too (cert + system:masters).
        available, message = env.control_plane.apiservice_available(group, version)
        assert available, message
    assert env.reviews_for("system:kube-aggregator") == []


async def test_case_02_disallowed_cn_is_401_and_unknown_ca_fails_the_handshake(
        env: Env) -> None:
    intruder = env.pki.proxy_pair("intruder", user="not-the-front-proxy")
    reply = await env.adapter.request(
        f"{CUSTOM}/v1beta2", cert=intruder,
        headers=[("X-Remote-User", "system:kube-aggregator"),
                 ("X-Remote-Group", "system:masters")])
    body = assert_status(reply, 401, "Unauthorized")
    assert body["message"] == "Unauthorized"
    # Documented difference (README "TLS"): Python's ssl cannot answer 401 to a certificate
    # that no trusted CA signed; the handshake fails instead.
    stranger = env.pki.client_pair("stranger-proxy", env.pki.stranger_ca, user="front-proxy-client")
    with pytest.raises(HandshakeFailed):
        await env.adapter.request(f"{CUSTOM}/v1beta2", cert=stranger,
                                  headers=[("X-Remote-User", "system:kube-aggregator")])


async def test_case_03_remote_user_without_a_certificate_is_anonymous_and_forbidden(
        env: Env) -> None:
    shop = env.seeded.shop
    before = len(env.reviews_for("system:anonymous"))
    reply = await env.adapter.request(
        f"{CUSTOM}/v1beta2/namespaces/{shop}/pods/%2A/http_requests",
        headers=[("X-Remote-User", "system:admin"), ("X-Remote-Group", "system:masters")])
    body = assert_status(reply, 403, "Forbidden")
    assert 'User "system:anonymous" cannot get resource "pods/http_requests"' in body["message"]
    reviews = env.reviews_for("system:anonymous")[before:]
    assert reviews and reviews[-1]["spec"]["groups"] == ["system:unauthenticated"]


async def test_case_04_group_headers_are_separate_values_never_split_on_commas(
        env: Env) -> None:
    shop = env.seeded.shop
    reply = await env.as_proxy(f"{CUSTOM}/v1beta2/namespaces/{shop}/metrics/queue_length",
                               user="case-04-user", groups=("a, b", "c"))
    assert reply.status == 200, reply
    review = only_review(env, "case-04-user")
    assert review["spec"]["groups"] == ["a, b", "c", "system:authenticated"]


async def test_case_05_extra_header_key_is_lower_cased_then_percent_decoded(env: Env) -> None:
    shop = env.seeded.shop
    reply = await env.as_proxy(
        f"{CUSTOM}/v1beta2/namespaces/{shop}/metrics/queue_length", user="case-05-user",
        headers=[("X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id", "x")])
    assert reply.status == 200, reply
    review = only_review(env, "case-05-user")
    assert review["spec"]["extra"] == {"authentication.kubernetes.io/credential-id": ["x"]}


# --------------------------------------------------------------------------------------------
# 6-12: metric requests and the reviews they cost


def _token_id(token: str) -> str:
    """The `jti` claim of a service account token: kube-apiserver's credential ID for it."""
    payload = token.split(".")[1]
    return str(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["jti"])


async def test_case_06_hpa_request_through_the_aggregator_reviews_exactly_as_go(
        env: Env) -> None:
    shop = env.seeded.shop
    # The HPA's own service account token: kube-apiserver authenticates and authorizes it
    # (its bootstrap role), then proxies with its identity headers.
    token = env.control_plane.service_account_token("kube-system",
                                                    "horizontal-pod-autoscaler")
    reply = await env.through_aggregator(
        f"{CUSTOM}/v1beta2/namespaces/{shop}/pods/%2A/http_requests?labelSelector=app%3Dweb",
        token=token, accept=HPA_ACCEPT)
    assert reply.status == 200, reply
    assert (reply.header("Content-Type") or "").startswith("application/json")
    body = reply.json()
    assert (body["kind"], body["apiVersion"]) == ("MetricValueList",
                                                  "custom.metrics.k8s.io/v1beta2")
    items = items_by_name(body)
    assert sorted(items) == ["web-0", "web-1"]  # other-0 has a series but not app=web
    assert items["web-0"]["metric"] == {"name": "http_requests", "selector": None}
    assert items["web-0"]["describedObject"]["kind"] == "Pod"
    account = env.control_plane.get(
        "/api/v1/namespaces/kube-system/serviceaccounts/horizontal-pod-autoscaler")
    assert only_review(env, HPA_USER) == {
        "kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": {
            "resourceAttributes": {"namespace": shop, "verb": "get",
                                   "group": "custom.metrics.k8s.io", "version": "v1beta2",
                                   "resource": "pods", "subresource": "http_requests",
                                   "name": "*"},
            "user": HPA_USER,
            "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system",
                       "system:authenticated"],
            "extra": {"authentication.kubernetes.io/credential-id": [
                f"JTI={_token_id(token)}"]},
            "uid": account["metadata"]["uid"],
        },
        "status": {"allowed": False},
    }


async def test_case_07_v1beta1_answers_with_metric_name_and_a_null_selector(env: Env) -> None:
    shop = env.seeded.shop
    reply = await env.as_proxy(
        f"{CUSTOM}/v1beta1/namespaces/{shop}/pods/%2A/http_requests?labelSelector=app%3Dweb",
        user="case-07-user", headers=[("Accept", HPA_ACCEPT)])
    assert reply.status == 200, reply
    body = reply.json()
    assert body["apiVersion"] == "custom.metrics.k8s.io/v1beta1"
    items = items_by_name(body)
    assert sorted(items) == ["web-0", "web-1"]
    for item in items.values():
        assert item["metricName"] == "http_requests"
        assert "selector" in item and item["selector"] is None
        assert "metric" not in item and "windowSeconds" not in item
    assert items["web-0"]["value"] == "2"  # GET 1.5 + POST 0.5


async def test_case_08_metric_label_selector_is_echoed_and_applied(env: Env) -> None:
    shop = env.seeded.shop
    reply = await env.as_proxy(
        f"{CUSTOM}/v1beta2/namespaces/{shop}/pods/%2A/http_requests"
        "?labelSelector=app%3Dweb&metricLabelSelector=verb%3DGET", user="case-08-user")
    assert reply.status == 200, reply
    items = items_by_name(reply.json())
    assert {name: item["value"] for name, item in items.items()} == \
        {"web-0": "1500m", "web-1": "2"}
    for item in items.values():
        assert item["metric"]["selector"] == {"matchLabels": {"verb": "GET"}}


async def test_case_09_namespace_metric_describes_the_namespace(env: Env) -> None:
    shop = env.seeded.shop
    reply = await env.as_proxy(f"{CUSTOM}/v1beta2/namespaces/{shop}/metrics/queue_length",
                               user="case-09-user")
    assert reply.status == 200, reply
    (item,) = reply.json()["items"]
    assert item["describedObject"]["kind"] == "Namespace"
    assert item["describedObject"]["name"] == shop
    assert item["value"] == "42"
    attributes = only_review(env, "case-09-user")["spec"]["resourceAttributes"]
    assert attributes == {"namespace": shop, "verb": "get", "group": "custom.metrics.k8s.io",
                          "version": "v1beta2", "resource": "metrics", "name": "queue_length"}


async def test_case_10_node_metrics_are_cluster_scoped_with_no_review_namespace(
        env: Env) -> None:
    node_1, node_2 = env.seeded.node_1, env.seeded.node_2
    one = await env.as_proxy(f"{CUSTOM}/v1beta2/nodes/{node_1}/temperature", user="case-10-user")
    assert one.status == 200, one
    (item,) = one.json()["items"]
    assert item["describedObject"] == {"kind": "Node", "name": node_1, "apiVersion": "v1"}
    assert item["value"] == "61500m"
    every = await env.as_proxy(f"{CUSTOM}/v1beta2/nodes/%2A/temperature", user="case-10-user")
    assert every.status == 200, every
    assert {name: item["value"] for name, item in items_by_name(every.json()).items()} == \
        {node_1: "61500m", node_2: "58"}
    reviews = env.reviews_for("case-10-user")
    assert [r["spec"]["resourceAttributes"] for r in reviews] == [
        {"verb": "get", "group": "custom.metrics.k8s.io", "version": "v1beta2",
         "resource": "nodes", "subresource": "temperature", "name": name}
        for name in (node_1, "*")]


async def test_case_11_deployment_metric_names_the_apps_group(env: Env) -> None:
    shop = env.seeded.shop
    reply = await env.as_proxy(f"{CUSTOM}/v1beta2/namespaces/{shop}/deployments.apps/web/rps",
                               user="case-11-user")
    assert reply.status == 200, reply
    (item,) = reply.json()["items"]
    assert item["describedObject"] == {"kind": "Deployment", "namespace": shop, "name": "web",
                                       "apiVersion": "apps/v1"}
    assert item["value"] == "250"
    attributes = only_review(env, "case-11-user")["spec"]["resourceAttributes"]
    assert (attributes["resource"], attributes["subresource"], attributes["name"]) == \
        ("deployments.apps", "rps", "web")


async def test_case_12_lower_cased_external_metric_is_found_and_reviewed_as_list(
        env: Env) -> None:
    shop = env.seeded.shop
    reply = await env.as_proxy(f"{EXTERNAL}/namespaces/{shop}/queuelength?labelSelector="
                               "queue%3Dorders", user="case-12-user")
    assert reply.status == 200, reply
    body = reply.json()
    assert body["kind"] == "ExternalMetricValueList"
    (item,) = body["items"]
    assert (item["metricLabels"], item["value"]) == ({"queue": "orders"}, "1200")
    attributes = only_review(env, "case-12-user")["spec"]["resourceAttributes"]
    assert attributes == {"namespace": shop, "verb": "list",
                          "group": "external.metrics.k8s.io", "version": "v1beta1",
                          "resource": "queuelength"}


# --------------------------------------------------------------------------------------------
# 13-16: errors, probes, discovery documents


async def test_case_13_errors_are_status_bodies_with_the_right_codes(env: Env) -> None:
    shop = env.seeded.shop
    user = "case-13-user"
    assert_status(await env.as_proxy(
        f"{CUSTOM}/v1beta2/namespaces/{shop}/pods/%2A/no_such_metric", user=user), 404, "NotFound")
    assert_status(await env.as_proxy(
        f"{CUSTOM}/v1beta2/namespaces/{shop}/pods/%2A/http_requests?labelSelector=%3D%3D%3D",
        user=user), 400, "BadRequest")
    assert_status(await env.as_proxy(
        f"{CUSTOM}/v1beta2/namespaces/{shop}/pods/%2A/http_requests", user=user, method="POST",
        body=b"{}"), 405, "MethodNotAllowed")
    assert_status(await env.as_proxy(
        f"{CUSTOM}/v1beta2/namespaces/{shop}/pods/%2A/http_requests", user="denied-case-13",
        method="POST", body=b"{}"), 403, "Forbidden")
    body = assert_status(await env.as_proxy(f"{CUSTOM}/v1beta2/nodes/foo", user=user),
                         404, "NotFound")
    assert body["message"] == "the server could not find the requested resource"


async def test_case_14_bad_token_is_401_even_on_livez_and_no_credentials_is_ok(
        env: Env) -> None:
    bad = f"bad-{secrets.token_hex(8)}"
    reply = await env.adapter.request("/livez", headers=[("Authorization", f"Bearer {bad}")])
    assert_status(reply, 401, "Unauthorized")
    assert env.kube.token_reviews(bad)
    before = len(env.reviews_for("system:anonymous"))
    reply = await env.adapter.request("/livez")
    assert (reply.status, reply.text) == (200, "ok")
    assert len(env.reviews_for("system:anonymous")) == before


async def test_case_15_apis_serves_aggregated_discovery_or_a_group_list(env: Env) -> None:
    aggregated = await env.as_proxy("/apis", user="system:kube-aggregator",
                                    groups=("system:masters",),
                                    headers=[("Accept", AGGREGATED_ACCEPT)])
    if aggregated.status == 406:
        assert_status(aggregated, 406, "NotAcceptable")
    else:
        assert aggregated.status == 200, aggregated
        assert aggregated.header("Content-Type") == (
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
        document = aggregated.json()
        assert document["kind"] == "APIGroupDiscoveryList"
        assert {item["metadata"]["name"] for item in document["items"]} == \
            {"custom.metrics.k8s.io", "external.metrics.k8s.io"}
    plain = await env.as_proxy("/apis", user="system:kube-aggregator",
                               groups=("system:masters",), headers=[("Accept", "application/json")])
    assert plain.status == 200, plain
    body = plain.json()
    assert body["kind"] == "APIGroupList"
    assert {group["name"] for group in body["groups"]} == \
        {"custom.metrics.k8s.io", "external.metrics.k8s.io"}


async def test_case_16_openapi_is_never_refused_to_the_aggregator(env: Env) -> None:
    for path in ("/openapi/v2", "/openapi/v3"):
        reply = await env.as_proxy(path, user="system:aggregator")
        assert reply.status in (200, 404), reply
        if reply.status == 200:
            assert reply.json()["swagger"] == "2.0"
    reviews = env.reviews_for("system:aggregator")
    assert [r["spec"] for r in reviews] == [
        {"nonResourceAttributes": {"path": path, "verb": "get"}, "user": "system:aggregator",
         "groups": ["system:authenticated"]} for path in ("/openapi/v2", "/openapi/v3")]


# --------------------------------------------------------------------------------------------
# 17-19: values, caches, a review that cannot be made


async def test_case_17_quantities_are_canonical_and_timestamps_whole_seconds(env: Env) -> None:
    quant = env.seeded.quant
    for value, canonical in QUANTITY_TABLE:
        assert format_quantity(Decimal(value)) == canonical
        assert parse_quantity(canonical) == Decimal(value)
    reply = await env.as_proxy(f"{CUSTOM}/v1beta2/namespaces/{quant}/pods/%2A/quantity",
                               user="case-17-user")
    assert reply.status == 200, reply
    items = items_by_name(reply.json())
    served = {name: item["value"] for name, item in items.items()}
    expected = {f"q-{index}": canonical for index, (_, canonical) in enumerate(QUANTITY_TABLE)}
    # Sample values are truncated to thousandths as upstream does (README "Exact values").
    expected["q-4"] = "1m"
    assert served == expected
    for item in items.values():
        assert RFC3339_SECONDS.match(item["timestamp"]), item


async def test_case_18_identical_requests_cost_one_token_review_and_one_sar_per_ttl(
        env: Env) -> None:
    shop = env.seeded.shop
    token = env.new_token("case-18")
    user = env.account_user("case-18")
    path = f"{CUSTOM}/v1beta2/namespaces/{shop}/metrics/queue_length"

    def counts() -> tuple[int, int]:
        return len(env.kube.token_reviews(token)), len(env.reviews_for(user))

    for _ in range(3):
        reply = await env.adapter.request(path, headers=[("Authorization", f"Bearer {token}")])
        assert reply.status == 200, reply
    assert counts() == (1, 1)
    env.clock.offset += 10.5
    reply = await env.adapter.request(path, headers=[("Authorization", f"Bearer {token}")])
    assert reply.status == 200, reply
    assert counts() == (2, 2)


async def test_case_19_unreachable_sar_endpoint_is_500_not_403_nor_200(env: Env) -> None:
    shop = env.seeded.shop
    path = f"{CUSTOM}/v1beta2/namespaces/{shop}/metrics/queue_length"
    attempts = len(env.kube.subject_access_reviews("case-19-user"))
    env.kube.add_review_fault("subjectaccessreviews", ServerError(503), times=None)
    try:
        reply = await env.as_proxy(path, user="case-19-user")
    finally:
        env.kube.clear_faults()
    body = assert_status(reply, 500, "InternalError")
    assert "authorization" in body["message"]
    assert len(env.kube.subject_access_reviews("case-19-user")) - attempts == 5
    # A failure is not an answer: nothing was cached, the next request is reviewed and served.
    reply = await env.as_proxy(path, user="case-19-user")
    assert reply.status == 200, reply
