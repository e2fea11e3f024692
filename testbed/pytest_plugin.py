"""Pytest fixtures of the real control plane: one per session, shared by the tests that use it.

Tests share the cluster as they would share a real one: each works in a namespace of its own
(`namespace`), and cluster-scoped objects carry names no other test uses. Every test that uses
the control plane is marked `cluster`, so a run can leave them out (`-m "not cluster"`).
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from metricscale.kube.http import KubeHTTP, open_kube_http
from testbed.binaries import missing_peers, where
from testbed.controlplane import ControlPlane, Kubelet
from testbed.fakes.prometheus import PrometheusServer
from testbed.faultproxy import FaultProxy
from testbed.install import Installation

__all__ = ["control_plane", "fault_proxy", "installation", "kubelet", "namespace",
           "proxied_kube_http", "pytest_collection_modifyitems", "require_peers"]

_NAMESPACES = itertools.count(1)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `cluster` every test whose fixtures reach the control plane."""
    for item in items:
        if "control_plane" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require_peers(*names: str) -> None:
    """Skip the test when a peer binary is missing; fail instead under CI=true."""
    missing = missing_peers(names)
    if not missing:
        return
    message = f"{', '.join(missing)} not found; looked in {where()}"
    if _in_ci():
        pytest.fail(f"{message}; CI=true forbids skipping", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler for the session."""
    require_peers("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                  "kubectl")
    # The HPA sync period the autoscaler tests use too (upstream default 15s; faster tests).
    with ControlPlane(hpa_sync_period="5s") as cluster:
        print(f"\ncontrol plane started in {cluster.startup_seconds:.1f} s at {cluster.server}")
        yield cluster


@pytest.fixture(scope="session")
def kubelet(control_plane: ControlPlane) -> Kubelet:
    """The kubelet stand-in with two Ready nodes, node-a and node-b."""
    return control_plane.start_kubelet(("node-a", "node-b"))


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A namespace of the test's own, deleted afterwards (not waited for)."""
    name = f"t{os.getpid()}-{next(_NAMESPACES)}"
    control_plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    control_plane.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


@pytest.fixture
def fault_proxy(control_plane: ControlPlane) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the session's kube-apiserver (token clients only)."""
    with FaultProxy(control_plane) as proxy:
        yield proxy


@pytest.fixture
async def proxied_kube_http(control_plane: ControlPlane,
                            fault_proxy: FaultProxy) -> AsyncIterator[KubeHTTP]:
    """The product's Kubernetes client with the admin's token, through `fault_proxy` (closed
    before the proxy stops)."""
    configuration = control_plane.api_client_configuration(server=fault_proxy.server)
    async with open_kube_http(configuration, user_agent="metricscale-tests") as http:
        yield http


@pytest.fixture(scope="session")
def installation(control_plane: ControlPlane, kubelet: Kubelet,
                 prometheus: PrometheusServer) -> Iterator[Installation]:
    """metricscale installed from its manifests on the session's control plane (the adapter
    reading the session's Prometheus, which scrapes the kubelet stand-in), once a session."""
    prometheus.add_target(kubelet.address, job="kubelet")
    with tempfile.TemporaryDirectory(prefix="metricscale-install-") as workdir:
        installed = Installation(cluster=control_plane, workdir=Path(workdir),
                                 prometheus_url=prometheus.url)
        try:
            installed.install()
            yield installed
        finally:
            installed.stop()
