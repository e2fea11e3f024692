"""Fake kube-apiserver's aggregator: APIService validation and discovery, availability,
proxying over TLS with the front-proxy identity, X-Remote-* and X-Forwarded-* headers, 503s,
redirects refused with 502, Go encodings."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from metricscale import pki
from testbed.fakes.kube_aggregator import (
    canonical_header_key,
    escape_header_key,
    forwarded_uri,
    go_encode_query,
    go_escape_path,
)
from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.kube_http import KubeHTTPClient
from testbed.fakes.tools import require_tool

GROUP = "custom.metrics.k8s.io"
SERVICE = ("custom-metrics", "metrics-adapter")
SERVICE_NAME = "metrics-adapter.custom-metrics.svc"
NOW = datetime.now(UTC) - timedelta(minutes=1)


@dataclass
class Backend:
    """A tiny aggregated API server that echoes what the aggregator sent it."""

    url_host: str
    port: int
    ca: pki.CertifiedKey
    seen: list[dict[str, Any]] = field(default_factory=list)


def _serving_context(ca: pki.CertifiedKey, client_ca_pem: bytes, tmp: Path,
                     names: list[str]) -> ssl.SSLContext:
    leaf = pki.issue_serving_certificate(ca, common_name="adapter", dns_names=names,
                                         now=NOW, validity=timedelta(days=1))
    tmp.mkdir(parents=True, exist_ok=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.write_certificate(tmp / "tls.crt", leaf.certificate),
                            pki.write_private_key(tmp / "tls.key", leaf.private_key))
    context.verify_mode = ssl.CERT_REQUIRED  # only the front proxy may call
    context.load_verify_locations(cadata=client_ca_pem.decode())
    return context


async def _start_backend(kube: FakeKubeAPI, tmp: Path, *, names: list[str]
                         ) -> tuple[Backend, web.AppRunner]:
    ca = pki.generate_ca(common_name="adapter-ca", now=NOW, validity=timedelta(days=1))
    backend = Backend("127.0.0.1", 0, ca)

    async def echo(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = {k: v for rdn in (peer or {}).get("subject", ()) for k, v in rdn}
        backend.seen.append({
            "method": request.method, "raw_path": request.raw_path,
            "headers": list(request.headers.items()), "peer_cn": subject.get("commonName")})
        if request.path.endswith("/redirect"):
            raise web.HTTPFound("https://elsewhere.example/steal")
        if request.path.endswith("/cors"):
            return web.json_response({}, headers={"Access-Control-Allow-Origin": "*",
                                                  "Access-Control-Allow-Methods": "GET",
                                                  "X-Kept": "yes"})
        if request.path == f"/apis/{GROUP}/v1beta2":
            return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                                      "groupVersion": f"{GROUP}/v1beta2", "resources": [
                                          {"name": "pods/http_requests", "singularName": "",
                                           "namespaced": True, "kind": "MetricValueList",
                                           "verbs": ["get"]}]})
        return web.json_response({"echo": backend.seen[-1]})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    context = await asyncio.to_thread(_serving_context, ca, kube.front_proxy_ca_pem, tmp, names)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.base_events.Server)
    backend.port = server.sockets[0].getsockname()[1]
    return backend, runner


@pytest.fixture
async def backend(fake_kube: FakeKubeAPI, tmp_path: Path) -> AsyncIterator[Backend]:
    started, runner = await _start_backend(fake_kube, tmp_path / "backend",
                                           names=[SERVICE_NAME])
    yield started
    await runner.cleanup()


async def _register(kube: FakeKubeAPI, backend: Backend, *, ca_bundle: bytes | None = None
                    ) -> None:
    kube.create_apiservice(group=GROUP, version="v1beta2", service_namespace=SERVICE[0],
                           service_name=SERVICE[1], version_priority=200,
                           ca_bundle=ca_bundle if ca_bundle is not None
                           else backend.ca.certificate_pem)
    kube.set_service_endpoint(*SERVICE, backend.url_host, backend.port)
    await kube.wait_for_apiservice(f"v1beta2.{GROUP}")


# --- Go encodings ----------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "escaped"), [
    ("/apis/g/v/namespaces/shop/pods/*/http_requests",
     "/apis/g/v/namespaces/shop/pods/%2A/http_requests"),
    ("/a b|c!(d)'e", "/a%20b%7Cc%21%28d%29%27e"),
    ("/keep$&+,:;=@-_.~", "/keep$&+,:;=@-_.~"),
])
def test_paths_are_escaped_as_go_escapes_them(path: str, escaped: str) -> None:
    assert go_escape_path(path) == escaped


def test_queries_are_re_encoded_with_sorted_keys_and_query_escape() -> None:
    pairs = [("labelSelector", "app=web,tier in (a,b)"), ("a", "x/y:z"), ("a", "!")]
    assert go_encode_query(pairs) == (
        "a=x%2Fy%3Az&a=%21&labelSelector=app%3Dweb%2Ctier+in+%28a%2Cb%29")


def test_extra_header_keys_are_escaped_and_canonicalised_as_go_does() -> None:
    key = "X-Remote-Extra-" + escape_header_key("authentication.kubernetes.io/credential-id")
    assert key == "X-Remote-Extra-authentication.kubernetes.io%2Fcredential-id"
    assert canonical_header_key(key) == \
        "X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id"


# --- APIService objects -----------------------------------------------------------------------


async def test_apiservice_validation_follows_upstream(kube_http: KubeHTTPClient) -> None:
    path = "/apis/apiregistration.k8s.io/v1/apiservices"
    both = await kube_http.post(path, {
        "metadata": {"name": f"v1beta1.{GROUP}"},
        "spec": {"group": GROUP, "version": "v1beta1", "insecureSkipTLSVerify": True,
                 "caBundle": "Zm9v", "groupPriorityMinimum": 100, "versionPriority": 100,
                 "service": {"namespace": "x", "name": "y"}}})
    assert both.status == 422
    assert both.json["message"] == (
        f'APIService.apiregistration.k8s.io "v1beta1.{GROUP}" is invalid: '
        "spec.insecureSkipTLSVerify: Invalid value: true: may not be true if caBundle is "
        "present")
    misnamed = await kube_http.post(path, {
        "metadata": {"name": "wrong"},
        "spec": {"group": GROUP, "version": "v1beta1", "insecureSkipTLSVerify": True,
                 "groupPriorityMinimum": 100, "versionPriority": 100,
                 "service": {"namespace": "x", "name": "y"}}})
    assert misnamed.status == 422
    assert misnamed.json["details"]["causes"][0]["field"] == "metadata.name"


async def test_builtin_groups_have_local_apiservices(kube_http: KubeHTTPClient) -> None:
    apps = (await kube_http.get("/apis/apiregistration.k8s.io/v1/apiservices/v1.apps")).json
    assert apps["spec"].get("service") is None
    assert apps["status"]["conditions"][0]["reason"] == "Local"


async def test_aggregated_groups_are_discovered_from_apiservices(
        fake_kube: FakeKubeAPI, backend: Backend, kube_http: KubeHTTPClient) -> None:
    await _register(fake_kube, backend)
    fake_kube.create_apiservice(group=GROUP, version="v1beta1", service_namespace=SERVICE[0],
                                service_name=SERVICE[1], insecure=True, version_priority=100)
    group = (await kube_http.get(f"/apis/{GROUP}")).json
    assert [v["version"] for v in group["versions"]] == ["v1beta2", "v1beta1"]
    assert group["preferredVersion"]["version"] == "v1beta2"
    groups = (await kube_http.get("/apis")).json["groups"]
    assert GROUP in [g["name"] for g in groups]


# --- proxying ----------------------------------------------------------------------------------


async def test_proxy_sends_front_proxy_identity_and_strips_client_headers(
        fake_kube: FakeKubeAPI, backend: Backend) -> None:
    await _register(fake_kube, backend)
    fake_kube.add_user(token="jane-token", username="jane", groups=["team-a", "b, c"],
                       extra={"authentication.kubernetes.io/credential-id": ["JTI=abc"]})
    async with KubeHTTPClient(fake_kube, token="jane-token") as http:
        reply = await http.get(
            f"/apis/{GROUP}/v1beta2/namespaces/shop/pods/*/http_requests",
            params={"labelSelector": "app=web,tier in (a,b)"},
            headers=[("X-Remote-User", "mallory"), ("X-Remote-Group", "system:masters"),
                     ("X-Remote-Extra-Scopes", "all"), ("Accept", "application/json")])
    assert reply.status == 200, reply.text
    echo = reply.json["echo"]
    assert echo["peer_cn"] == "front-proxy-client"
    assert echo["raw_path"] == (f"/apis/{GROUP}/v1beta2/namespaces/shop/pods/%2A/http_requests"
                                "?labelSelector=app%3Dweb%2Ctier+in+%28a%2Cb%29")
    headers = echo["headers"]
    names = [k.lower() for k, _ in headers]
    assert "authorization" not in names
    assert [v for k, v in headers if k == "X-Remote-User"] == ["jane"]
    assert [v for k, v in headers if k == "X-Remote-Group"] == [
        "team-a", "b, c", "system:authenticated"]
    assert [(k, v) for k, v in headers if k.lower().startswith("x-remote-extra-")] == [
        ("X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id", "JTI=abc")]
    assert ("Accept", "application/json") in [tuple(h) for h in headers]


@pytest.mark.parametrize(("path", "header"), [
    ("/apis/g/v1/namespaces/a/pods/*/m", "/apis/g/v1/namespaces/a/pods/*/m"),
    ("/apis/g/v1//x/./y/../z/", "/apis/g/v1/x/z/"),
    ("/", "//"),  # Join gives "/", then the trailing slash is added again
])
def test_forwarded_uri_is_the_joined_decoded_path(path: str, header: str) -> None:
    # apimachinery/pkg/util/proxy/transport.go: path.Join(PathPrepend, URL.Path), slash kept
    assert forwarded_uri(path) == header


async def test_proxy_sets_the_forwarded_headers_replacing_the_clients(
        fake_kube: FakeKubeAPI, backend: Backend, kube_http: KubeHTTPClient) -> None:
    # transport.go Transport.RoundTrip Sets X-Forwarded-Uri/-Host/-Proto for the backend.
    await _register(fake_kube, backend)
    reply = await kube_http.get(f"/apis/{GROUP}/v1beta2/namespaces/a/pods/%2A/m",
                                headers=[("X-Forwarded-Host", "evil.example"),
                                         ("X-Forwarded-Uri", "/nope")])
    assert reply.status == 200, reply.text
    headers = [tuple(h) for h in reply.json["echo"]["headers"]]
    assert ("X-Forwarded-Uri", f"/apis/{GROUP}/v1beta2/namespaces/a/pods/*/m") in headers
    assert ("X-Forwarded-Host", f"127.0.0.1:{backend.port}") in headers
    assert ("X-Forwarded-Proto", "https") in headers
    assert [v for k, v in headers if k == "X-Forwarded-Host"] == [f"127.0.0.1:{backend.port}"]
    assert [v for k, v in headers if k == "X-Forwarded-Uri"] == [
        f"/apis/{GROUP}/v1beta2/namespaces/a/pods/*/m"]


async def test_backend_redirects_are_refused_with_502(
        fake_kube: FakeKubeAPI, backend: Backend, kube_http: KubeHTTPClient) -> None:
    # upgradeaware.go RejectForwardingRedirects (kube-aggregator's default): a 3xx with a
    # Location becomes 502 with a plain-text body; the Location never reaches the client.
    await _register(fake_kube, backend)
    reply = await kube_http.get(f"/apis/{GROUP}/v1beta2/namespaces/a/redirect")
    assert reply.status == 502
    assert reply.text == ("the backend attempted to redirect this request, which is not "
                          "permitted")
    assert reply.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert "Location" not in reply.headers


async def test_backend_cors_headers_are_removed(
        fake_kube: FakeKubeAPI, backend: Backend, kube_http: KubeHTTPClient) -> None:
    # upgradeaware.go corsRemovingTransport.
    await _register(fake_kube, backend)
    reply = await kube_http.get(f"/apis/{GROUP}/v1beta2/namespaces/a/cors")
    assert reply.status == 200
    assert "Access-Control-Allow-Origin" not in reply.headers
    assert "Access-Control-Allow-Methods" not in reply.headers
    assert reply.headers["X-Kept"] == "yes"


async def test_backend_answers_pass_through_unchanged(fake_kube: FakeKubeAPI,
                                                      backend: Backend,
                                                      kube_http: KubeHTTPClient) -> None:
    await _register(fake_kube, backend)
    reply = await kube_http.get(f"/apis/{GROUP}/v1beta2")
    assert reply.status == 200
    assert reply.json["resources"][0]["name"] == "pods/http_requests"
    assert backend.seen[-1]["headers"][0] != ("Authorization", "")


async def test_certificate_not_matching_the_ca_bundle_is_503(
        fake_kube: FakeKubeAPI, backend: Backend, kube_http: KubeHTTPClient) -> None:
    other = pki.generate_ca(common_name="someone-else", now=NOW, validity=timedelta(days=1))
    await _register(fake_kube, backend, ca_bundle=other.certificate_pem)  # still Available
    reply = await kube_http.get(f"/apis/{GROUP}/v1beta2/namespaces/shop/pods/*/x")
    assert reply.status == 503
    assert reply.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert reply.text.startswith("error trying to reach service: tls: failed to verify "
                                 "certificate: x509: certificate signed by unknown authority")


async def test_serving_name_must_match_the_service(fake_kube: FakeKubeAPI,
                                                   tmp_path: Path,
                                                   kube_http: KubeHTTPClient) -> None:
    wrong, runner = await _start_backend(fake_kube, tmp_path / "wrong",
                                         names=["adapter.elsewhere.svc"])
    try:
        await _register(fake_kube, wrong)
        reply = await kube_http.get(f"/apis/{GROUP}/v1beta2/namespaces/shop/pods/*/x")
        assert reply.status == 503
        assert "not valid for metrics-adapter.custom-metrics.svc" in reply.text
    finally:
        await runner.cleanup()


async def test_unavailable_apiservices_answer_503_without_calling_the_backend(
        fake_kube: FakeKubeAPI, backend: Backend, kube_http: KubeHTTPClient) -> None:
    fake_kube.create_apiservice(group=GROUP, version="v1beta2", service_namespace=SERVICE[0],
                                service_name=SERVICE[1], ca_bundle=backend.ca.certificate_pem)
    missing = await fake_kube.wait_for_apiservice(f"v1beta2.{GROUP}", available=False)
    condition = missing["status"]["conditions"][0]
    assert (condition["status"], condition["reason"]) == ("False", "ServiceNotFound")
    reply = await kube_http.get(f"/apis/{GROUP}/v1beta2/namespaces/shop/pods/*/x")
    assert reply.status == 503 and reply.text == "service unavailable\n"
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    fake_kube.set_service_endpoint(*SERVICE, "127.0.0.1", port)  # nothing listens there
    refused = await fake_kube.wait_for_apiservice(f"v1beta2.{GROUP}", available=False,
                                                  reason="FailedDiscoveryCheck")
    failing = refused["status"]["conditions"][0]
    assert failing["reason"] == "FailedDiscoveryCheck"
    assert "connect: connection refused" in failing["message"]
    fake_kube.set_service_endpoint(*SERVICE, backend.url_host, backend.port)
    await fake_kube.wait_for_apiservice(f"v1beta2.{GROUP}")
    checks = [s for s in backend.seen if s["raw_path"] == f"/apis/{GROUP}/v1beta2"]
    assert dict(checks[0]["headers"])["X-Remote-User"] == "system:kube-aggregator"
    assert dict(checks[0]["headers"])["X-Remote-Group"] == "system:masters"


async def test_rotated_front_proxy_ca_is_used_for_new_requests(
        fake_kube: FakeKubeAPI, tmp_path: Path, kube_http: KubeHTTPClient) -> None:
    fake_kube.rotate_front_proxy_ca(keep_old=False)
    # This backend trusts only the new front-proxy CA (it reads the bundle after rotation).
    rotated, runner = await _start_backend(fake_kube, tmp_path / "rotated",
                                           names=[SERVICE_NAME])
    try:
        await _register(fake_kube, rotated)
        reply = await kube_http.get(f"/apis/{GROUP}/v1beta2/namespaces/shop/pods/*/x")
        assert reply.status == 200 and reply.json["echo"]["peer_cn"] == "front-proxy-client"
    finally:
        await runner.cleanup()


@pytest.mark.kubectl
async def test_kubectl_get_raw_through_the_aggregator(fake_kube: FakeKubeAPI,
                                                      backend: Backend,
                                                      tmp_path: Path) -> None:
    kubectl = require_tool("kubectl")
    await _register(fake_kube, backend)
    fake_kube.add_user(token="hpa-token",
                       username="system:serviceaccount:kube-system:horizontal-pod-autoscaler",
                       groups=["system:serviceaccounts", "system:serviceaccounts:kube-system"],
                       extra={"authentication.kubernetes.io/credential-id": ["JTI=7"]})
    kubeconfig = fake_kube.write_kubeconfig(tmp_path / "hpa.kubeconfig", token="hpa-token")
    result = await asyncio.to_thread(
        lambda: __import__("subprocess").run(
            [kubectl, "--kubeconfig", str(kubeconfig), "get", "--raw",
             f"/apis/{GROUP}/v1beta2/namespaces/shop/pods/*/http_requests"
             "?labelSelector=app%3Dweb"],
            capture_output=True, text=True, timeout=60, check=False))
    assert result.returncode == 0, result.stderr
    echo = json.loads(result.stdout)["echo"]
    headers = echo["headers"]
    assert echo["raw_path"].startswith(f"/apis/{GROUP}/v1beta2/namespaces/shop/pods/%2A/")
    assert echo["raw_path"].endswith("?labelSelector=app%3Dweb")
    assert [v for k, v in headers if k == "X-Remote-User"] == [
        "system:serviceaccount:kube-system:horizontal-pod-autoscaler"]
    assert [v for k, v in headers if k == "X-Remote-Group"] == [
        "system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]
    assert dict(headers)["X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id"] == \
        "JTI=7"
    assert "Authorization" not in dict(headers)


@pytest.mark.kubectl
async def test_kubectl_sees_503_for_a_mistrusted_backend(fake_kube: FakeKubeAPI,
                                                         backend: Backend,
                                                         kubeconfig: Path) -> None:
    kubectl = require_tool("kubectl")
    other = pki.generate_ca(common_name="someone-else", now=NOW, validity=timedelta(days=1))
    await _register(fake_kube, backend, ca_bundle=other.certificate_pem)
    result = await asyncio.to_thread(
        lambda: __import__("subprocess").run(
            [kubectl, "--kubeconfig", str(kubeconfig), "get", "--raw",
             f"/apis/{GROUP}/v1beta2/namespaces/shop/pods/*/x"],
            capture_output=True, text=True, timeout=60, check=False))
    assert result.returncode != 0
    assert "ServiceUnavailable" in result.stderr or "unable to handle" in result.stderr


async def test_front_proxy_certificates_for_tests_that_play_the_aggregator(
        fake_kube: FakeKubeAPI) -> None:
    cert, key = fake_kube.front_proxy_client_certificate()
    issued = pki.load_certificate_pem(cert.read_bytes())
    assert issued.subject.rfc4514_string() == "CN=front-proxy-client"
    ca = pki.load_certificate_pem(fake_kube.front_proxy_ca_pem)
    issued.verify_directly_issued_by(ca)
    other_cert, _ = fake_kube.issue_front_proxy_client_certificate(common_name="intruder")
    other = pki.load_certificate_pem(other_cert.read_bytes())
    assert other.subject.rfc4514_string() == "CN=intruder"
    other.verify_directly_issued_by(ca)
    assert key.stat().st_mode & 0o077 == 0
