"""A thin fault-injecting proxy in front of the real kube-apiserver.

What a real server cannot be made to do on demand, this proxy does to the requests that match a
fault: answer 429 with Retry-After, answer a 5xx Status, wait before forwarding, close the
connection without an answer, or start a watch's answer and then send nothing. Every other
request is forwarded unchanged (headers, body, and the answer streamed back as it comes, so
watches work), and every request is recorded.

Clients authenticate with bearer tokens (a service account's, from the TokenRequest API), which
the proxy passes on: kube-apiserver still authenticates and authorizes each request. The proxy
serves HTTPS with a certificate of the cluster's CA for 127.0.0.1 and localhost, so a kubeconfig
for it differs from one for kube-apiserver only in the server address.

It runs its own event loop in a thread, so sync and async tests drive it alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from metricscale import pki
from testbed.controlplane import ControlPlane
from testbed.faults import (
    DropConnection,
    Fault,
    FaultAction,
    Latency,
    ServerError,
    StallWatch,
    TooManyRequests,
)
from testbed.processes import free_port

__all__ = ["DropConnection", "Fault", "FaultAction", "FaultProxy", "Latency", "RecordedRequest",
           "ServerError", "StallWatch", "TooManyRequests"]

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
               "trailers", "transfer-encoding", "upgrade", "host", "content-length"}


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: str
    user_agent: str
    status: int
    fault: FaultAction | None = None
    at: datetime = field(default_factory=lambda: datetime.now(UTC))


class FaultProxy:
    """`with FaultProxy(cluster) as proxy:`; `proxy.server` is its URL."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.cluster = cluster
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.faults: list[Fault] = []
        self.recorded: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault proxy",
                                        daemon=True)
        self._runner: web.AppRunner | None = None
        self._release: asyncio.Event | None = None
        self._session: aiohttp.ClientSession | None = None
        now = datetime.now(UTC) - timedelta(minutes=5)
        serving = pki.issue_serving_certificate(
            cluster.ca, common_name="fault-proxy", dns_names=["localhost"],
            ip_addresses=["127.0.0.1"], now=now, validity=timedelta(days=30))
        self._cert = pki.write_certificate(cluster.dir / f"fault-proxy-{self.port}.crt",
                                           serving.certificate)
        self._key = pki.write_private_key(cluster.dir / f"fault-proxy-{self.port}.key",
                                          serving.private_key)

    # ---- faults ---------------------------------------------------------------------------

    def add_fault(self, path: str, action: FaultAction, *, method: str | None = None,
                  times: int | None = 1) -> Fault:
        """Injects `action` on the next `times` requests (None: all) matching `path`."""
        fault = Fault(pattern=re.compile(path), action=action, method=method, remaining=times)
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        """No new fault; stalled watches are released (their connections closed)."""
        with self._lock:
            self.faults.clear()
        self._call(self._release_stalled())

    def requests_to(self, path: str, *, method: str | None = None) -> list[RecordedRequest]:
        pattern = re.compile(path)
        with self._lock:
            return [r for r in self.recorded if pattern.search(r.path)
                    and (method is None or r.method == method.upper())]

    def _take_fault(self, method: str, path: str) -> FaultAction | None:
        with self._lock:
            for fault in self.faults:
                if fault.matches(method, path):
                    fault.hits += 1
                    if fault.remaining is not None:
                        fault.remaining -= 1
                    return fault.action
        return None

    def write_kubeconfig(self, name: str, token: str, *, path: Path | None = None) -> Path:
        """A kubeconfig for this proxy with a bearer token."""
        target = path or self.cluster.dir / f"kubeconfig-proxy-{name}"
        self.cluster.write_kubeconfig(name, token, path=target)
        target.write_text(target.read_text().replace(self.cluster.server, self.server))
        return target

    # ---- serving --------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        fault = self._take_fault(request.method, request.path_qs)
        # Each request is recorded before its answer leaves, so a client that has its answer
        # finds it recorded.
        if isinstance(fault, Latency):
            await asyncio.sleep(fault.seconds)
        elif isinstance(fault, TooManyRequests):
            self._record(request, 429, fault)
            return self._status(429, "TooManyRequests", "the fault proxy throttled it",
                                headers={"Retry-After": str(fault.retry_after)})
        elif isinstance(fault, ServerError):
            self._record(request, fault.code, fault)
            return self._status(fault.code, "InternalError",
                                fault.message or "injected by the test's fault proxy")
        elif isinstance(fault, DropConnection):
            self._record(request, 0, fault)
            if request.transport is not None:
                request.transport.close()
            raise ConnectionResetError("dropped by the fault proxy")
        elif isinstance(fault, StallWatch):
            self._record(request, 200, fault)
            return await self._stall(request)
        return await self._forward(request, fault)

    def _record(self, request: web.Request, status: int, fault: FaultAction | None) -> None:
        with self._lock:
            self.recorded.append(RecordedRequest(
                method=request.method, path=request.path, query=request.query_string,
                user_agent=request.headers.get("User-Agent", ""), status=status, fault=fault))

    @staticmethod
    def _status(code: int, reason: str, message: str,
                headers: dict[str, str] | None = None) -> web.Response:
        return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                  "status": "Failure", "message": message, "reason": reason,
                                  "code": code}, status=code, headers=headers)

    async def _stall(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={
            "Content-Type": "application/json", "Cache-Control": "no-cache, private"})
        await response.prepare(request)
        # Held until the faults are cleared, or the client hangs up (aiohttp then cancels this
        # handler: handler_cancellation).
        assert self._release is not None
        await self._release.wait()
        return response

    async def _release_stalled(self) -> None:
        if self._release is not None:
            self._release.set()
        self._release = asyncio.Event()

    async def _forward(self, request: web.Request,
                       fault: FaultAction | None) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        body = await request.read()
        context = ssl.create_default_context(cafile=str(self.cluster.ca_file))
        async with self._session.request(
                request.method, self.cluster.server + request.path_qs, headers=headers,
                data=body or None, ssl=context, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)) as upstream:
            self._record(request, upstream.status, fault)
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP})
            await response.prepare(request)
            with contextlib.suppress(ConnectionResetError):
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            return response

    # ---- lifecycle ------------------------------------------------------------------------

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=60)

    async def _start(self) -> None:
        self._release = asyncio.Event()
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # A stopping proxy has nothing to finish: a watch still open through it is cut at
        # once (aiohttp's default waits 60 s for such a handler, and its client meanwhile
        # sits on a silent watch).
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=0.1)
        await self._runner.setup()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self._cert), str(self._key))
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=context).start()

    async def _stop(self) -> None:
        if self._release is not None:
            self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def start(self) -> None:
        self._thread.start()
        self._call(self._start())

    def stop(self) -> None:
        if self._thread.is_alive():
            self._call(self._stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def faults_hit(self) -> Iterator[tuple[Fault, int]]:
        with self._lock:
            yield from ((fault, fault.hits) for fault in self.faults)
