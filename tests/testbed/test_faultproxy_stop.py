"""The fault proxy stops at once even while a watch is open through it: its client sees the
connection end (a stopped proxy is a dropped connection), instead of a silent watch while
aiohttp waits out its 60 s shutdown for the handler."""

from __future__ import annotations

import asyncio

import aiohttp

from metricscale.kube.http import open_kube_http
from testbed.controlplane import ControlPlane
from testbed.faultproxy import FaultProxy


async def test_stopping_the_proxy_ends_a_watch_open_through_it(
        control_plane: ControlPlane, namespace: str) -> None:
    proxy = FaultProxy(control_plane)
    proxy.start()
    try:
        configuration = control_plane.api_client_configuration(server=proxy.server)
        async with open_kube_http(configuration) as http:
            path = f"/api/v1/namespaces/{namespace}/pods"
            async with http.stream(path, query=[("watch", "true")]) as response:
                assert response.status == 200
                await asyncio.to_thread(proxy.stop)
                # The stream ends (or breaks) once the proxy is gone; before the fix, stop()
                # itself took a minute and the stream stayed open with nothing on it.
                try:
                    async for _ in response.content:
                        pass
                except (aiohttp.ClientError, ConnectionError):
                    pass
        assert any(r.path == path for r in proxy.recorded)
    finally:
        proxy.stop()
