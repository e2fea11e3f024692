"""Fixtures of the tests on the real control plane: metricscale installed from its manifests."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.controlplane import ControlPlane, Kubelet
from testbed.fakes.prometheus import PrometheusServer
from testbed.install import Installation


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
