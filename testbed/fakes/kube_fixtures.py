"""Pytest fixtures for the fake Kubernetes API server (testbed.fakes.kube_api.FakeKubeAPI)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.kube_http import KubeHTTPClient

__all__ = ["fake_kube", "kube_api_client", "kube_http", "kubeconfig"]


@pytest.fixture
async def fake_kube(tmp_path: Path) -> AsyncIterator[FakeKubeAPI]:
    """A started fake kube-apiserver with a private workdir (certificates are generated once
    per process, so start-up takes a few milliseconds). Availability re-checks back off to at
    most 0.5 s instead of kube-aggregator's 30 s so tests converge quickly."""
    async with FakeKubeAPI(workdir=tmp_path / "fake-kube", availability_max_backoff=0.5) as kube:
        yield kube


@pytest.fixture
def kubeconfig(fake_kube: FakeKubeAPI, tmp_path: Path) -> Path:
    """A kubeconfig with the admin token, for kubectl and kubernetes_asyncio."""
    return fake_kube.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
async def kube_api_client(fake_kube: FakeKubeAPI) -> AsyncIterator[Any]:
    """A kubernetes_asyncio ApiClient (admin) for the fake, closed after the test."""
    from kubernetes_asyncio.client import ApiClient

    async with ApiClient(configuration=fake_kube.api_client_configuration()) as client:
        yield client


@pytest.fixture
async def kube_http(fake_kube: FakeKubeAPI) -> AsyncIterator[KubeHTTPClient]:
    """A raw HTTP client (admin token) for wire-level assertions against the fake."""
    async with KubeHTTPClient(fake_kube) as client:
        yield client
