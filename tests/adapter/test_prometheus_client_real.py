"""The Prometheus client against a real Prometheus (scraped series) and a recording proxy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from adapter.prometheus.client import (
    PrometheusClient,
    PrometheusQueryError,
    PrometheusUnavailable,
    UnexpectedResultType,
    Vector,
)
from adapter.settings import PrometheusSettings
from metricscale.core.selectors import quote_go_string
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer
from testbed.fakes.prometheus_fixtures import PrometheusFactory

pytestmark = pytest.mark.prometheus


@dataclass
class Forwarded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class RecordingProxy:
    """Forwards /prom/api/v1/* to Prometheus' /api/v1/*, recording each request.

    `required_authorization`, when set, is the only Authorization value let through (401
    otherwise); `gate`, when set, holds every request until it opens.
    """

    upstream: str
    url: str = ""
    seen: list[Forwarded] = field(default_factory=list)
    required_authorization: str | None = None
    gate: asyncio.Event | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(Forwarded(request.method, request.path, dict(request.headers), body))
        self.arrived.set()
        if (self.required_authorization is not None
                and request.headers.get("Authorization") != self.required_authorization):
            return web.json_response({"status": "error", "errorType": "unauthorized",
                                      "error": "no"}, status=401)
        if self.gate is not None:
            await self.gate.wait()
        assert self.session is not None
        target = self.upstream + request.path.removeprefix("/prom")
        headers = {"Content-Type": request.headers.get("Content-Type", "")}
        async with self.session.request(request.method, target, params=request.query,
                                        data=body, headers=headers) as upstream:
            return web.Response(status=upstream.status, body=await upstream.read(),
                                content_type="application/json")

    async def received(self, count: int) -> None:
        async with asyncio.timeout(10):
            while len(self.seen) < count:
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture
async def proxy(aiohttp_server: Any, prometheus: PrometheusServer,
                ) -> AsyncIterator[RecordingProxy]:
    recording = RecordingProxy(upstream=prometheus.url)
    app = web.Application()
    app.router.add_route("*", "/prom/api/v1/{endpoint}", recording.handle)
    server = await aiohttp_server(app)
    recording.url = f"http://127.0.0.1:{server.port}/prom"
    async with aiohttp.ClientSession() as session:
        recording.session = session
        yield recording
        if recording.gate is not None:
            recording.gate.set()


@contextlib.asynccontextmanager
async def client_for(url: str, **settings: Any) -> AsyncIterator[PrometheusClient]:
    async with PrometheusClient(PrometheusSettings(url=url, **settings),
                                registry=CollectorRegistry()) as client:
        yield client


async def scraped(prometheus: PrometheusServer, exporter: Exporter, series: str) -> None:
    await prometheus.wait_for_scrape_async(exporter, series=series)


@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_scraped_series_are_queried(prometheus: PrometheusServer, exporter: Exporter,
                                          method: str) -> None:
    exporter.set("msc_requests", {"pod": "web-1", "namespace": "shop"}, 5)
    exporter.set("msc_requests", {"pod": "web-2", "namespace": "shop"}, 7)
    selector = f'msc_requests{{job="{exporter.job}"}}'
    await scraped(prometheus, exporter, selector)
    async with client_for(prometheus.url, method=method) as client:
        result = await client.query(f"sum by (pod) ({selector})", at=time.time())
    assert isinstance(result, Vector)
    assert sorted((s.labels["pod"], s.value) for s in result.samples) == [
        ("web-1", "5"), ("web-2", "7")]


async def test_a_2000_name_regex_goes_through_by_post(prometheus: PrometheusServer,
                                                      exporter: Exporter) -> None:
    for i in range(0, 2000, 400):
        exporter.set("msc_pod_load", {"pod": f"worker-{i:04d}-abcdefghij"}, i)
    selector = f'msc_pod_load{{job="{exporter.job}"}}'
    await scraped(prometheus, exporter, selector)
    names = "|".join(f"worker-{i:04d}-abcdefghij" for i in range(2000))
    query = f'sum by (pod) (msc_pod_load{{job="{exporter.job}",pod=~"{names}"}})'
    assert len(query) > 40_000
    async with client_for(prometheus.url) as client:
        result = await client.query(query, at=time.time())
    assert isinstance(result, Vector)
    assert len(result.samples) == 5


async def test_hostile_label_values_reach_prometheus_intact(prometheus: PrometheusServer,
                                                            exporter: Exporter) -> None:
    hostile = 'a"b\\c\n"}) or vector(1) # \u00e9\u6f22 |.*'
    exporter.set("msc_hostile", {"pod": hostile}, 3)
    exporter.set("msc_hostile", {"pod": "innocent"}, 4)
    await scraped(prometheus, exporter, f'msc_hostile{{job="{exporter.job}"}}')
    query = f"msc_hostile{{job={quote_go_string(exporter.job)},pod={quote_go_string(hostile)}}}"
    async with client_for(prometheus.url) as client:
        result = await client.query(query, at=time.time())
    assert isinstance(result, Vector)
    (sample,) = result.samples
    assert sample.labels["pod"] == hostile
    assert sample.value == "3"


async def test_identical_queries_in_flight_reach_prometheus_once(
        prometheus: PrometheusServer, exporter: Exporter, proxy: RecordingProxy) -> None:
    exporter.set("msc_shared", {"pod": "p"}, 1)
    selector = f'msc_shared{{job="{exporter.job}"}}'
    await scraped(prometheus, exporter, selector)
    proxy.gate = asyncio.Event()
    async with client_for(proxy.url) as client:
        now = time.time()
        waiters = [asyncio.create_task(client.query(selector, at=now)) for _ in range(10)]
        await proxy.received(1)
        proxy.gate.set()
        results = await asyncio.gather(*waiters)
    assert len(proxy.seen) == 1
    assert all(r == results[0] for r in results)
    assert isinstance(results[0], Vector) and results[0].samples[0].value == "1"


async def test_headers_and_bearer_token_reach_the_backend_and_rotate(
        prometheus: PrometheusServer, proxy: RecordingProxy, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("token-one\n")
    proxy.required_authorization = "Bearer token-one"
    async with client_for(proxy.url, bearer_token_file=str(token),
                          headers=(("X-Scope-OrgID", "tenant-a"),)) as client:
        assert isinstance(await client.query("vector(1)", at=time.time()), Vector)
        fresh = tmp_path / "token.new"
        fresh.write_text("token-two\n")
        os.replace(fresh, token)
        proxy.required_authorization = "Bearer token-two"
        assert isinstance(await client.query("vector(2)", at=time.time()), Vector)
    assert [s.headers["X-Scope-OrgID"] for s in proxy.seen] == ["tenant-a", "tenant-a"]
    assert [s.path for s in proxy.seen] == ["/prom/api/v1/query"] * 2


async def test_basic_auth_reaches_the_backend(prometheus: PrometheusServer,
                                              proxy: RecordingProxy, tmp_path: Path) -> None:
    (tmp_path / "password").write_text("pa:ss")
    proxy.required_authorization = "Basic dXNlcjpwYTpzcw=="  # user:pa:ss
    async with client_for(proxy.url, basic_auth_username="user",
                          basic_auth_password_file=str(tmp_path / "password")) as client:
        assert isinstance(await client.query("vector(1)", at=time.time()), Vector)


async def test_a_wrong_token_is_a_query_error_not_an_outage(prometheus: PrometheusServer,
                                                           proxy: RecordingProxy,
                                                           tmp_path: Path) -> None:
    (tmp_path / "token").write_text("wrong")
    proxy.required_authorization = "Bearer right"
    async with client_for(proxy.url, bearer_token_file=str(tmp_path / "token")) as client:
        with pytest.raises(PrometheusQueryError) as caught:
            await client.query("vector(1)", at=time.time())
    assert caught.value.status == 401
    assert "wrong" not in str(caught.value) and "wrong" not in caught.value.detail


async def test_series_lists_scraped_label_sets(prometheus: PrometheusServer,
                                               exporter: Exporter) -> None:
    exporter.set("msc_discovered", {"pod": "a", "namespace": "n"}, 1)
    exporter.set("msc_discovered", {"pod": "b", "namespace": "n"}, 1)
    selector = f'msc_discovered{{job="{exporter.job}"}}'
    await scraped(prometheus, exporter, selector)
    async with client_for(prometheus.url) as client:
        found = [labels async for labels in client.series([selector], start=time.time() - 60)]
    assert sorted(labels["pod"] for labels in found) == ["a", "b"]
    assert all(labels["__name__"] == "msc_discovered" for labels in found)


async def test_bad_promql_and_range_results_are_query_errors(
        prometheus: PrometheusServer) -> None:
    async with client_for(prometheus.url) as client:
        with pytest.raises(PrometheusQueryError) as bad:
            await client.query("sum(", at=time.time())
        with pytest.raises(UnexpectedResultType):
            await client.query("up[1m]", at=time.time())
    assert bad.value.reason == "bad_data" and bad.value.status == 400


async def test_a_hung_then_stopped_prometheus_is_unavailable(
        prometheus_factory: PrometheusFactory) -> None:
    server = prometheus_factory()
    async with client_for(server.url, timeout=0.5) as client:
        assert isinstance(await client.query("vector(1)", at=time.time()), Vector)
        server.pause()
        try:
            with pytest.raises(PrometheusUnavailable) as hung:
                await client.query("vector(2)", at=time.time())
        finally:
            server.resume()
        await asyncio.to_thread(server.stop)
        with pytest.raises(PrometheusUnavailable) as stopped:
            await client.query("vector(3)", at=time.time())
    assert hung.value.reason == "timeout"
    assert stopped.value.reason == "connection"
