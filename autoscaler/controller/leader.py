"""Leader election on a coordination.k8s.io/v1 Lease: a small loop around the pure decision of
autoscaler.decision.leadership.

The loop keeps a `LeaderGuard` that the controller checks before every write. Leadership counts
from the start of the last successful write and ends `renew_deadline` later unless renewed: the
guard computes that from the clock on every check, so writes stop at the deadline even if the
renewal request itself is stuck.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from autoscaler.decision.leadership import (
    Acquire,
    Create,
    Lease,
    LeaseSpec,
    ObservedLease,
    Renew,
    Wait,
    decide,
    decide_release,
    observe,
)
from autoscaler.decision.settings import (
    SETTINGS_ANNOTATION,
    Settings,
    render_settings_annotation,
)
from autoscaler.model.names import dns_label_problem, dns_subdomain_problem
from metricscale.core.durations import format_duration, go_duration_argument
from metricscale.kube.errors import AlreadyExists, Conflict, KubeError

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_LEASE_DURATION",
    "LeaderElectionConfig",
    "LeaderElector",
    "LeaderGuard",
    "LeaseStore",
    "add_leader_election_arguments",
    "default_identity",
    "default_lease_namespace",
    "leader_election_config",
    "publish_settings",
]

# client-go's wait.JitterUntil factor for the acquire loop (leaderelection.JitterFactor).
_ACQUIRE_JITTER = 1.2
_SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class NotLeader(Exception):
    """This replica does not hold the leader lease (or its renew deadline passed): no writes."""


# --- Configuration (flag names and defaults of kube-controller-manager) -------------------


@dataclass(frozen=True)
class LeaderElectionConfig:
    """The --leader-elect* settings; an empty namespace means "the namespace this pod runs in"."""

    enabled: bool = True
    lease_duration: timedelta = timedelta(seconds=15)
    renew_deadline: timedelta = timedelta(seconds=10)
    retry_period: timedelta = timedelta(seconds=2)
    resource_name: str = "metricscale-autoscaler"
    resource_namespace: str = ""

    def __post_init__(self) -> None:
        # The same checks as client-go's NewLeaderElector, with its messages.
        if self.lease_duration <= self.renew_deadline:
            raise ValueError("leaseDuration must be greater than renewDeadline")
        if self.renew_deadline <= self.retry_period * 1.2:
            raise ValueError("renewDeadline must be greater than retryPeriod*JitterFactor")
        if self.lease_duration < timedelta(seconds=1):
            raise ValueError("leaseDuration must be greater than zero")
        if self.retry_period < timedelta(seconds=1):
            raise ValueError("retryPeriod must be greater than zero")
        if not self.resource_name:
            raise ValueError("--leader-elect-resource-name must not be empty")


def _bool_argument(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "t", "yes"):
        return True
    if lowered in ("false", "0", "f", "no"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}")


def add_leader_election_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the --leader-elect* flags (names and defaults as in kube-controller-manager)."""
    defaults = LeaderElectionConfig()
    group = parser.add_argument_group("leader election")
    group.add_argument(
        "--leader-elect", type=_bool_argument, nargs="?", const=True, default=defaults.enabled,
        metavar="BOOL", help="take a Lease before acting, so only one replica writes "
        "(default: %(default)s)")
    group.add_argument(
        "--leader-elect-lease-duration", type=go_duration_argument, metavar="DURATION",
        default=defaults.lease_duration, help="how long non-leaders wait after the last renewal "
        "they saw before taking over (default: 15s; at most 596523h14m7s, a Lease's int32 "
        "leaseDurationSeconds)")
    group.add_argument(
        "--leader-elect-renew-deadline", type=go_duration_argument, metavar="DURATION",
        default=defaults.renew_deadline, help="how long the leader keeps acting without a "
        "successful renewal (default: 10s)")
    group.add_argument(
        "--leader-elect-retry-period", type=go_duration_argument, metavar="DURATION",
        default=defaults.retry_period, help="how often to try to acquire or renew (default: 2s)")
    group.add_argument(
        "--leader-elect-resource-name", default=defaults.resource_name, metavar="NAME",
        help="name of the Lease, a DNS-1123 subdomain (default: %(default)s)")
    group.add_argument(
        "--leader-elect-resource-namespace", default=defaults.resource_namespace,
        metavar="NAMESPACE", help="namespace of the Lease, a DNS-1123 label (default: the pod's "
        "own namespace)")


# A Lease's spec.leaseDurationSeconds is an int32: a longer --leader-elect-lease-duration could
# never be written (the API server would refuse the Lease at the first acquire).
MAX_LEASE_DURATION = timedelta(seconds=2**31 - 1)


