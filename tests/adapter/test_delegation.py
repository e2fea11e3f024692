"""Delegation to another metrics adapter: identity headers, merged discovery, the flags, the
delegate client over real TLS, and an adapter passing on the custom metrics it does not serve.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from adapter.api.delegated import (
    DelegateListError,
    delegate_unavailable,
    merge_resource_lists,
    read_resource_list,
)
from adapter.auth.authentication import extra_from_headers
from adapter.auth.forwarding import identity_headers
from adapter.auth.users import UserInfo
from adapter.http.delegate import DelegateClient, DelegateConfigError, DelegateUnavailable
from adapter.settings import (
    AdapterSettingsError,
    DelegationSettings,
    add_arguments,
    settings_from_args,
)
from metricscale import pki
from testbed.fakes.prometheus import ExporterPool, PrometheusServer
from tests.adapter.cluster import ModuleCluster, pod_manifest
from tests.adapter.harness import (
    HPA_ACCEPT,
    make_serving_pair,
    running_adapter,
    wait_for_series,
)

CUSTOM = "/apis/custom.metrics.k8s.io"
PROXY_CN = "metricscale-delegation"


# --------------------------------------------------------------------------------------------
# Identity headers (pure)


def test_identity_headers_are_written_as_the_aggregator_writes_them() -> None:
    user = UserInfo(name="alice", uid="u-1", groups=("a, b", "system:authenticated"),
                    extra={"scopes": ("x", "y"), "example.org/Team Name%": ("blue",)})
    assert identity_headers(user) == (
        ("X-Remote-User", "alice"), ("X-Remote-Uid", "u-1"),
        ("X-Remote-Group", "a, b"), ("X-Remote-Group", "system:authenticated"),
        ("X-Remote-Extra-Example.org%2fteam%20name%25", "blue"),
        ("X-Remote-Extra-Scopes", "x"), ("X-Remote-Extra-Scopes", "y"))


def test_extra_keys_survive_the_receivers_decoding() -> None:
    extra = {"authentication.kubernetes.io/credential-id": ("JTI=abc",),
             "weird key%é": ("1", "2")}
    sent = identity_headers(UserInfo(name="bob", extra=extra))
    assert extra_from_headers(sent, ("x-remote-extra-",)) == extra


def test_a_user_without_uid_groups_or_extra_sends_only_the_user() -> None:
    assert identity_headers(UserInfo(name="system:anonymous")) == (
        ("X-Remote-User", "system:anonymous"),)


# --------------------------------------------------------------------------------------------
# Discovery merging (pure)


def _list(*names: str, group_version: str = "external.metrics.k8s.io/v1beta1",
          ) -> dict[str, Any]:
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": [{"name": name, "namespaced": True, "kind": "ExternalMetricValueList",
                           "verbs": ["get"]} for name in names]}


def test_merged_discovery_lists_ours_first_and_drops_their_duplicates() -> None:
    ours = _list("queueLength", "b")
    theirs = read_resource_list(json.dumps(_list("externalmetric", "b", "externalmetric"))
                                .encode(), group_version="external.metrics.k8s.io/v1beta1")
    merged = merge_resource_lists(ours, theirs)
    assert [r["name"] for r in merged["resources"]] == ["queueLength", "b", "externalmetric"]
    assert merged["groupVersion"] == ours["groupVersion"]
    assert [r["name"] for r in ours["resources"]] == ["queueLength", "b"]  # not modified
    folded = merge_resource_lists(ours, [{"name": "queuelength"}, {"name": "B"}],
                                  fold_case=True)
    assert [r["name"] for r in folded["resources"]] == ["queueLength", "b"]


@pytest.mark.parametrize(("body", "why"), [
    (b"<html>", "not JSON"),
    (b'{"kind": "Status"}', "not an APIResourceList"),
    (json.dumps(_list("a", group_version="external.metrics.k8s.io/v1beta2")).encode(),
     "not 'external.metrics.k8s.io/v1beta1'"),
    (b'{"kind": "APIResourceList", "groupVersion": "external.metrics.k8s.io/v1beta1", '
     b'"resources": [{"kind": "x"}]}', "has no name"),
])
def test_an_unusable_delegate_list_is_refused(body: bytes, why: str) -> None:
    with pytest.raises(DelegateListError, match=why):
        read_resource_list(body, group_version="external.metrics.k8s.io/v1beta1")


def test_the_unavailable_status_names_the_metric_not_the_delegate() -> None:
    body = delegate_unavailable(group="external.metrics.k8s.io", metric="s0-prometheus",
                                why="connection refused")
    assert (body["code"], body["reason"], body["details"]) == (
        503, "ServiceUnavailable", {"retryAfterSeconds": 5})
    assert body["message"] == ("unable to fetch metrics: the adapter that serves s0-prometheus "
                               "(external.metrics.k8s.io) did not answer: connection refused")


# --------------------------------------------------------------------------------------------
# Flags


def _settings(*flags: str) -> DelegationSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--config", "c.yaml", "--prometheus-url", "http://p:9090",
                              *flags])
    return settings_from_args(args).delegation


CERT = ("--delegate-client-cert-file", "c.crt", "--delegate-client-key-file", "c.key")


def test_delegation_flags_are_read() -> None:
    delegation = _settings("--delegate-external-to",
                           "https://keda-operator-metrics-apiserver.keda.svc:443/",
                           "--delegate-ca-file", "ca.crt", "--delegate-timeout", "3s", *CERT)
    assert delegation == DelegationSettings(
        external_url="https://keda-operator-metrics-apiserver.keda.svc", custom_url=None,
        ca_file="ca.crt", client_cert_file="c.crt", client_key_file="c.key", timeout=3.0)
    assert delegation.enabled
    assert not _settings().enabled


@pytest.mark.parametrize(("flags", "message"), [
    (("--delegate-external-to", "http://keda:443", *CERT), "must be an https:// URL"),
    (("--delegate-custom-to", "https://a.b.svc/apis", *CERT), "no path, query or credentials"),
    (("--delegate-custom-to", "https://u:p@a.b.svc", *CERT), "no path, query or credentials"),
    (("--delegate-external-to", "https://keda.svc"), "needs --delegate-client-cert-file"),
    (("--delegate-external-to", "https://keda.svc", "--delegate-client-cert-file", "c.crt"),
     "go together"),
    (("--delegate-ca-file", "ca.crt"), "--delegate-ca-file needs --delegate-external-to"),
    (("--delegate-external-to", "https://keda.svc", "--delegate-timeout", "0s", *CERT),
     "--delegate-timeout must be positive"),
])
def test_unusable_delegation_flags_are_one_line_errors(flags: tuple[str, ...],
                                                       message: str) -> None:
    with pytest.raises(AdapterSettingsError, match=message) as raised:
        _settings(*flags)
    assert "\n" not in str(raised.value)


# --------------------------------------------------------------------------------------------
# The delegate client, over TLS


@dataclass
class Recorded:
    path: str
    query: str
    headers: list[tuple[str, str]]
    client_cn: str | None


@dataclass
class FakeDelegate:
    """A recording HTTPS server; `answer` decides each response."""

    port: int
    ca_file: Path
    client_cert: Path
    client_key: Path
    seen: list[Recorded] = field(default_factory=list)
    answer: Callable[[web.Request], web.Response] = lambda _: web.Response(status=404)

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}"

    def settings(self, *, timeout: float = 5.0, external: bool = True,
                 custom: bool = True) -> DelegationSettings:
        return DelegationSettings(
            external_url=self.url if external else None, custom_url=self.url if custom else None,
            ca_file=str(self.ca_file), client_cert_file=str(self.client_cert),
            client_key_file=str(self.client_key), timeout=timeout)


@contextlib.asynccontextmanager
async def fake_delegate(directory: Path) -> AsyncIterator[FakeDelegate]:
    pair = make_serving_pair(directory / "delegate-tls")
    now = datetime.now(UTC) - timedelta(minutes=5)
    proxy_ca = pki.generate_ca(common_name="proxy-ca", now=now, validity=timedelta(days=1))
    leaf = pki.issue_client_certificate(proxy_ca, user=PROXY_CN, now=now,
                                        validity=timedelta(days=1))
    client_cert = pki.write_certificate(directory / "client.crt", leaf.certificate)
    client_key = pki.write_private_key(directory / "client.key", leaf.private_key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(pair.cert_file), str(pair.key_file))
    context.verify_mode = ssl.CERT_OPTIONAL
    context.load_verify_locations(cadata=pki.certificate_pem(proxy_ca.certificate).decode())
    delegate = FakeDelegate(0, pair.ca_file, client_cert, client_key)

    async def handle(request: web.Request) -> web.StreamResponse:
        transport = request.transport
        peer = transport.get_extra_info("peercert") if transport is not None else None
        cn = next((value for rdn in (peer or {}).get("subject", ()) for key, value in rdn
                   if key == "commonName"), None)
        delegate.seen.append(Recorded(request.rel_url.raw_path,
                                      request.rel_url.raw_query_string,
                                      list(request.headers.items()), cn))
        return delegate.answer(request)

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    server = site._server
    assert server is not None
    delegate.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
    try:
        yield delegate
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def started(settings: DelegationSettings,
                  registry: CollectorRegistry | None = None) -> AsyncIterator[DelegateClient]:
    client = DelegateClient(settings, registry=registry or CollectorRegistry())
    await client.start()
    try:
        yield client
    finally:
        await client.close()


CALLER = UserInfo(name="system:serviceaccount:kube-system:horizontal-pod-autoscaler",
                  groups=("system:serviceaccounts", "system:authenticated"))


async def test_a_request_is_passed_on_with_its_path_query_accept_and_identity(
        tmp_path: Path) -> None:
    async with fake_delegate(tmp_path) as delegate, started(delegate.settings()) as client:
        def protobuf(_: web.Request) -> web.Response:
            response = web.Response(status=418, body=b"\x6b\x38\x73\x00raw",
                                    headers={"Warning": '299 - "from the delegate"'})
            response.headers["Content-Type"] = "application/vnd.kubernetes.protobuf"
            return response

        delegate.answer = protobuf
        path = "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/s0-prometheus"
        query = "labelSelector=scaledobject.keda.sh%2Fname%3Dweb"
        answer = await client.forward(
            "external.metrics.k8s.io", raw_path=path, raw_query=query, user=CALLER,
            headers=[("Accept", HPA_ACCEPT), ("Authorization", "Bearer secret"),
                     ("X-Remote-User", "mallory"), ("Audit-Id", "a-1")])
    assert (answer.status, answer.body, answer.content_type) == (
        418, b"\x6b\x38\x73\x00raw", "application/vnd.kubernetes.protobuf")
    assert answer.headers == (("Warning", '299 - "from the delegate"'),)
    [seen] = delegate.seen
    assert (seen.path, seen.query, seen.client_cn) == (path, query, PROXY_CN)
    sent = [(k.lower(), v) for k, v in seen.headers]
    assert ("accept", HPA_ACCEPT) in sent and ("audit-id", "a-1") in sent
    assert [v for k, v in sent if k == "x-remote-user"] == [CALLER.name]
    assert [v for k, v in sent if k == "x-remote-group"] == list(CALLER.groups)
    assert not [k for k, _ in sent if k == "authorization"]


async def test_a_delegate_that_does_not_answer_is_unavailable_and_counted(
        tmp_path: Path) -> None:
    async with fake_delegate(tmp_path) as delegate:
        settings = delegate.settings()
    registry = CollectorRegistry()
    async with started(settings, registry) as client:
        with pytest.raises(DelegateUnavailable) as raised:
            await client.forward("external.metrics.k8s.io", raw_path="/apis/x", raw_query="",
                                 user=CALLER, headers=())
        assert raised.value.why == "connection refused"
        assert await client.resource_list("custom.metrics.k8s.io", "v1beta2",
                                          user=CALLER) == ()
    assert registry.get_sample_value("metricscale_delegated_requests_total", {
        "group": "external.metrics.k8s.io", "request": "metric",
        "outcome": "unavailable"}) == 1
    assert registry.get_sample_value("metricscale_delegated_requests_total", {
        "group": "custom.metrics.k8s.io", "request": "discovery",
        "outcome": "unavailable"}) == 1


async def test_a_slow_delegate_times_out(tmp_path: Path) -> None:
    never = asyncio.Event()

    async def stall(_: web.Request) -> web.Response:
        await never.wait()
        return web.Response()

    async with fake_delegate(tmp_path) as delegate:
        pair = make_serving_pair(tmp_path / "stall-tls")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(pair.cert_file), str(pair.key_file))
        stall_app = web.Application()
        stall_app.router.add_get("/{tail:.*}", stall)
        runner = web.AppRunner(stall_app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        server = site._server
        assert server is not None
        port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        slow = DelegationSettings(
            external_url=f"https://localhost:{port}", ca_file=str(pair.ca_file),
            client_cert_file=str(delegate.client_cert),
            client_key_file=str(delegate.client_key), timeout=0.3)
        try:
            async with started(slow) as client:
                with pytest.raises(DelegateUnavailable) as raised:
                    await client.forward("external.metrics.k8s.io", raw_path="/apis/x",
                                         raw_query="", user=CALLER, headers=())
        finally:
            never.set()
            await runner.cleanup()
    assert raised.value.why == "timed out"


async def test_a_delegate_with_an_untrusted_certificate_is_unavailable(tmp_path: Path) -> None:
    async with fake_delegate(tmp_path) as delegate:
        other = make_serving_pair(tmp_path / "other-ca")
        settings = DelegationSettings(
            external_url=delegate.url, ca_file=str(other.ca_file),
            client_cert_file=str(delegate.client_cert),
            client_key_file=str(delegate.client_key))
        async with started(settings) as client:
            with pytest.raises(DelegateUnavailable) as raised:
                await client.forward("external.metrics.k8s.io", raw_path="/apis/x",
                                     raw_query="", user=CALLER, headers=())
    assert raised.value.why == "its serving certificate could not be verified"
    assert not delegate.seen


async def test_a_missing_client_certificate_file_is_a_config_error(tmp_path: Path) -> None:
    settings = DelegationSettings(external_url="https://keda.svc",
                                  client_cert_file=str(tmp_path / "missing.crt"),
                                  client_key_file=str(tmp_path / "missing.key"))
    with pytest.raises(DelegateConfigError, match=r"^--delegate-client-cert-file: no such file"):
        await DelegateClient(settings, registry=CollectorRegistry()).start()


async def test_discovery_of_a_delegate_without_that_version_is_empty(tmp_path: Path) -> None:
    async with fake_delegate(tmp_path) as delegate, started(delegate.settings()) as client:
        delegate.answer = lambda _: web.json_response({"kind": "Status", "code": 404},
                                                      status=404)
        assert await client.resource_list("custom.metrics.k8s.io", "v1beta2",
                                          user=CALLER) == ()
        delegate.answer = lambda _: web.Response(text="not json")
        assert await client.resource_list("custom.metrics.k8s.io", "v1beta2",
                                          user=CALLER) == ()


# --------------------------------------------------------------------------------------------
# An adapter delegating custom.metrics.k8s.io (real Prometheus, fake cluster)

CUSTOM_CONFIG = """
rules:
- seriesQuery: '{{__name__="dlg_requests",job="{job}",namespace!="",pod!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
"""


@pytest.mark.prometheus
async def test_an_adapter_passes_on_only_the_custom_metrics_it_does_not_serve(
        tmp_path: Path, prometheus: PrometheusServer, exporter_pool: ExporterPool,
        cluster: ModuleCluster) -> None:
    shop = cluster.namespace("shop")
    cluster.control_plane.apply(pod_manifest("web-0", shop, labels={"app": "web"}))
    with exporter_pool.exporter() as exporter:
        exporter.set("dlg_requests", {"namespace": shop, "pod": "web-0"}, 3)
        await wait_for_series(prometheus, f'dlg_requests{{job="{exporter.job}"}}', 1)
        async with fake_delegate(tmp_path) as delegate:

            def answer(request: web.Request) -> web.Response:
                if request.path == f"{CUSTOM}/v1beta2":
                    return web.json_response(_list(
                        "pods/dlg_requests", "pods/their_metric",
                        group_version="custom.metrics.k8s.io/v1beta2"))
                return web.json_response({"kind": "MetricValueList", "from": "delegate"})

            delegate.answer = answer
            args = ["--delegate-custom-to", delegate.url,
                    "--delegate-ca-file", str(delegate.ca_file),
                    "--delegate-client-cert-file", str(delegate.client_cert),
                    "--delegate-client-key-file", str(delegate.client_key)]
            async with running_adapter(
                    workdir=tmp_path / "adapter", args=args,
                    config_text=CUSTOM_CONFIG.format(job=exporter.job),
                    prometheus_url=prometheus.url,
                    kubeconfig=cluster.adapter_kubeconfig()) as adapter:
                ours = await adapter.get(
                    f"{CUSTOM}/v1beta2/namespaces/{shop}/pods/%2A/dlg_requests"
                    "?labelSelector=app%3Dweb", accept=HPA_ACCEPT)
                assert ours.status == 200, ours
                assert ours.json()["items"][0]["value"] == "3"
                assert not [s for s in delegate.seen if "dlg_requests" in s.path]

                theirs_path = (f"{CUSTOM}/v1beta2/namespaces/{shop}/pods/%2A/their_metric"
                               "?labelSelector=app%3Dweb&metricLabelSelector=a%3Db")
                theirs = await adapter.get(theirs_path, accept=HPA_ACCEPT)
                assert theirs.status == 200, theirs
                assert theirs.json() == {"kind": "MetricValueList", "from": "delegate"}
                seen = delegate.seen[-1]
                assert f"{seen.path}?{seen.query}" == theirs_path
                # --insecure-disable-auth is not set, but the harness allows every caller:
                # the anonymous identity is what is passed on.
                assert ("X-Remote-User", "system:anonymous") in seen.headers

                listed = await adapter.get(f"{CUSTOM}/v1beta2")
                assert listed.status == 200, listed
                names = [r["name"] for r in listed.json()["resources"]]
                assert names[-1] == "pods/their_metric"  # theirs after ours
                assert names.count("pods/dlg_requests") == 1  # the clash listed once, ours

                # External metrics are not delegated: ours (none) answer 404.
                external = await adapter.get(
                    f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{shop}/s0-prometheus")
                assert external.status == 404, external
