"""Leases through the fake API server: two electors, takeover, conflicts, release on the wire."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.controller.leader import LeaderElectionConfig, LeaderElector
from autoscaler.decision.leadership import LeaseSpec
from autoscaler.kube.operations import KubeClient
from metricscale.kube import errors
from metricscale.kube.http import open_kube_http
from testbed.fakes.kube_api import FakeKubeAPI

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
CONFIG = LeaderElectionConfig(resource_name="metricscale-autoscaler", resource_namespace="ops")


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
async def clients(fake_kube: FakeKubeAPI) -> AsyncIterator[tuple[KubeClient, KubeClient]]:
    """Two replicas: each its own HTTP session (own connection pool), one fake API server."""
    async with open_kube_http(fake_kube.api_client_configuration()) as first, \
            open_kube_http(fake_kube.api_client_configuration()) as second:
        yield (KubeClient(first, registry=CollectorRegistry(), reporting_instance="a"),
               KubeClient(second, registry=CollectorRegistry(), reporting_instance="b"))


def stored_lease(fake_kube: FakeKubeAPI) -> dict[str, object]:
    lease = fake_kube.store.try_get("coordination.k8s.io", "v1", "leases",
                                    "metricscale-autoscaler", namespace="ops")
    assert lease is not None
    spec: dict[str, object] = lease["spec"]
    return spec


def electors(clients: tuple[KubeClient, KubeClient], clock: Clock
             ) -> tuple[LeaderElector, LeaderElector]:
    return (LeaderElector(clients[0], config=CONFIG, identity="a", namespace="ops", clock=clock),
            LeaderElector(clients[1], config=CONFIG, identity="b", namespace="ops", clock=clock))


async def test_first_replica_creates_the_lease_with_micro_times(
        fake_kube: FakeKubeAPI, clients: tuple[KubeClient, KubeClient], clock: Clock) -> None:
    a, b = electors(clients, clock)
    assert await a.try_acquire_or_renew() is True
    assert await b.try_acquire_or_renew() is False
    spec = stored_lease(fake_kube)
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert spec["acquireTime"] == spec["renewTime"] == "2024-05-01T12:00:00.000000Z"
    assert fake_kube.requests_to("/leases$", method="POST")


async def test_renewal_is_a_put_with_the_resource_version(
        fake_kube: FakeKubeAPI, clients: tuple[KubeClient, KubeClient], clock: Clock) -> None:
    a, _ = electors(clients, clock)
    await a.try_acquire_or_renew()
    clock.advance(2.000001)
    assert await a.try_acquire_or_renew() is True
    spec = stored_lease(fake_kube)
    assert spec["renewTime"] == "2024-05-01T12:00:02.000001Z"
    assert spec["acquireTime"] == "2024-05-01T12:00:00.000000Z"
    assert [r.method for r in fake_kube.requests_to("/leases/metricscale-autoscaler$")] == [
        "GET", "GET", "PUT"]


async def test_standby_takes_over_after_the_leader_stops_renewing(
        fake_kube: FakeKubeAPI, clients: tuple[KubeClient, KubeClient], clock: Clock) -> None:
    a, b = electors(clients, clock)
    await a.try_acquire_or_renew()
    await b.try_acquire_or_renew()
    clock.advance(10)
    assert not a.guard.is_leader  # a's renew deadline passed: it stops writing at once
    clock.advance(5)
    assert await b.try_acquire_or_renew() is True
    spec = stored_lease(fake_kube)
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    assert spec["acquireTime"] == "2024-05-01T12:00:15.000000Z"
    assert await a.try_acquire_or_renew() is False
    assert b.guard.is_leader and not a.guard.is_leader


async def test_concurrent_replace_with_one_resource_version_conflicts(
        clients: tuple[KubeClient, KubeClient]) -> None:
    first, second = clients
    spec = LeaseSpec("a", 15, T0, T0, 0)
    await first.create_lease(namespace="ops", name="metricscale-autoscaler", spec=spec)
    with pytest.raises(errors.AlreadyExists):
        await second.create_lease(namespace="ops", name="metricscale-autoscaler",
                                  spec=LeaseSpec("b", 15, T0, T0, 0))
    seen_by_a = await first.read_lease(namespace="ops", name="metricscale-autoscaler")
    seen_by_b = await second.read_lease(namespace="ops", name="metricscale-autoscaler")
    assert seen_by_a is not None and seen_by_b is not None
    await first.replace_lease(seen_by_a, spec=LeaseSpec("a", 15, T0, T0 + timedelta(seconds=2), 0))
    with pytest.raises(errors.Conflict) as caught:
        await second.replace_lease(seen_by_b, spec=LeaseSpec("b", 15, T0, T0, 1))
    assert "the object has been modified" in str(caught.value)


async def test_release_on_shutdown_lets_the_standby_take_over_at_once(
        fake_kube: FakeKubeAPI, clients: tuple[KubeClient, KubeClient], clock: Clock) -> None:
    a, b = electors(clients, clock)
    await a.try_acquire_or_renew()
    await b.try_acquire_or_renew()
    clock.advance(1)
    assert await a.release() is True
    spec = stored_lease(fake_kube)
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"]) == ("", 1)
    assert isinstance(spec["renewTime"], str) and MICRO.match(spec["renewTime"])
    assert await b.try_acquire_or_renew() is True
    assert stored_lease(fake_kube)["leaseTransitions"] == 1


async def test_lease_keeps_its_labels_across_renewals(
        fake_kube: FakeKubeAPI, clients: tuple[KubeClient, KubeClient], clock: Clock) -> None:
    fake_kube.create("coordination.k8s.io", "v1", "leases", {
        "metadata": {"name": "metricscale-autoscaler", "namespace": "ops",
                     "labels": {"app": "metricscale"}},
        "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 4}})
    a, _ = electors(clients, clock)
    assert await a.try_acquire_or_renew() is True
    lease = fake_kube.store.try_get("coordination.k8s.io", "v1", "leases",
                                    "metricscale-autoscaler", namespace="ops")
    assert lease is not None
    assert lease["metadata"]["labels"] == {"app": "metricscale"}
    assert lease["spec"]["leaseTransitions"] == 5
