"""Shared pytest configuration: the fixtures of the real control plane and the test doubles
(plugins), and the order in which pytest-xdist hands the modules out."""

from __future__ import annotations

import pytest

pytest_plugins = [
    "testbed.fakes.kube_fixtures",
    "testbed.fakes.prometheus_fixtures",
    "testbed.pytest_plugin",
]


# The modules that wait longest (sync periods, scrape intervals, stabilization windows), with
# about how many seconds their tests take together on a quiet machine: they are handed out
# first, so that none of them starts last and keeps the run waiting on one worker. Rough figures
# for the order only (`pytest --durations=0` gives them); a module missing here merely starts
# later.
LONGEST_FIRST = {
    "tests/differential/test_metrics_server.py": 230,
    "tests/cluster/test_upstream_hpa_twins.py": 190,
    "tests/cluster/test_shadow.py": 180,
    "tests/cluster/test_migrate.py": 110,
    "tests/cli/test_demo.py": 110,
    "tests/cluster/test_demo_cluster.py": 80,
    "tests/differential/test_prometheus_adapter_oracle.py": 55,
    "tests/adapter/test_kubectl_top.py": 40,
    "tests/cluster/test_autoscaler_features_on_cluster.py": 35,
    "tests/cluster/test_doctor.py": 35,
    "tests/cluster/test_metrics_on_cluster.py": 35,
    "tests/autoscaler/test_server.py": 35,
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of LONGEST_FIRST first, longest first; the others as collected. The stages
    run with `--dist loadscope --no-loadscope-reorder` (Makefile): each module goes whole to one
    pytest-xdist worker, so a module-scoped fixture (an adapter, a control plane of its own, a
    world of servers) is set up once, in this order. (Not `--dist loadgroup`: with pytest 9.2
    its groups are silently ignored, pytest-dev/pytest-xdist#1386.)"""
    items.sort(key=lambda item: -LONGEST_FIRST.get(item.nodeid.split("::")[0], 0))
