"""KubeHTTP, the one HTTP path of both programs: proxies chosen once (kubeconfig proxy-url, else
HTTP(S)_PROXY/NO_PROXY), kept-alive connections, headers and the token refresh hook.

The server is the session's real kube-apiserver (`control_plane`). Where a test must see what
arrived at the server (the headers, the token), it goes through the fault proxy in front of it,
here also recording each request's headers (`HeaderRecordingProxy`); which user a token is, the
server itself tells (a SelfSubjectReview). Tokens are service accounts' (the admin's is
kube-system/testbed-admin's), from the TokenRequest API. Where the real server differs from the
fake these tests were first written against, the comment at the place says how.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from yarl import URL

from metricscale.kube.http import KubeHTTP, open_kube_http
from testbed.controlplane import ControlPlane
from testbed.faultproxy import FaultProxy

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


@dataclass(frozen=True)
class Arrived:
    """A request as it arrived at the fault proxy: method, path, headers (as sent) but the
    Authorization, which is kept apart and out of the repr, so that no failure prints a token."""

    method: str
    path: str
    headers: dict[str, str]
    authorization: str | None = field(default=None, repr=False)


class HeaderRecordingProxy(FaultProxy):
    """The fault proxy, also recording each request's headers (the Authorization too)."""

    def __init__(self, cluster: ControlPlane) -> None:
        super().__init__(cluster)
        self.arrived: list[Arrived] = []

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            headers = dict(request.headers)
            self.arrived.append(Arrived(request.method, request.path, headers,
                                        headers.pop("Authorization", None)))
        return await super()._handle(request)

    def arrived_at(self, path: str) -> list[Arrived]:
        with self._lock:
            return [r for r in self.arrived if r.path == path]


@pytest.fixture
def header_proxy(control_plane: ControlPlane) -> Iterator[HeaderRecordingProxy]:
    proxy = HeaderRecordingProxy(control_plane)
    with proxy:
        yield proxy


SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


async def who_am_i(http: KubeHTTP) -> str:
    """The user the server takes this KubeHTTP's current token for."""
    response = await http.request(
        "POST", SELF_SUBJECT_REVIEWS, content_type="application/json",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert response.status == 201, response.body
    return str(json.loads(response.body)["status"]["userInfo"]["username"])


async def test_requests_go_through_the_https_proxy_with_its_credentials_on_one_tunnel(
        control_plane: ControlPlane, connect_proxy: ConnectProxy) -> None:
    authority = connect_proxy.url.replace("http://", "http://me:secret@")
    async with open_kube_http(control_plane.api_client_configuration(),
                              proxies={"https": authority}) as http:
        for _ in range(5):
            response = await http.request("GET", "/api/v1/namespaces/default")
            assert response.status == 200
    (head,) = connect_proxy.heads  # five requests, one kept-alive connection
    assert head.startswith(f"CONNECT 127.0.0.1:{URL(control_plane.server).port} HTTP/1.1")
    assert "Proxy-Authorization: Basic bWU6c2VjcmV0" in head


async def test_no_proxy_sends_requests_straight_to_the_api_server(
        control_plane: ControlPlane, connect_proxy: ConnectProxy) -> None:
    async with open_kube_http(control_plane.api_client_configuration(),
                              proxies={"https": connect_proxy.url, "no": "127.0.0.1"}) as http:
        assert (await http.request("GET", "/api/v1/namespaces/default")).status == 200
    assert connect_proxy.heads == []


async def test_headers_name_the_client_and_carry_a_content_type_only_with_a_body(
        control_plane: ControlPlane, namespace: str,
        header_proxy: HeaderRecordingProxy) -> None:
    admin_token = control_plane.admin_token()
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    async with open_kube_http(control_plane.api_client_configuration(server=header_proxy.server),
                              proxies={}, user_agent="metricscale-test/1") as http:
        assert (await http.request("GET", configmaps)).status == 200
        created = await http.request(
            "POST", configmaps, content_type="application/json",
            body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
        assert created.status == 201
        # The fake named the user it authenticated on each request; the real server is asked
        # which user the admin's token is.
        assert await who_am_i(http) == "system:serviceaccount:kube-system:testbed-admin"
    listed, posted = header_proxy.arrived_at(configmaps)
    assert (listed.method, posted.method) == ("GET", "POST")
    for arrived in (listed, posted):
        assert arrived.headers["User-Agent"] == "metricscale-test/1"
        assert arrived.headers["Accept"] == "application/json"
        # The fake recorded "<redacted>"; the proxy sees the bearer token itself. Compared into
        # a boolean first, so that a failure does not print the token.
        is_admins = arrived.authorization == f"Bearer {admin_token}"
        assert is_admins, f"{arrived.method}: not the admin's bearer token"
    assert "Content-Type" not in listed.headers
    assert posted.headers["Content-Type"] == "application/json"


async def test_a_rotated_token_is_used_from_the_next_request_on(
        control_plane: ControlPlane, namespace: str) -> None:
    # The fake took any token added to it; the real server's are two service accounts' tokens.
    first = control_plane.service_account_token(namespace, "first")
    second = control_plane.service_account_token(namespace, "second")
    configuration = control_plane.api_client_configuration(token=first)
    refreshed: list[str] = []

    def refresh(config: Any) -> None:
        # What the in-cluster loader's hook does when the projected token file changed.
        if refreshed:
            config.api_key["BearerToken"] = refreshed[-1]

    configuration.refresh_api_key_hook = refresh
    async with KubeHTTP(configuration, user_agent="test", proxies={}) as http:
        # The fake let these users read namespace default and recorded who asked; on the real
        # server they have no such right (403), so each request asks who it is instead.
        users = [await who_am_i(http)]
        refreshed.append(second)
        users.append(await who_am_i(http))
    assert users == [f"system:serviceaccount:{namespace}:first",
                     f"system:serviceaccount:{namespace}:second"]
