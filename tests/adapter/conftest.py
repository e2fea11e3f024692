"""Fixtures of the adapter's tests that run against the session's real control plane.

`cluster` is the module's view of it (namespaces and cluster-scoped names of its own, the
adapter's account under its manifests' RBAC), and `kubectl_binary` the kubectl the control
plane was built with: the prologue every end-to-end module had in its own words.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.binaries import find_peer
from testbed.controlplane import ControlPlane
from testbed.pytest_plugin import require_peers
from tests.adapter.cluster import ModuleCluster, Names


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest,
            control_plane: ControlPlane) -> Iterator[ModuleCluster]:
    names = getattr(request.module, "NAMES", None)  # a module naming its objects at import
    if names is None:
        stem = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
        names = Names.unique(stem.replace("_", "-")[:20])
    module = ModuleCluster(control_plane, names)
    try:
        yield module
    finally:
        module.close()


@pytest.fixture(scope="session")
def kubectl_binary() -> str:
    """The kubectl of the peers (the control plane's own version)."""
    require_peers("kubectl")
    found = find_peer("kubectl")
    assert found is not None
    return str(found)
