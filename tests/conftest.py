"""Shared pytest configuration: the fixtures of the shared test doubles, and the product's
Kubernetes session pointed at the fake."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from metricscale.kube.http import KubeHTTP, open_kube_http
from testbed.fakes.kube_api import FakeKubeAPI

pytest_plugins = [
    "testbed.fakes.kube_fixtures",
    "testbed.fakes.prometheus_fixtures",
    "testbed.pytest_plugin",
    "tests.autoscaler.fake_cluster",
]


@pytest.fixture
async def kube_session(fake_kube: FakeKubeAPI) -> AsyncIterator[KubeHTTP]:
    """The product's KubeHTTP (admin token) to the fake, closed after the test."""
    async with open_kube_http(fake_kube.api_client_configuration(),
                              user_agent="metricscale-tests") as http:
        yield http