def _check_lease_flags(args: argparse.Namespace) -> None:
    """Values no Lease could carry: refused at start, each naming its flag (ValueError)."""
    lease_duration = args.leader_elect_lease_duration
    if lease_duration > MAX_LEASE_DURATION:
        raise ValueError(f"--leader-elect-lease-duration: must be at most "
                         f"{format_duration(MAX_LEASE_DURATION)} (a Lease's "
                         f"leaseDurationSeconds is an int32), got "
                         f"{format_duration(lease_duration)}")
    name = args.leader_elect_resource_name
    problem = dns_subdomain_problem(name)
    if problem is not None:
        raise ValueError(f"--leader-elect-resource-name {name!r}: a Lease's name must be a "
                         f"DNS-1123 subdomain: {problem}")
    namespace = args.leader_elect_resource_namespace
    problem = dns_label_problem(namespace) if namespace else None
    if problem is not None:
        raise ValueError(f"--leader-elect-resource-namespace {namespace!r}: a namespace must be "
                         f"a DNS-1123 label: {problem}")


def leader_election_config(args: argparse.Namespace) -> LeaderElectionConfig:
    """Build the config from parsed --leader-elect* flags (raises ValueError when inconsistent
    or out of range; a message that starts with a flag's name is about that flag alone)."""
    _check_lease_flags(args)
    return LeaderElectionConfig(
        enabled=bool(args.leader_elect),
        lease_duration=args.leader_elect_lease_duration,
        renew_deadline=args.leader_elect_renew_deadline,
        retry_period=args.leader_elect_retry_period,
        resource_name=args.leader_elect_resource_name,
        resource_namespace=args.leader_elect_resource_namespace,
    )


