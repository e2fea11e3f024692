"""Pytest fixtures for the real Prometheus test double: a session server, exporters, a factory.

Every test that uses them is marked `prometheus`, so a run can leave them out."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import pytest

from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import ExporterPool, MetricFamily, PrometheusServer, find_promtool
from testbed.fakes.tools import require_tool


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `prometheus` every test whose fixtures reach a Prometheus or promtool binary (both
    come with Debian's package, which `make test` installs only after its fast stage)."""
    wanted = {"prometheus_binary", "promtool_binary", "promtool"}
    for item in items:
        if wanted & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.prometheus)


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """Path of prometheus ($PROMETHEUS or the PATH); skips locally, fails under CI=true."""
    return require_tool("prometheus", env_var="PROMETHEUS")


@pytest.fixture(scope="session")
def promtool_binary(prometheus_binary: str) -> str:
    """Path of promtool ($PROMTOOL, beside prometheus, or the PATH); skips locally, fails in CI."""
    return find_promtool(prometheus_binary) or require_tool("promtool", env_var="PROMTOOL")


@pytest.fixture(scope="session")
def prometheus(prometheus_binary: str) -> Iterator[PrometheusServer]:
    """One Prometheus for the whole session, scraping every second. Tests share it: use the
    `exporter` fixture (a job of its own) and label values no other test uses."""
    with PrometheusServer(binary=prometheus_binary) as server:
        yield server


@pytest.fixture(scope="session")
def exporter_pool(prometheus: PrometheusServer) -> Iterator[ExporterPool]:
    pool = ExporterPool(prometheus)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def exporter(exporter_pool: ExporterPool) -> Iterator[Exporter]:
    """A fresh, empty exporter that the session Prometheus already scrapes, under a job label
    no other test gets (`exporter.job`); deregistered and closed after the test."""
    with exporter_pool.exporter() as leased:
        yield leased


class PrometheusFactory:
    """Makes Prometheus servers of a test's own (backfilled, stopped mid-test, ...) and closes
    them all at the end of the test."""

    def __init__(self, request: pytest.FixtureRequest, binary: str) -> None:
        self._request = request
        self._binary = binary
        self._servers: list[PrometheusServer] = []

    def __call__(
        self,
        *,
        backfill: Iterable[MetricFamily] | None = None,
        start: bool = True,
        lookback_delta: str = "5m",
        extra_args: Sequence[str] = (),
    ) -> PrometheusServer:
        """A new server; `backfill` families are loaded with promtool before it starts."""
        promtool: str | None = None
        if backfill is not None:
            promtool = self._request.getfixturevalue("promtool_binary")
        server = PrometheusServer(
            binary=self._binary,
            promtool=promtool,
            lookback_delta=lookback_delta,
            extra_args=extra_args,
        )
        self._servers.append(server)
        if backfill is not None:
            server.backfill(backfill)
        if start:
            server.start()
        return server

    def close(self) -> None:
        while self._servers:
            self._servers.pop().close()


@pytest.fixture
def prometheus_factory(
    request: pytest.FixtureRequest, prometheus_binary: str
) -> Iterator[PrometheusFactory]:
    factory = PrometheusFactory(request, prometheus_binary)
    try:
        yield factory
    finally:
        factory.close()
