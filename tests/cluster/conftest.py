"""Fixtures of the tests on the real control plane: metricscale installed from its manifests.
Every test here is marked `cluster` (some start control planes of their own)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.controlplane import ControlPlane, Kubelet
from testbed.fakes.prometheus import PrometheusServer
from testbed.install import Installation

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def installation(control_plane: ControlPlane, kubelet: Kubelet,
                 prometheus: PrometheusServer) -> Iterator[Installation]:
    prometheus.add_target(kubelet.address, job="kubelet")
    with tempfile.TemporaryDirectory(prefix="metricscale-install-") as workdir:
        installed = Installation(cluster=control_plane, workdir=Path(workdir),
                                 prometheus_url=prometheus.url)
        try:
            installed.install()
            yield installed
        finally:
            installed.stop()
