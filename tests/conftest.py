"""Shared pytest configuration: the fixtures of the real control plane and the test doubles
(plugins), and how tests are spread over pytest-xdist's workers."""

from __future__ import annotations

import pytest

pytest_plugins = [
    "testbed.fakes.kube_fixtures",
    "testbed.fakes.prometheus_fixtures",
    "testbed.pytest_plugin",
]


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