def default_identity() -> str:
    """hostname + "_" + a random UUID, as kube-controller-manager builds its identity."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def default_lease_namespace(fallback: str = "default") -> str:
    """The namespace this pod runs in (POD_NAMESPACE, then the service account's), or fallback."""
    from_env = os.environ.get("POD_NAMESPACE", "").strip()
    if from_env:
        return from_env
    try:
        with open(_SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as handle:
            return handle.read().strip() or fallback
    except OSError:
        return fallback


async def publish_settings(store: LeaseStore, *, namespace: str, name: str,
                           settings: Settings) -> None:
    """With --leader-elect=false: publish the decision settings on the Lease all the same (for
    `explain --live`), holder untouched: the single replica is the leader but elects nothing.
    A lease nobody held gets an empty holder and a duration of 1 s, which any elector may take
    at once. KubeError (say, no RBAC for leases) is for the caller to log."""
    annotations = {SETTINGS_ANNOTATION: render_settings_annotation(settings)}
    for _ in range(3):
        lease = await store.read_lease(namespace=namespace, name=name)
        try:
            if lease is None:
                await store.create_lease(
                    namespace=namespace, name=name, annotations=annotations,
                    spec=LeaseSpec(holder_identity="", lease_duration_seconds=1,
                                   acquire_time=None, renew_time=None, lease_transitions=0))
            else:
                await store.replace_lease(lease, spec=lease.spec, annotations=annotations)
            return
        except (AlreadyExists, Conflict):
            continue  # someone wrote it between our read and write: read again
    logger.warning("lease %s/%s: settings not published, it kept changing under us",
                   namespace, name)


# --- The guard the controller checks before every write ----------------------------------


class LeaderGuard:
    """Answers "may this replica write now?"; `ensure()` raises NotLeader when it may not."""

    def __init__(self, *, clock: Callable[[], datetime], renew_deadline: timedelta,
                 always: bool = False) -> None:
        self._clock = clock
        self._renew_deadline = renew_deadline
        self._always = always
        self._renewed_at: datetime | None = None
        self._leading = asyncio.Event()
        if always:
            self._leading.set()

    @classmethod
    def always_leader(cls, *, clock: Callable[[], datetime]) -> LeaderGuard:
        """A guard for --leader-elect=false: this replica is always allowed to write."""
        return cls(clock=clock, renew_deadline=timedelta(0), always=True)

    @property
    def renewed_at(self) -> datetime | None:
        return self._renewed_at

    @property
    def is_leader(self) -> bool:
        if self._always:
            return True
        if self._renewed_at is None:
            return False
        return self._clock() - self._renewed_at < self._renew_deadline

    def ensure(self) -> None:
        """Raise NotLeader unless this replica holds the lease within its renew deadline."""
        if not self.is_leader:
            raise NotLeader("this replica is not the leader; no writes")

    async def wait_until_leader(self) -> None:
        """Return once this replica has acquired the lease (at once if it holds it now)."""
        while not self.is_leader:
            self._leading.clear()
            await self._leading.wait()

    def mark_renewed(self, at: datetime) -> None:
        """The elector's successful write that started at `at` (the conservative end)."""
        self._renewed_at = at
        self._leading.set()

    def drop(self) -> None:
        """Leadership is gone (deadline passed, lease lost, or released)."""
        if not self._always:
            self._renewed_at = None
            self._leading.clear()


# --- The loop ------------------------------------------------------------------------------


class LeaseStore(Protocol):
    """The Lease I/O the elector needs (autoscaler.kube.operations.KubeClient provides it)."""

    async def read_lease(self, *, namespace: str, name: str) -> Lease | None: ...

    async def create_lease(self, *, namespace: str, name: str, spec: LeaseSpec,
                           annotations: Mapping[str, str] | None = None) -> Lease: ...

    async def replace_lease(self, lease: Lease, *, spec: LeaseSpec,
                            annotations: Mapping[str, str] | None = None) -> Lease: ...


class LeaderElector:
    """Acquire, renew every retry period, and release on shutdown; `guard` gates every write."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        config: LeaderElectionConfig,
        identity: str,
        namespace: str,
        clock: Callable[[], datetime],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
        on_change: Callable[[bool], None] | None = None,
        settings: Settings | None = None,
    ) -> None:
        self._store = store
        self._config = config
        self._identity = identity
        self._namespace = namespace
        self._clock = clock
        self._sleep = sleep
        self._jitter = jitter
        self._on_change = on_change
        # Published on every write, so `explain --live` decides with the leader's settings.
        self._annotations: Mapping[str, str] | None = (
            None if settings is None
            else {SETTINGS_ANNOTATION: render_settings_annotation(settings)})
        self._observed: ObservedLease | None = None
        self._was_leader = False
        self.guard = LeaderGuard(clock=clock, renew_deadline=config.renew_deadline)

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def observed(self) -> ObservedLease | None:
        return self._observed

    @property
    def description(self) -> str:
        return f"{self._namespace}/{self._config.resource_name}"

    async def run(self) -> None:
        """Loop until cancelled; on the way out, drop leadership and release the lease."""
        try:
            while True:
                leader = await self.try_acquire_or_renew()
                period = self._config.retry_period.total_seconds()
                if not leader:
                    # Candidates spread out, as client-go's JitterUntil does for acquire.
                    period += period * _ACQUIRE_JITTER * self._jitter()
                await self._sleep(period)
        finally:
            try:
                async with asyncio.timeout(self._config.retry_period.total_seconds()):
                    await self.release()
            except (TimeoutError, KubeError) as exc:
                logger.warning("lease %s: release failed: %s", self.description, exc)

    async def try_acquire_or_renew(self) -> bool:
        """One step: read, decide, write; returns whether this replica leads afterwards."""
        now = self._clock()
        try:
            async with asyncio.timeout(self._config.renew_deadline.total_seconds()):
                leader = await self._step(now)
        except TimeoutError:
            logger.warning("lease %s: request timed out", self.description)
            leader = False
        except KubeError as exc:
            logger.warning("lease %s: %s", self.description, exc)
            leader = False
        if leader:
            self.guard.mark_renewed(now)
        elif not self.guard.is_leader:
            # Either we never led, or the renew deadline has passed since the last success.
            self.guard.drop()
        self._notify()
        return self.guard.is_leader

    async def _step(self, now: datetime) -> bool:
        lease = await self._store.read_lease(
            namespace=self._namespace, name=self._config.resource_name)
        if lease is None:
            self._observed = None
        else:
            self._observed = observe(self._observed, lease, now=now)
        decision = decide(self._observed, identity=self._identity, now=now,
                          lease_duration=self._config.lease_duration)
        match decision:
            case Wait(holder_identity=holder):
                logger.debug("lease %s is held by %s", self.description, holder)
                # Someone else holds it: whatever our deadline says, we are not leading.
                self.guard.drop()
                return False
            case Create(spec=spec):
                try:
                    written = await self._store.create_lease(
                        namespace=self._namespace, name=self._config.resource_name, spec=spec,
                        annotations=self._annotations)
                except AlreadyExists:
                    logger.info("lease %s: another replica created it first", self.description)
                    return False
            case Acquire(lease=current, spec=spec) | Renew(lease=current, spec=spec):
                try:
                    written = await self._store.replace_lease(
                        current, spec=spec, annotations=self._annotations)
                except Conflict:
                    logger.info("lease %s: changed since read (409), retrying next period",
                                self.description)
                    return False
                if isinstance(decision, Acquire):
                    logger.info("lease %s acquired by %s (transitions %d)", self.description,
                                self._identity, spec.lease_transitions)
        self._observed = ObservedLease(lease=written, observed_at=now)
        return True

    async def release(self) -> bool:
        """Give the lease back if we hold it; True when nothing is left to release."""
        self.guard.drop()
        self._notify()
        action = decide_release(self._observed, identity=self._identity, now=self._clock())
        if action is None:
            return True
        try:
            written = await self._store.replace_lease(action.lease, spec=action.spec)
        except Conflict:
            logger.info("lease %s: not released, it changed since we read it", self.description)
            return False
        self._observed = ObservedLease(lease=written, observed_at=self._clock())
        logger.info("lease %s released by %s", self.description, self._identity)
        return True

    def _notify(self) -> None:
        leader = self.guard.is_leader
        if leader == self._was_leader:
            return
        self._was_leader = leader
        logger.info("lease %s: %s", self.description,
                    "became leader" if leader else "stopped leading")
        if self._on_change is not None:
            self._on_change(leader)
