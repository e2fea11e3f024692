"""The elector loop over an in-memory lease store: one leader, takeover, deadline, release."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pytest

from autoscaler.controller.leader import (
    LeaderElectionConfig,
    LeaderElector,
    LeaderGuard,
    NotLeader,
    add_leader_election_arguments,
    leader_election_config,
)
from autoscaler.decision.leadership import Lease, LeaseSpec
from metricscale.kube.errors import ServerError
from tests.autoscaler.controller_support import MemoryLeases

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
CONFIG = LeaderElectionConfig(resource_name="autoscaler", resource_namespace="ops")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def elector(store: MemoryLeases, clock: Clock, identity: str) -> LeaderElector:
    return LeaderElector(store, config=CONFIG, identity=identity, namespace="ops", clock=clock)


def holder(store: MemoryLeases) -> LeaseSpec:
    return store.leases[("ops", "autoscaler")].spec


async def test_first_candidate_creates_the_lease_and_leads() -> None:
    store, clock = MemoryLeases(), Clock()
    a = elector(store, clock, "a")
    assert await a.try_acquire_or_renew() is True
    assert a.guard.is_leader
    assert holder(store) == LeaseSpec(holder_identity="a", lease_duration_seconds=15,
                                      acquire_time=T0, renew_time=T0, lease_transitions=0)


async def test_two_candidates_exactly_one_leads() -> None:
    store, clock = MemoryLeases(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    for _ in range(5):
        await a.try_acquire_or_renew()
        await b.try_acquire_or_renew()
        clock.advance(2)
    assert (a.guard.is_leader, b.guard.is_leader) == (True, False)
    with pytest.raises(NotLeader):
        b.guard.ensure()
    a.guard.ensure()


async def test_renewal_keeps_acquire_time_and_transitions() -> None:
    store, clock = MemoryLeases(), Clock()
    a = elector(store, clock, "a")
    await a.try_acquire_or_renew()
    clock.advance(2)
    await a.try_acquire_or_renew()
    assert holder(store).acquire_time == T0
    assert holder(store).renew_time == T0 + timedelta(seconds=2)
    assert holder(store).lease_transitions == 0


async def test_standby_takes_over_one_lease_duration_after_the_last_renewal_it_saw() -> None:
    store, clock = MemoryLeases(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    await a.try_acquire_or_renew()
    await b.try_acquire_or_renew()  # b sees a's lease at T0
    clock.advance(14)
    assert await b.try_acquire_or_renew() is False  # a stopped renewing, not yet expired
    clock.advance(1)
    assert await b.try_acquire_or_renew() is True
    assert holder(store).holder_identity == "b"
    assert holder(store).lease_transitions == 1
    assert holder(store).acquire_time == T0 + timedelta(seconds=15)
    # a woke up: the lease has another holder, so a must not write, whatever its clock says.
    assert await a.try_acquire_or_renew() is False
    assert not a.guard.is_leader


async def test_guard_drops_at_the_renew_deadline_without_any_step() -> None:
    store, clock = MemoryLeases(), Clock()
    a = elector(store, clock, "a")
    await a.try_acquire_or_renew()
    clock.advance(9.999)
    assert a.guard.is_leader
    clock.advance(0.001)
    assert not a.guard.is_leader
    with pytest.raises(NotLeader):
        a.guard.ensure()


async def test_failed_renewals_keep_leading_until_the_deadline_then_stop() -> None:
    store, clock = MemoryLeases(), Clock()
    changes: list[bool] = []
    a = LeaderElector(store, config=CONFIG, identity="a", namespace="ops", clock=clock,
                      on_change=changes.append)
    await a.try_acquire_or_renew()
    store.fail = ServerError("etcdserver: request timed out", status=500)
    clock.advance(6)
    assert await a.try_acquire_or_renew() is True  # transient: still within 10s
    clock.advance(4)
    assert await a.try_acquire_or_renew() is False
    assert changes == [True, False]


async def test_conflict_on_renewal_is_not_leadership_gained() -> None:
    store, clock = MemoryLeases(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    await b.try_acquire_or_renew()
    clock.advance(20)
    await a.try_acquire_or_renew()  # a observes b's lease for the first time now
    clock.advance(15)

    real_replace = store.replace_lease

    async def b_sneaks_in(lease: Lease, *, spec: LeaseSpec,
                          annotations: Mapping[str, str] | None = None) -> Lease:
        # Between a's read and a's write, b renews: a's write carries a stale resourceVersion.
        current = store.leases[("ops", "autoscaler")]
        await real_replace(current, spec=LeaseSpec(
            holder_identity="b", lease_duration_seconds=15, acquire_time=T0,
            renew_time=clock.now, lease_transitions=0))
        return await real_replace(lease, spec=spec)

    store.replace_lease = b_sneaks_in  # type: ignore[method-assign]
    assert await a.try_acquire_or_renew() is False
    assert holder(store).holder_identity == "b"


async def test_release_hands_the_lease_back_for_an_immediate_takeover() -> None:
    store, clock = MemoryLeases(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    await a.try_acquire_or_renew()
    await b.try_acquire_or_renew()
    clock.advance(1)
    assert await a.release() is True
    assert not a.guard.is_leader
    assert holder(store) == LeaseSpec(
        holder_identity="", lease_duration_seconds=1, acquire_time=T0 + timedelta(seconds=1),
        renew_time=T0 + timedelta(seconds=1), lease_transitions=0)
    assert await b.try_acquire_or_renew() is True
    assert holder(store).lease_transitions == 1


async def test_release_when_not_leading_writes_nothing() -> None:
    store, clock = MemoryLeases(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    await a.try_acquire_or_renew()
    await b.try_acquire_or_renew()
    writes = store.writes
    assert await b.release() is True
    assert store.writes == writes


async def test_run_renews_every_retry_period_and_releases_when_cancelled() -> None:
    store, clock = MemoryLeases(), Clock()
    slept: list[float] = []
    steps = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)
        if len(slept) == 3:
            steps.set()
        await asyncio.sleep(0)

    a = LeaderElector(store, config=CONFIG, identity="a", namespace="ops", clock=clock,
                      sleep=sleep)
    task = asyncio.create_task(a.run())
    await steps.wait()
    assert a.guard.is_leader
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert slept[:3] == [2.0, 2.0, 2.0]
    assert holder(store).holder_identity == ""
    assert not a.guard.is_leader


async def test_candidate_retry_is_jittered_like_client_go_acquire() -> None:
    store, clock = MemoryLeases(), Clock()
    await elector(store, clock, "a").try_acquire_or_renew()
    slept: list[float] = []
    done = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        done.set()
        await asyncio.sleep(0)

    b = LeaderElector(store, config=CONFIG, identity="b", namespace="ops", clock=clock,
                      sleep=sleep, jitter=lambda: 0.5)
    task = asyncio.create_task(b.run())
    await done.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert slept[0] == pytest.approx(2.0 + 2.0 * 1.2 * 0.5)


async def test_wait_until_leader_returns_once_acquired() -> None:
    store, clock = MemoryLeases(), Clock()
    a = elector(store, clock, "a")
    waiter = asyncio.create_task(a.guard.wait_until_leader())
    await asyncio.sleep(0)
    assert not waiter.done()
    await a.try_acquire_or_renew()
    await asyncio.wait_for(waiter, timeout=5)


def test_always_leader_guard_never_refuses() -> None:
    guard = LeaderGuard.always_leader(clock=Clock())
    guard.ensure()
    guard.drop()
    assert guard.is_leader


@pytest.mark.parametrize(("changes", "message"), [
    ({"lease_duration": timedelta(seconds=10)}, "leaseDuration must be greater than renewDeadline"),
    ({"retry_period": timedelta(seconds=9)},
     "renewDeadline must be greater than retryPeriod*JitterFactor"),
])
def test_inconsistent_timings_are_rejected_with_client_go_messages(
        changes: dict[str, timedelta], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        LeaderElectionConfig(**changes)  # type: ignore[arg-type]


def test_flags_have_kube_controller_manager_names_and_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_leader_election_arguments(parser)
    assert leader_election_config(parser.parse_args([])) == LeaderElectionConfig()
    config = leader_election_config(parser.parse_args([
        "--leader-elect=false", "--leader-elect-lease-duration", "30s",
        "--leader-elect-renew-deadline=20s", "--leader-elect-retry-period=5s",
        "--leader-elect-resource-name=x", "--leader-elect-resource-namespace=ops"]))
    assert config == LeaderElectionConfig(
        enabled=False, lease_duration=timedelta(seconds=30), renew_deadline=timedelta(seconds=20),
        retry_period=timedelta(seconds=5), resource_name="x", resource_namespace="ops")
    assert leader_election_config(parser.parse_args(["--leader-elect"])).enabled
