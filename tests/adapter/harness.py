"""Shared helpers for the adapter's server tests: run the real app over HTTPS against a real
Prometheus and a kube-apiserver, and talk to it as a client would (no tests of its own:
tests/adapter/test_support.py checks the helpers)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from adapter.http.app import (
    OBJECT_CACHES_KEY,
    SNAPSHOTS_KEY,
    create_app,
)
from adapter.prometheus.client import PrometheusClient
from adapter.prometheus.relisting import Relisting
from adapter.rules.config import parse_config
from adapter.security.tls import build_server_context
from adapter.settings import parse_settings
from metricscale import pki
from metricscale.serving import StatusAppRunner
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer

SERVICE_NAME = "metricscale-adapter"
SERVICE_NAMESPACE = "metricscale"
SERVICE_DNS = f"{SERVICE_NAME}.{SERVICE_NAMESPACE}.svc"
HPA_ACCEPT = "application/vnd.kubernetes.protobuf, */*"
RFC3339_SECONDS = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"


@dataclass(frozen=True)
class ServingPair:
    """A CA and a serving certificate for localhost, 127.0.0.1 and the Service's DNS name."""

    ca_file: Path
    ca_pem: bytes
    cert_file: Path
    key_file: Path


def make_serving_pair(directory: Path) -> ServingPair:
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC) - timedelta(minutes=5)
    ca = pki.generate_ca(common_name="adapter-test-ca", now=now, validity=timedelta(days=2))
    leaf = pki.issue_serving_certificate(
        ca, common_name="metricscale-adapter", dns_names=("localhost", SERVICE_DNS),
        ip_addresses=("127.0.0.1",), now=now, validity=timedelta(days=2))
    ca_file = pki.write_certificate(directory / "ca.crt", ca.certificate)
    cert_file = pki.write_certificate(directory / "tls.crt", leaf.certificate)
    key_file = pki.write_private_key(directory / "tls.key", leaf.private_key)
    return ServingPair(ca_file, pki.certificate_pem(ca.certificate), cert_file, key_file)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.body[:400]!r})"


@dataclass
class RunningAdapter:
    app: web.Application
    url: str
    port: int
    pair: ServingPair
    session: aiohttp.ClientSession
    fatal: list[BaseException] = field(default_factory=list)

    @property
    def relister(self) -> Relisting:
        """The discovery of the configuration in use (a reload replaces it)."""
        return self.app[SNAPSHOTS_KEY].current.discovery

    @property
    def prometheus(self) -> PrometheusClient:
        return self.app[SNAPSHOTS_KEY].current.backends.default

    @property
    def object_caches(self) -> Any:
        return self.app[OBJECT_CACHES_KEY]

    async def request(self, path: str, *, method: str = "GET", accept: str | None = None,
                      headers: Mapping[str, str] | None = None,
                      params: Sequence[tuple[str, str]] | None = None) -> Reply:
        """`path` is sent as written (percent-encoding kept); `params` are encoded here."""
        sent = dict(headers or {})
        if accept is not None:
            sent["Accept"] = accept
        url = URL(self.url + path, encoded=True)
        if params:
            url = url.extend_query(params)
        async with self.session.request(method, url, headers=sent) as response:
            return Reply(response.status, dict(response.headers), await response.read())

    async def get(self, path: str, **kwargs: Any) -> Reply:
        return await self.request(path, **kwargs)

    async def wait_ready(self, *, within: float = 120.0) -> None:
        deadline = time.monotonic() + within
        last: Reply | None = None
        while time.monotonic() < deadline:
            last = await self.get("/readyz?verbose")
            if last.status == 200:
                return
            if self.fatal:
                raise AssertionError(f"the adapter failed: {self.fatal!r}")
            await asyncio.sleep(0.05)
        raise AssertionError(f"the adapter did not become ready in {within}s: {last}")


def client_ssl_context(ca_file: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_file))


def _write_config(workdir: Path, config_text: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "config.yaml"
    config_file.write_text(config_text)
    return config_file


@contextlib.asynccontextmanager
async def running_adapter(*, workdir: Path, config_text: str, prometheus_url: str,
                          kubeconfig: Path, args: Sequence[str] = (),
                          clock: Callable[[], float] = time.time,
                          wait_ready: bool = True,
                          pair: ServingPair | None = None) -> AsyncIterator[RunningAdapter]:
    """The adapter app, started on 127.0.0.1:<free port> over TLS; cleaned up on exit.

    Relister runs once at start; the relist interval is an hour (unless `args` says otherwise)
    so tests drive further passes themselves with `adapter.relister.step()`.
    """
    config_file = _write_config(workdir, config_text)
    settings = parse_settings(["--config", str(config_file), "--prometheus-url", prometheus_url,
                               "--kubeconfig", str(kubeconfig),
                               "--metrics-relist-interval", "1h", *args])
    pair = pair or make_serving_pair(workdir / "tls")
    fatal: list[BaseException] = []
    app = create_app(settings=settings, config=parse_config(config_text), clock=clock,
                     on_fatal=fatal.append)
    runner = StatusAppRunner(app, handle_signals=False, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=build_server_context(
            cert_file=pair.cert_file, key_file=pair.key_file))
        await site.start()
        server = site._server
        assert server is not None
        port = int(server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        connector = aiohttp.TCPConnector(ssl=client_ssl_context(pair.ca_file), limit=200)
        async with aiohttp.ClientSession(connector=connector) as session:
            adapter = RunningAdapter(app, f"https://127.0.0.1:{port}", port, pair, session,
                                     fatal)
            if wait_ready:
                await adapter.wait_ready()
            yield adapter
            assert not fatal, f"a background task of the adapter failed: {fatal!r}"
    finally:
        await runner.cleanup()


async def wait_for_series(prometheus: PrometheusServer, promql: str, count: int,
                          *, within: float = 120.0) -> None:
    """Until `promql` returns exactly `count` series (the exporter has been scraped)."""
    await prometheus.wait_for_async(promql, lambda samples: len(samples) == count,
                                    timeout=within)


def set_series(exporter: Exporter, name: str, series: Sequence[tuple[Mapping[str, str], float]],
               ) -> None:
    for labels, value in series:
        exporter.set(name, labels, value)
