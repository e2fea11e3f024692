"""Shared pytest configuration: the fixtures of the shared test doubles, the product's
Kubernetes session pointed at the fake, and how tests are spread over pytest-xdist's workers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from metricscale.kube.http import KubeHTTP, open_kube_http
from testbed.fakes.kube_api import FakeKubeAPI

pytest_plugins = [
    "testbed.fakes.kube_fixtures",
    "testbed.fakes.prometheus_fixtures",
    "testbed.pytest_plugin",
]


@pytest.fixture
async def kube_session(fake_kube: FakeKubeAPI) -> AsyncIterator[KubeHTTP]:
    """The product's KubeHTTP (admin token) to the fake, closed after the test."""
    async with open_kube_http(fake_kube.api_client_configuration(),
                              user_agent="metricscale-tests") as http:
        yield http


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`, the tests of a module that share a module-scoped fixture (an
    adapter, a control plane of their own, an oracle's world) go to one worker, so that it is
    set up once; session-scoped ones are set up once per worker whatever happens."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None or item.get_closest_marker("xdist_group") is not None:
            continue
        if any(definition.scope in ("module", "package", "class")
               for definitions in info.name2fixturedefs.values()
               for definition in definitions):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
