"""KubeHTTP, the one HTTP path of both programs: proxies chosen once (kubeconfig proxy-url, else
HTTP(S)_PROXY/NO_PROXY), kept-alive connections, headers and the token refresh hook."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from yarl import URL

from metricscale.kube.http import KubeHTTP, open_kube_http
from testbed.fakes.kube_api import ADMIN_USER, FakeKubeAPI

# --- over real sockets -----------------------------------------------------------------------


@dataclass
class ConnectProxy:
    """A minimal HTTP CONNECT proxy on 127.0.0.1 that records each tunnel's request head."""

    heads: list[str] = field(default_factory=list)
    server: asyncio.Server | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        self.heads.append(head)
        host, _, port = head.split(" ", 2)[1].rpartition(":")
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while chunk := await source.read(65536):
                    sink.write(chunk)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))


@pytest.fixture
async def connect_proxy() -> AsyncIterator[ConnectProxy]:
    proxy = ConnectProxy()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        proxy.tasks.add(task)
        try:
            await proxy.handle(reader, writer)
        finally:
            proxy.tasks.discard(task)

    proxy.server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield proxy
    finally:
        proxy.server.close()
        for task in list(proxy.tasks):
            task.cancel()
        await asyncio.gather(*proxy.tasks, return_exceptions=True)
        await proxy.server.wait_closed()


async def test_requests_go_through_the_https_proxy_with_its_credentials_on_one_tunnel(
        fake_kube: FakeKubeAPI, connect_proxy: ConnectProxy) -> None:
    authority = connect_proxy.url.replace("http://", "http://me:secret@")
    async with open_kube_http(fake_kube.api_client_configuration(),
                              proxies={"https": authority}) as http:
        for _ in range(5):
            response = await http.request("GET", "/api/v1/namespaces/default")
            assert response.status == 200
    (head,) = connect_proxy.heads  # five requests, one kept-alive connection
    assert head.startswith(f"CONNECT 127.0.0.1:{URL(fake_kube.url).port} HTTP/1.1")
    assert "Proxy-Authorization: Basic bWU6c2VjcmV0" in head


async def test_no_proxy_sends_requests_straight_to_the_api_server(
        fake_kube: FakeKubeAPI, connect_proxy: ConnectProxy) -> None:
    async with open_kube_http(fake_kube.api_client_configuration(),
                              proxies={"https": connect_proxy.url, "no": "127.0.0.1"}) as http:
        assert (await http.request("GET", "/api/v1/namespaces/default")).status == 200
    assert connect_proxy.heads == []


async def test_headers_name_the_client_and_carry_a_content_type_only_with_a_body(
        fake_kube: FakeKubeAPI) -> None:
    async with open_kube_http(fake_kube.api_client_configuration(), proxies={},
                              user_agent="metricscale-test/1") as http:
        await http.request("GET", "/api/v1/namespaces/default/configmaps")
        created = await http.request(
            "POST", "/api/v1/namespaces/default/configmaps", content_type="application/json",
            body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
    assert created.status == 201
    listed, posted = fake_kube.requests_to("^/api/v1/namespaces/default/configmaps$")
    for recorded in (listed, posted):
        headers = dict(recorded.headers)
        assert headers["User-Agent"] == "metricscale-test/1"
        assert headers["Accept"] == "application/json"
        assert headers["Authorization"] == "<redacted>"
        assert recorded.user == ADMIN_USER  # the bearer token was sent
    assert "Content-Type" not in dict(listed.headers)
    assert dict(posted.headers)["Content-Type"] == "application/json"


async def test_a_rotated_token_is_used_from_the_next_request_on(fake_kube: FakeKubeAPI) -> None:
    fake_kube.add_user(token="first", username="first-user")
    fake_kube.add_user(token="second", username="second-user")
    configuration = fake_kube.api_client_configuration(token="first")
    refreshed: list[str] = []

    def refresh(config: Any) -> None:
        # What the in-cluster loader's hook does when the projected token file changed.
        if refreshed:
            config.api_key["BearerToken"] = refreshed[-1]

    configuration.refresh_api_key_hook = refresh
    async with KubeHTTP(configuration, user_agent="test", proxies={}) as http:
        await http.request("GET", "/api/v1/namespaces/default")
        refreshed.append("second")
        await http.request("GET", "/api/v1/namespaces/default")
    users = [r.user for r in fake_kube.requests_to("^/api/v1/namespaces/default$")]
    assert users == ["first-user", "second-user"]
