"""Leases on the real kube-apiserver: two electors, takeover, conflicts, release on the wire
(each elector's requests through the fault proxy, which records them; no fault is injected)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.controller.leader import LeaderElectionConfig, LeaderElector
from autoscaler.decision.leadership import LeaseSpec
from autoscaler.kube.operations import KubeClient
from metricscale.kube import errors
from metricscale.kube.http import open_kube_http
from testbed.controlplane import ControlPlane
from testbed.faultproxy import FaultProxy

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
LEASE = "metricscale-autoscaler"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def clients(control_plane: ControlPlane, fault_proxy: FaultProxy
                  ) -> AsyncIterator[tuple[KubeClient, KubeClient]]:
    """Two replicas: each its own HTTP session (own connection pool), one kube-apiserver."""
    configuration = control_plane.api_client_configuration(server=fault_proxy.server)
    async with open_kube_http(configuration) as first, \
            open_kube_http(configuration) as second:
        yield (KubeClient(first, registry=CollectorRegistry(), reporting_instance="a"),
               KubeClient(second, registry=CollectorRegistry(), reporting_instance="b"))


def lease_path(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}"


def stored(cluster: ControlPlane, namespace: str) -> dict[str, Any]:
    lease: dict[str, Any] = cluster.get(lease_path(namespace))
    return lease


def stored_lease(cluster: ControlPlane, namespace: str) -> dict[str, Any]:
    spec: dict[str, Any] = stored(cluster, namespace)["spec"]
    return spec


def electors(clients: tuple[KubeClient, KubeClient], clock: Clock, namespace: str
             ) -> tuple[LeaderElector, LeaderElector]:
    config = LeaderElectionConfig(resource_name=LEASE, resource_namespace=namespace)
    return (LeaderElector(clients[0], config=config, identity="a", namespace=namespace,
                          clock=clock),
            LeaderElector(clients[1], config=config, identity="b", namespace=namespace,
                          clock=clock))


async def test_first_replica_creates_the_lease_with_micro_times(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        clients: tuple[KubeClient, KubeClient], clock: Clock) -> None:
    a, b = electors(clients, clock, namespace)
    assert await a.try_acquire_or_renew() is True
    assert await b.try_acquire_or_renew() is False
    spec = stored_lease(control_plane, namespace)
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert spec["acquireTime"] == spec["renewTime"] == "2024-05-01T12:00:00.000000Z"
    assert fault_proxy.requests_to("/leases$", method="POST")


async def test_renewal_is_a_put_with_the_resource_version(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        clients: tuple[KubeClient, KubeClient], clock: Clock) -> None:
    a, _ = electors(clients, clock, namespace)
    await a.try_acquire_or_renew()
    clock.advance(2.000001)
    assert await a.try_acquire_or_renew() is True
    spec = stored_lease(control_plane, namespace)
    assert spec["renewTime"] == "2024-05-01T12:00:02.000001Z"
    assert spec["acquireTime"] == "2024-05-01T12:00:00.000000Z"
    assert [r.method for r in fault_proxy.requests_to(f"/leases/{LEASE}$")] == [
        "GET", "GET", "PUT"]


async def test_standby_takes_over_after_the_leader_stops_renewing(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        clients: tuple[KubeClient, KubeClient], clock: Clock) -> None:
    a, b = electors(clients, clock, namespace)
    await a.try_acquire_or_renew()
    await b.try_acquire_or_renew()
    clock.advance(10)
    assert not a.guard.is_leader  # a's renew deadline passed: it stops writing at once
    clock.advance(5)
    assert await b.try_acquire_or_renew() is True
    spec = stored_lease(control_plane, namespace)
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    assert spec["acquireTime"] == "2024-05-01T12:00:15.000000Z"
    assert await a.try_acquire_or_renew() is False
    assert b.guard.is_leader and not a.guard.is_leader


async def test_concurrent_replace_with_one_resource_version_conflicts(
        namespace: str, clients: tuple[KubeClient, KubeClient]) -> None:
    first, second = clients
    spec = LeaseSpec("a", 15, T0, T0, 0)
    await first.create_lease(namespace=namespace, name=LEASE, spec=spec)
    with pytest.raises(errors.AlreadyExists):
        await second.create_lease(namespace=namespace, name=LEASE,
                                  spec=LeaseSpec("b", 15, T0, T0, 0))
    seen_by_a = await first.read_lease(namespace=namespace, name=LEASE)
    seen_by_b = await second.read_lease(namespace=namespace, name=LEASE)
    assert seen_by_a is not None and seen_by_b is not None
    await first.replace_lease(seen_by_a, spec=LeaseSpec("a", 15, T0, T0 + timedelta(seconds=2), 0))
    with pytest.raises(errors.Conflict) as caught:
        await second.replace_lease(seen_by_b, spec=LeaseSpec("b", 15, T0, T0, 1))
    assert "the object has been modified" in str(caught.value)


async def test_release_on_shutdown_lets_the_standby_take_over_at_once(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        clients: tuple[KubeClient, KubeClient], clock: Clock) -> None:
    a, b = electors(clients, clock, namespace)
    await a.try_acquire_or_renew()
    await b.try_acquire_or_renew()
    clock.advance(1)
    assert await a.release() is True
    spec = stored_lease(control_plane, namespace)
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"]) == ("", 1)
    assert isinstance(spec["renewTime"], str) and MICRO.match(spec["renewTime"])
    assert await b.try_acquire_or_renew() is True
    assert stored_lease(control_plane, namespace)["leaseTransitions"] == 1


async def test_lease_keeps_its_labels_across_renewals(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        clients: tuple[KubeClient, KubeClient], clock: Clock) -> None:
    control_plane.apply({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": namespace, "labels": {"app": "metricscale"}},
        "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 4}})
    a, _ = electors(clients, clock, namespace)
    assert await a.try_acquire_or_renew() is True
    lease = stored(control_plane, namespace)
    assert lease["metadata"]["labels"] == {"app": "metricscale"}
    assert lease["spec"]["leaseTransitions"] == 5
