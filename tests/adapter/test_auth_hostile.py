"""Hostile callers against the running adapter: forged identities, bad certificates, PromQL
injection through to a real Prometheus, oversized and ambiguous requests, and secrets in logs.

One adapter serves the module, behind the real control plane (tests/adapter/auth_support.py:
real RBAC decides, the users below may read metrics); every log record of the run is captured
from before the adapter starts, and the last test reads them all for tokens and private-key
material.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest
import pytest_asyncio

from testbed.fakes.prometheus import ExporterPool, PrometheusServer
from testbed.faultproxy import ServerError
from tests.adapter.auth_support import (
    CUSTOM,
    EXTERNAL,
    Env,
    HandshakeFailed,
    LogCapture,
    Reply,
    auth_environment,
    capture_all_logs,
    secrets_in,
)
from tests.adapter.cluster import ModuleCluster

pytestmark = [pytest.mark.prometheus, pytest.mark.asyncio(loop_scope="module")]

# The users RBAC lets read metrics (denied-path-tester and anonymous may not).
READERS = ("injection-tester", "oversize-tester", "path-tester", "carol")


@dataclass
class Hostile:
    env: Env
    logs: LogCapture


@pytest.fixture(scope="module")
def logs() -> Iterator[LogCapture]:
    with capture_all_logs() as capture:
        yield capture


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hostile(logs: LogCapture, cluster: ModuleCluster,
                  tmp_path_factory: pytest.TempPathFactory, prometheus: PrometheusServer,
                  exporter_pool: ExporterPool) -> AsyncIterator[Hostile]:
    async with auth_environment(cluster, tmp_path_factory.mktemp("adapter-hostile"),
                                prometheus=prometheus, exporter_pool=exporter_pool,
                                readers=READERS) as env:
        yield Hostile(env, logs)


def pods_path(env: Env) -> str:
    shop = env.seeded.shop
    return f"{CUSTOM}/v1beta2/namespaces/{shop}/pods"


def status_of(reply: Reply) -> tuple[int, str | None]:
    body = reply.json()
    return reply.status, body.get("reason")


# --------------------------------------------------------------------------------------------
# Forged identities and bad certificates


async def test_spoofed_remote_user_without_a_certificate_is_anonymous_and_forbidden(
        hostile: Hostile) -> None:
    env = hostile.env
    pods = pods_path(env)
    spoofed = [("X-Remote-User", "system:kube-aggregator"), ("X-Remote-Group", "system:masters"),
               ("X-Remote-Extra-Scopes", "everything")]
    before = len(env.reviews_for("system:anonymous"))
    discovery = await env.adapter.request(f"{CUSTOM}/v1beta2", headers=spoofed)
    metric = await env.adapter.request(f"{pods}/%2A/http_requests", headers=spoofed)
    assert status_of(discovery) == (403, "Forbidden")
    assert discovery.json()["message"] == (
        'forbidden: User "system:anonymous" cannot get path "/apis/custom.metrics.k8s.io/v1beta2"')
    assert status_of(metric) == (403, "Forbidden")
    reviews = env.reviews_for("system:anonymous")[before:]
    assert [r["spec"].get("extra") for r in reviews] == [None, None]
    assert all(r["spec"]["groups"] == ["system:unauthenticated"] for r in reviews)


async def test_certificate_from_another_ca_fails_the_handshake(hostile: Hostile) -> None:
    env = hostile.env
    for name, user in (("other-proxy", "front-proxy-client"), ("other-admin", "admin")):
        cert = env.pki.client_pair(name, env.pki.stranger_ca, user=user,
                                   groups=("system:masters",))
        with pytest.raises(HandshakeFailed):
            await env.adapter.request(f"{CUSTOM}/v1beta2", cert=cert,
                                      headers=[("X-Remote-User", "system:kube-aggregator")])


async def test_disallowed_cn_is_401_unless_a_bearer_token_succeeds(hostile: Hostile) -> None:
    env = hostile.env
    cert = env.pki.proxy_pair("wrong-cn", user="kube-apiserver-impostor")
    headers = [("X-Remote-User", "system:kube-aggregator"), ("X-Remote-Group", "system:masters")]
    reply = await env.adapter.request(f"{CUSTOM}/v1beta2", cert=cert, headers=headers)
    assert status_of(reply) == (401, "Unauthorized")
    # As in Go's union: an error of the certificate authenticators does not stop a later success.
    token = env.new_token("token-after-bad-cn")
    reply = await env.adapter.request(
        f"{CUSTOM}/v1beta2", cert=cert,
        headers=[*headers, ("Authorization", f"Bearer {token}")])
    assert reply.status == 200, reply
    assert env.reviews_for(env.account_user("token-after-bad-cn"))


async def test_expired_proxy_certificate_fails_the_handshake(hostile: Hostile) -> None:
    env = hostile.env
    expired = env.pki.client_pair("expired-proxy", env.pki.proxy_ca, user="front-proxy-client",
                                  start=datetime.now(UTC) - timedelta(days=30),
                                  validity=timedelta(days=1))
    with pytest.raises(HandshakeFailed):
        await env.adapter.request(f"{CUSTOM}/v1beta2", cert=expired,
                                  headers=[("X-Remote-User", "system:kube-aggregator"),
                                           ("X-Remote-Group", "system:masters")])


async def test_client_ca_certificate_cannot_act_as_the_front_proxy(hostile: Hostile) -> None:
    env = hostile.env
    shop = env.seeded.shop
    cert = env.user_pair("carol", groups=["developers"])
    reply = await env.adapter.request(
        f"{CUSTOM}/v1beta2/namespaces/{shop}/metrics/queue_length", cert=cert,
        headers=[("X-Remote-User", "system:kube-aggregator"), ("X-Remote-Group", "system:masters")])
    assert reply.status == 200, reply
    assert [r["spec"]["groups"] for r in env.reviews_for("carol")] == \
        [["developers", "system:authenticated"]]
    assert not env.reviews_for("system:kube-aggregator")


# --------------------------------------------------------------------------------------------
# PromQL injection, through to the real Prometheus


async def test_dotted_names_and_selector_values_stay_literal_in_promql(hostile: Hostile) -> None:
    env = hostile.env
    shop = env.seeded.shop
    pods = pods_path(env)

    async def get(path: str) -> Reply:
        return await env.as_proxy(path, user="injection-tester")

    # A pod named w.b matches only itself, not wxb (100): `.` is not a regex wildcard.
    named = await get(f"{pods}/w.b/http_requests")
    assert [i["value"] for i in named.json()["items"]] == ["3"]
    selected = await get(f"{pods}/%2A/http_requests?labelSelector=app%3Ddotted")
    assert {i["describedObject"]["name"]: i["value"] for i in selected.json()["items"]} == \
        {"w.b": "3"}
    # External series labels: ord.rs is not orders (1200), alone or in a set.
    for selector in ("queue=ord.rs", "queue in (ord.rs,x)", "queue in (ord.rs)"):
        reply = await get(f"{EXTERNAL}/namespaces/{shop}/queuelength?labelSelector="
                          f"{quote(selector, safe='')}")
        assert reply.status in (200, 404), (selector, reply)
        if reply.status == 200:
            assert reply.json()["items"] == [], (selector, reply)
    # Metric labels on a custom metric: G.T is not GET.
    reply = await get(f"{pods}/%2A/http_requests?labelSelector=app%3Dweb&metricLabelSelector="
                      + quote("verb in (G.T)", safe=""))
    assert reply.status in (200, 404), reply
    if reply.status == 200:
        assert reply.json()["items"] == []


@pytest.mark.parametrize("injected", [
    'verb="GET"}) or vector(1) #',
    "verb=GET}) or vector(1",
    'verb in (GET"}) or vector(1) or sum({x="y)',
    "verb=~.*",
    "verb=GET\nother",
])
async def test_selectors_written_as_promql_are_400(hostile: Hostile, injected: str) -> None:
    env = hostile.env
    shop = env.seeded.shop
    pods = pods_path(env)
    for parameter, path in (("metricLabelSelector", f"{pods}/%2A/http_requests"),
                            ("labelSelector", f"{EXTERNAL}/namespaces/{shop}/queuelength")):
        reply = await env.as_proxy(f"{path}?{parameter}={quote(injected, safe='')}",
                                   user="injection-tester")
        assert status_of(reply) == (400, "BadRequest"), (parameter, reply)


@pytest.mark.parametrize("segment", [
    'web-0"}) or vector(1) #', "web-0|other-0", ".*", "web-0\\", 'x",pod=~".*',
])
async def test_object_and_namespace_names_cannot_change_the_query(hostile: Hostile,
                                                                  segment: str) -> None:
    env = hostile.env
    pods = pods_path(env)
    encoded = quote(segment, safe="")
    for path in (f"{pods}/{encoded}/http_requests",
                 f"{CUSTOM}/v1beta2/namespaces/{encoded}/pods/%2A/http_requests",
                 f"{CUSTOM}/v1beta2/namespaces/{encoded}/metrics/queue_length",
                 f"{EXTERNAL}/namespaces/{encoded}/queuelength"):
        reply = await env.as_proxy(path, user="injection-tester")
        assert reply.status in (400, 404), (path, reply)
        assert reply.json()["kind"] == "Status"


# --------------------------------------------------------------------------------------------
# Oversized and ambiguous requests


async def test_oversized_headers_urls_and_selectors_are_4xx_never_5xx_or_a_hang(
        hostile: Hostile) -> None:
    env = hostile.env
    pods = pods_path(env)
    answers: dict[str, int] = {}

    async def probe(name: str, path: str, headers: list[tuple[str, str]]) -> None:
        reply = await env.as_proxy(path, user="oversize-tester", headers=headers, within=10.0)
        answers[name] = reply.status

    huge_selector = ",".join(f"k{i}=v{i}" for i in range(2000))
    await probe("header value 64 KiB", f"{CUSTOM}/v1beta2", [("X-Padding", "a" * 65536)])
    await probe("header name 16 KiB", f"{CUSTOM}/v1beta2", [("X" * 16384, "1")])
    await probe("500 headers of 8 KiB", f"{CUSTOM}/v1beta2",
                [(f"X-Pad-{i}", "b" * 8000) for i in range(500)])
    await probe("URL 64 KiB", f"{CUSTOM}/v1beta2/namespaces/{'n' * 65536}/metrics/m", [])
    await probe("selector 20 KiB", f"{pods}/%2A/http_requests?labelSelector="
                + quote(huge_selector, safe=""), [])
    # aiohttp's parser limits (8190-byte lines and fields, 128 headers) answer 400 Bad Request
    # for all of these, not 413/414/431; what matters is a 4xx, before any handler runs.
    for name, status in answers.items():
        assert 400 <= status < 500, f"{name}: {status}"
    # A long selector that still fits the request line is parsed and answered, not a 5xx.
    fits = ",".join(f"k{i}!=v{i}" for i in range(600))
    reply = await env.as_proxy(f"{pods}/%2A/http_requests?labelSelector={quote(fits, safe='')}",
                               user="oversize-tester", within=10.0)
    assert reply.status < 500, reply
    # The adapter still serves afterwards.
    reply = await env.as_proxy(f"{CUSTOM}/v1beta2", user="oversize-tester")
    assert reply.status == 200, reply


@pytest.mark.parametrize("path", [
    "{pods}/web-0%2Fhttp_requests",
    "{pods}/web-0%2fhttp_requests",
    "{custom}/v1beta2/namespaces/{shop}%2Fpods/web-0/http_requests",
    "{pods}/../../nodes/{node}/temperature",
    "{pods}/%2E%2E/%2E%2E/nodes/{node}/temperature",
    "{pods}/%2e%2e/%2e%2e/nodes/{node}/temperature",
    "{pods}/./web-0/http_requests",
    "{pods}/web-0/%2E/http_requests",
    "/livez/../apis/custom.metrics.k8s.io/v1beta2/nodes/{node}/temperature",
    "/livez/%2E%2E/apis/custom.metrics.k8s.io/v1beta2/nodes/{node}/temperature",
    "/healthz%2F..%2Fapis",
    "{pods}/web-0/http_requests%00",
    "{pods}/web-0/http_requests%zz",
])
async def test_encoded_slashes_and_dot_segments_never_reach_another_resource(
        hostile: Hostile, path: str) -> None:
    env = hostile.env
    path = path.format(pods=pods_path(env), custom=CUSTOM, shop=env.seeded.shop,
                       node=env.seeded.node_1)
    # Someone allowed nothing: a 200 could only come from a different, allowed resource.
    for user in ("denied-path-tester", "path-tester"):
        reply = await env.as_proxy(path, user=user)
        assert reply.status in (400, 403, 404), (user, reply)
        if reply.status != 403:
            assert reply.status in (400, 404)
    reply = await env.adapter.request(path)
    assert reply.status in (400, 403, 404), reply


# --------------------------------------------------------------------------------------------
# Secrets in logs (keep last: it reads the log of everything above)


async def test_no_token_or_private_key_appears_in_the_logs_of_the_run(hostile: Hostile) -> None:
    env = hostile.env
    shop = env.seeded.shop
    good = env.new_token("log-tester")
    bad = f"never-valid-{secrets.token_hex(16)}"
    for token in (good, bad):
        for path in ("/livez", f"{CUSTOM}/v1beta2/namespaces/{shop}/metrics/queue_length"):
            await env.adapter.request(path, headers=[("Authorization", f"Bearer {token}")])
    await env.adapter.request("/livez", headers=[("Authorization", "Bearer " + bad * 400)])
    # A review that cannot be made logs a warning: with the token's digest only.
    env.kube.add_review_fault("tokenreviews", ServerError(500), times=None)
    try:
        other = f"review-broken-{secrets.token_hex(16)}"
        reply = await env.adapter.request("/livez", headers=[("Authorization", f"Bearer {other}")])
        assert reply.status == 500
    finally:
        env.kube.clear_faults()
    await asyncio.sleep(0)
    text = hostile.logs.text
    assert "TokenReview" in text  # the capture did see the adapter's auth log lines
    leaked = secrets_in(text, tokens=[*env.tokens, good, bad, other],
                        key_files=[*env.pki.key_files(), *env.control_plane.dir.glob("*.key")])
    assert leaked == []
