"""The leader-lease decision as pure code, on a coordination.k8s.io/v1 Lease.

It follows client-go's `tryAcquireOrRenew`: a lease held by someone else is valid until
`observed_at + leaseDurationSeconds`, where `observed_at` is when *this* replica first saw that
record content (so clocks need not agree across replicas); a takeover increments
`leaseTransitions` and resets `acquireTime`; a renewal keeps both. Release writes an empty holder
and `leaseDurationSeconds: 1`, as client-go's `release()` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

__all__ = [
    "Acquire",
    "Create",
    "Decision",
    "Lease",
    "LeaseSpec",
    "ObservedLease",
    "Release",
    "Renew",
    "Wait",
    "decide",
    "decide_release",
    "observe",
]


# --- Values -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseSpec:
    """`Lease.spec` as the elector reads and writes it (times are aware UTC datetimes)."""

    holder_identity: str
    lease_duration_seconds: int
    acquire_time: datetime | None
    renew_time: datetime | None
    lease_transitions: int


@dataclass(frozen=True)
class Lease:
    """A Lease as the API server returned it: the spec, its resourceVersion, its
    `metadata.annotations` (where the leader publishes its decision settings), the raw object."""

    spec: LeaseSpec
    resource_version: str
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    annotations: Mapping[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class ObservedLease:
    """A lease plus the local time at which this replica first saw its current spec."""

    lease: Lease
    observed_at: datetime


@dataclass(frozen=True)
class Create:
    """No Lease exists: create it with this spec."""

    spec: LeaseSpec


@dataclass(frozen=True)
class Acquire:
    """The lease is free or expired: take it over (replace `lease` with `spec`)."""

    lease: Lease
    spec: LeaseSpec


@dataclass(frozen=True)
class Renew:
    """We hold the lease: extend it (replace `lease` with `spec`)."""

    lease: Lease
    spec: LeaseSpec


@dataclass(frozen=True)
class Wait:
    """Someone else holds a valid lease; it cannot expire before `expires_at` (local clock)."""

    holder_identity: str
    expires_at: datetime


@dataclass(frozen=True)
class Release:
    """We hold the lease and are stopping: hand it back (replace `lease` with `spec`)."""

    lease: Lease
    spec: LeaseSpec


Decision = Create | Acquire | Renew | Wait


# --- The pure decision ------------------------------------------------------------------


def observe(previous: ObservedLease | None, lease: Lease, *, now: datetime) -> ObservedLease:
    """Record a freshly read lease; the observation time moves only when the spec changed."""
    if previous is not None and previous.lease.spec == lease.spec:
        return ObservedLease(lease=lease, observed_at=previous.observed_at)
    return ObservedLease(lease=lease, observed_at=now)


def decide(
    observed: ObservedLease | None,
    *,
    identity: str,
    now: datetime,
    lease_duration: timedelta,
) -> Decision:
    """What this replica should do with the lease now (client-go's tryAcquireOrRenew)."""
    duration_seconds = int(lease_duration.total_seconds())
    if observed is None:
        return Create(LeaseSpec(
            holder_identity=identity, lease_duration_seconds=duration_seconds,
            acquire_time=now, renew_time=now, lease_transitions=0))
    current = observed.lease.spec
    expires_at = observed.observed_at + timedelta(seconds=current.lease_duration_seconds)
    if current.holder_identity and current.holder_identity != identity and expires_at > now:
        return Wait(holder_identity=current.holder_identity, expires_at=expires_at)
    if current.holder_identity == identity:
        return Renew(observed.lease, LeaseSpec(
            holder_identity=identity, lease_duration_seconds=duration_seconds,
            acquire_time=current.acquire_time, renew_time=now,
            lease_transitions=current.lease_transitions))
    return Acquire(observed.lease, LeaseSpec(
        holder_identity=identity, lease_duration_seconds=duration_seconds,
        acquire_time=now, renew_time=now, lease_transitions=current.lease_transitions + 1))


def decide_release(
    observed: ObservedLease | None, *, identity: str, now: datetime
) -> Release | None:
    """The write that gives the lease up, or None when we do not hold it (client-go's release)."""
    if observed is None or observed.lease.spec.holder_identity != identity:
        return None
    return Release(observed.lease, LeaseSpec(
        holder_identity="", lease_duration_seconds=1, acquire_time=now, renew_time=now,
        lease_transitions=observed.lease.spec.lease_transitions))
