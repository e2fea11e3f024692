"""The pure lease decision: create, wait, take over, renew and release, as client-go decides."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from autoscaler.decision.leadership import (
    Acquire,
    Create,
    Decision,
    Lease,
    LeaseSpec,
    ObservedLease,
    Release,
    Renew,
    Wait,
    decide,
    decide_release,
    observe,
)

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
FIFTEEN = timedelta(seconds=15)


def held(holder: str, *, seen: timedelta, duration: int = 15, transitions: int = 3,
         renewed: datetime | None = None) -> ObservedLease:
    """A lease held by `holder`, first observed `seen` before T0."""
    spec = LeaseSpec(holder_identity=holder, lease_duration_seconds=duration,
                     acquire_time=T0 - timedelta(hours=1), renew_time=renewed or T0 - seen,
                     lease_transitions=transitions)
    return ObservedLease(lease=Lease(spec=spec, resource_version="42"), observed_at=T0 - seen)


CASES: list[tuple[str, ObservedLease | None, Decision]] = [
    (
        "no lease: create it with us as holder and zero transitions",
        None,
        Create(LeaseSpec(holder_identity="me", lease_duration_seconds=15, acquire_time=T0,
                         renew_time=T0, lease_transitions=0)),
    ),
    (
        "another holder seen 5s ago: wait until 10s from now",
        held("other", seen=timedelta(seconds=5)),
        Wait(holder_identity="other", expires_at=T0 + timedelta(seconds=10)),
    ),
    (
        "another holder seen exactly one lease duration ago: expired, take over",
        held("other", seen=FIFTEEN),
        Acquire(held("other", seen=FIFTEEN).lease,
                LeaseSpec(holder_identity="me", lease_duration_seconds=15, acquire_time=T0,
                          renew_time=T0, lease_transitions=4)),
    ),
    (
        "another holder long gone: take over, transitions + 1, acquireTime now",
        held("other", seen=timedelta(minutes=5)),
        Acquire(held("other", seen=timedelta(minutes=5)).lease,
                LeaseSpec(holder_identity="me", lease_duration_seconds=15, acquire_time=T0,
                          renew_time=T0, lease_transitions=4)),
    ),
    (
        "released lease (empty holder) seen just now: take over at once",
        held("", seen=timedelta(0), duration=1),
        Acquire(held("", seen=timedelta(0), duration=1).lease,
                LeaseSpec(holder_identity="me", lease_duration_seconds=15, acquire_time=T0,
                          renew_time=T0, lease_transitions=4)),
    ),
    (
        "our own lease: renew, keeping acquireTime and transitions",
        held("me", seen=timedelta(seconds=2)),
        Renew(held("me", seen=timedelta(seconds=2)).lease,
              LeaseSpec(holder_identity="me", lease_duration_seconds=15,
                        acquire_time=T0 - timedelta(hours=1), renew_time=T0,
                        lease_transitions=3)),
    ),
    (
        "our own lease even when expired: renew, not a transition",
        held("me", seen=timedelta(minutes=1)),
        Renew(held("me", seen=timedelta(minutes=1)).lease,
              LeaseSpec(holder_identity="me", lease_duration_seconds=15,
                        acquire_time=T0 - timedelta(hours=1), renew_time=T0,
                        lease_transitions=3)),
    ),
    (
        "the holder's renewTime is ignored: a skewed clock cannot shorten the wait",
        held("other", seen=timedelta(seconds=1), renewed=T0 - timedelta(hours=2)),
        Wait(holder_identity="other", expires_at=T0 + timedelta(seconds=14)),
    ),
    (
        "the record's leaseDurationSeconds counts, not ours",
        held("other", seen=timedelta(seconds=20), duration=30),
        Wait(holder_identity="other", expires_at=T0 + timedelta(seconds=10)),
    ),
]


@pytest.mark.parametrize(("observed", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_decide(observed: ObservedLease | None, expected: Decision) -> None:
    assert decide(observed, identity="me", now=T0, lease_duration=FIFTEEN) == expected


def test_release_of_our_lease_empties_holder_and_sets_duration_one() -> None:
    observed = held("me", seen=timedelta(seconds=1), transitions=7)
    assert decide_release(observed, identity="me", now=T0) == Release(
        observed.lease,
        LeaseSpec(holder_identity="", lease_duration_seconds=1, acquire_time=T0, renew_time=T0,
                  lease_transitions=7))


@pytest.mark.parametrize("observed", [None, held("other", seen=timedelta(seconds=1))],
                         ids=["no lease", "someone else's lease"])
def test_release_of_a_lease_we_do_not_hold_writes_nothing(observed: ObservedLease | None) -> None:
    assert decide_release(observed, identity="me", now=T0) is None


def test_observe_keeps_first_sight_time_while_spec_is_unchanged() -> None:
    first = held("other", seen=timedelta(seconds=8))
    same_spec_new_rv = Lease(spec=first.lease.spec, resource_version="43")
    assert observe(first, same_spec_new_rv, now=T0).observed_at == T0 - timedelta(seconds=8)


def test_observe_restarts_the_clock_when_the_holder_renews() -> None:
    first = held("other", seen=timedelta(seconds=8))
    renewed = Lease(spec=LeaseSpec(
        holder_identity="other", lease_duration_seconds=15, acquire_time=None, renew_time=T0,
        lease_transitions=3), resource_version="44")
    assert observe(first, renewed, now=T0) == ObservedLease(lease=renewed, observed_at=T0)


def test_observe_first_sight() -> None:
    lease = held("other", seen=timedelta(0)).lease
    assert observe(None, lease, now=T0) == ObservedLease(lease=lease, observed_at=T0)
