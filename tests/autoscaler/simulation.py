"""The controller on an injected clock: its work queue, schedule and reconciler (and, with leader
election, its elector) over the in-memory doubles, Deployments whose pods follow their scale, and
time that moves only when the test moves it.

A scenario of minutes runs in milliseconds, and which reconcile did what, at which `now`, is
exact: a test states "the scale-down waits out the window and comes with the first sync after
it" as an equality instead of polling a live controller and bounding how late it may be. What
the real API adds (the CRD's schema, watches, the aggregator) is tested on the real control
plane in tests/cluster.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry

from autoscaler.controller.leader import LeaderElectionConfig, LeaderElector, LeaderGuard
from autoscaler.controller.reconciler import Reconciler
from autoscaler.controller.stats import ControllerMetrics
from autoscaler.controller.watching import (
    AutoscalerEntry,
    AutoscalerKey,
    project_pod,
    project_replica_set,
)
from autoscaler.controller.workqueue import Controller
from autoscaler.decision.settings import Settings
from autoscaler.model.pods import Pod
from autoscaler.model.times import format_time
from metricscale.kube.informer import InformerEvent, ObjectKey
from testbed.fakes.kube_objects import Container, pod
from tests.autoscaler.controller_support import (
    MemoryCaches,
    MemoryKube,
    MemoryLeases,
    MemoryMetrics,
    RecordedEvent,
)

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
NS = "shop"
API_VERSIONS = {"Autoscaler": "metricscale.dev/v1alpha1",
                "HorizontalPodAutoscaler": "autoscaling/v2"}
LEASE_NAMESPACE = "metricscale"

Obj = dict[str, Any]

# Whole steps at once both ways, no stabilization: what the metrics want is what is written.
AT_ONCE: Obj = {
    "scaleUp": {"stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 10, "periodSeconds": 1}]},
    "scaleDown": {"stabilizationWindowSeconds": 0,
                  "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}]},
}


# ----------------------------------------------------------------------------- objects


def pods_metric(name: str, average: str) -> Obj:
    return {"type": "Pods", "pods": {"metric": {"name": name},
                                     "target": {"type": "AverageValue", "averageValue": average}}}


def cpu_metric(utilization: int) -> Obj:
    return {"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization", "averageUtilization": utilization}}}


def external_metric(name: str, average: str, **extra: Any) -> Obj:
    return {"type": "External", "external": {
        "metric": {"name": name}, "target": {"type": "AverageValue", "averageValue": average},
        **extra}}


def autoscaler(name: str, *, target: str, metrics: list[Obj], min_replicas: int = 1,
               max_replicas: int = 10, behavior: Obj | None = None,
               annotations: Mapping[str, str] | None = None, kind: str = "Autoscaler",
               **spec: Any) -> Obj:
    """An Autoscaler (or, with `kind`, an autoscaling/v2 HPA) in namespace shop on Deployment
    `target`; `spec` adds fields as they are spelled on the wire."""
    body: Obj = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": target},
                 "minReplicas": min_replicas, "maxReplicas": max_replicas, "metrics": metrics,
                 **spec}
    if behavior is not None:
        body["behavior"] = behavior
    return {"apiVersion": API_VERSIONS[kind], "kind": kind,
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                         "annotations": dict(annotations or {})},
            "spec": body}


def quantity(value: Decimal) -> str:
    """A value as the metrics APIs write it (milli-units, whole numbers plain)."""
    milli = int(value * 1000)
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


class Clock:
    """Monotonic seconds since the start, and the wall-clock time they are."""

    def __init__(self, start: datetime = T0) -> None:
        self.start = start
        self.elapsed = 0.0

    def monotonic(self) -> float:
        return self.elapsed

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.elapsed)


# ---------------------------------------------------------------------------- workloads


@dataclass
class Workload:
    """A Deployment, as its controllers keep it: a scale in the Kubernetes double whose
    status follows spec.replicas, that many Ready pods `name-0`, `name-1`, ... of ReplicaSet
    `name-1` in the caches, and `total` load spread evenly over them as `metric` (per-pod
    values of a Pods metric, or CPU cores when `metric` is "cpu")."""

    cluster: Cluster
    name: str
    metric: str
    total: Decimal
    cpu_request: str = "500m"
    pods: dict[str, Pod] = field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        return {"app": self.name}

    @property
    def replica_set(self) -> str:
        return f"{self.name}-1"

    def set_load(self, total: Decimal | int | str) -> None:
        self.total = Decimal(total)
        self.publish()

    def publish(self) -> None:
        names = sorted(self.pods)
        share = self.total / len(names) if names else Decimal(0)
        metrics = self.cluster.metrics
        if self.metric == "cpu":
            for name in names:
                metrics.cpu_usage[name] = quantity(share)
        else:
            values = metrics.pod_values.setdefault(self.metric, {})
            for name in names:
                values[name] = quantity(share)

    def sync(self) -> None:
        """One pass of the Deployment and ReplicaSet controllers."""
        scale = self.cluster.kube.scales.get((NS, self.name))
        if scale is None:
            return
        wanted = int(scale["spec"]["replicas"])
        scale["status"]["replicas"] = wanted
        changed = False
        for index in range(wanted):
            name = f"{self.name}-{index}"
            if name not in self.pods:
                self.pods[name] = self.cluster.add_pod(
                    name, labels=self.labels, cpu_request=self.cpu_request,
                    owner={"kind": "ReplicaSet", "name": self.replica_set})
                changed = True
        for name in sorted(self.pods):
            if int(name.rsplit("-", 1)[1]) >= wanted:
                self.cluster.caches.pods.remove(self.pods.pop(name))
                self.cluster.metrics.cpu_usage.pop(name, None)  # a pod gone has no metrics
                self.cluster.metrics.pod_values.get(self.metric, {}).pop(name, None)
                changed = True
        if changed:
            self.publish()


# ------------------------------------------------------------------------------ replicas


class Replica:
    """One controller replica as `metricscale autoscaler` wires it, without its HTTP and watch
    shells: a Reconciler and a Controller on the cluster's clock, gated by a LeaderElector over
    the in-memory Lease API when `election` is given."""

    def __init__(self, cluster: Cluster, *, identity: str, settings: Settings,
                 dry_run: bool, election: LeaderElectionConfig | None) -> None:
        self.cluster = cluster
        self.identity = identity
        self.registry = CollectorRegistry()
        stats = ControllerMetrics(self.registry)
        clock = cluster.clock
        self.elector: LeaderElector | None = None
        guard = LeaderGuard.always_leader(clock=clock.now)
        if election is not None:
            self.elector = LeaderElector(cluster.leases, config=election, identity=identity,
                                         namespace=LEASE_NAMESPACE, clock=clock.now,
                                         on_change=self._leadership_changed,
                                         settings=settings)
            guard = self.elector.guard
        self.guard = guard
        self.reconciler = Reconciler(kube=cluster.kube, metrics=cluster.metrics,
                                     watching=cluster.caches, settings=settings,
                                     dry_run=dry_run, leader=guard, controller_metrics=stats)
        self.controller = Controller(self.reconciler, sync_period=settings.sync_period,
                                     workers=1, metrics=stats, monotonic=clock.monotonic,
                                     wall_clock=clock.now,
                                     exists=lambda key: cluster.caches.get(key) is not None)
        self.running = True
        self.next_renewal = clock.monotonic()
        # Every reconcile this replica ran: the autoscaler and the `now` it decided with.
        self.reconciles: list[tuple[AutoscalerKey, datetime]] = []
        cluster.subscribe(self.controller.on_event)
        # The informers' first list: every autoscaler ADDED.
        self.controller.enqueue_all(cluster.autoscaler_keys())

    def _leadership_changed(self, leader: bool) -> None:
        if leader:  # as autoscaler.server does: histories are read back, everything synced
            self.controller.reset(self.cluster.autoscaler_keys())

    @property
    def may_work(self) -> bool:
        return self.running and self.guard.is_leader

    def reconciled(self, name: str, *, kind: str = "Autoscaler") -> list[datetime]:
        """When this replica reconciled autoscaler `name` (each reconcile's `now`)."""
        key = AutoscalerKey(kind, NS, name)
        return [now for reconciled, now in self.reconciles if reconciled == key]

    async def reconcile_next(self) -> None:
        """What one worker does with the next key of the queue."""
        queue = self.controller.queue
        key = await queue.get()
        try:
            if self.cluster.caches.get(key) is None:
                self.controller.forget(key)
                return
            now = self.cluster.clock.now()
            self.cluster.metrics.timestamp = format_time(now)
            self.reconciles.append((key, now))
            await self.controller.process_one(key)
        finally:
            queue.done(key)

    async def stop(self) -> None:
        """Shut down as the program does on SIGTERM: no more reconciles, the lease released."""
        self.running = False
        self.cluster.unsubscribe(self.controller.on_event)
        self.controller.shut_down()
        if self.elector is not None:
            await self.elector.release()


# ------------------------------------------------------------------------------- cluster


ELECTION = LeaderElectionConfig(enabled=True, resource_name="metricscale-autoscaler",
                                resource_namespace=LEASE_NAMESPACE)


class Cluster:
    """The API that controller replicas share, in memory: autoscalers (whose changes reach the
    replicas as the informers deliver them), Deployments that follow their scale, metrics, the
    Lease; and the loop that runs the replicas' reconciles and moves the clock between them."""

    def __init__(self, *, start: datetime = T0,
                 election: LeaderElectionConfig = ELECTION) -> None:
        self.clock = Clock(start)
        self.election = election
        self.caches = MemoryCaches()
        self.kube = MemoryKube(self.caches)
        self.metrics = MemoryMetrics()
        self.leases = MemoryLeases()
        self.workloads: dict[str, Workload] = {}
        self.replicas: list[Replica] = []
        self._listeners: list[Callable[[InformerEvent[AutoscalerEntry]], None]] = []

    # -- the objects --

    def subscribe(self, listener: Callable[[InformerEvent[AutoscalerEntry]], None]) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[InformerEvent[AutoscalerEntry]], None]) -> None:
        self._listeners.remove(listener)

    def _notify(self, kind: str, old: AutoscalerEntry | None,
                new: AutoscalerEntry | None) -> None:
        entry = new if new is not None else old
        assert entry is not None
        event = InformerEvent(kind, ObjectKey(entry.key.namespace, entry.key.name),  # type: ignore[arg-type]
                              old, new)
        for listener in list(self._listeners):
            listener(event)

    def autoscaler_keys(self) -> list[AutoscalerKey]:
        return list(self.caches.entries)

    def create(self, obj: Obj) -> AutoscalerKey:
        """An autoscaler created through the API (generation 1)."""
        raw = copy.deepcopy(obj)
        raw["metadata"].setdefault("generation", 1)
        raw["metadata"].setdefault("resourceVersion", "1")
        entry = self.caches.put(raw)
        self._notify("ADDED", None, entry)
        return entry.key

    def change(self, name: str, mutate: Callable[[Obj], None], *,
               kind: str = "Autoscaler") -> None:
        """An update through the API: the generation moves when the spec changed."""
        old = self.caches.get(AutoscalerKey(kind, NS, name))
        assert old is not None, name
        raw = copy.deepcopy(dict(old.raw))
        mutate(raw)
        metadata = raw["metadata"]
        if raw.get("spec") != old.raw.get("spec"):
            metadata["generation"] = int(metadata.get("generation") or 1) + 1
        metadata["resourceVersion"] = str(int(metadata.get("resourceVersion") or 0) + 1)
        self._notify("MODIFIED", old, self.caches.put(raw))

    def annotate(self, name: str, annotations: Mapping[str, str | None], *,
                 kind: str = "Autoscaler") -> None:
        """`kubectl annotate` (a value of None: `key-`)."""
        def merge(raw: Obj) -> None:
            merged = {**raw["metadata"].get("annotations", {}), **annotations}
            raw["metadata"]["annotations"] = {k: v for k, v in merged.items() if v is not None}
        self.change(name, merge, kind=kind)

    def add_pod(self, name: str, *, labels: Mapping[str, str], cpu_request: str = "500m",
                owner: Mapping[str, str] | None = None, ready: bool = True) -> Pod:
        projected = project_pod(pod(name, namespace=NS, now=self.clock.now(), labels=labels,
                                    containers=(Container(cpu_request=cpu_request),),
                                    owner=owner, ready=ready))
        self.caches.add_pod(projected)
        return projected

    def add_replica_set(self, name: str, *, deployment: str, revision: int) -> None:
        self.caches.replica_set_list.append(project_replica_set({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": NS,
                         "annotations": {"deployment.kubernetes.io/revision": str(revision)},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                              "name": deployment, "uid": f"uid-{deployment}",
                                              "controller": True}]}}))

    def deployment(self, name: str, *, replicas: int, load: Decimal | int | str = 0,
                   metric: str = "qps", cpu_request: str = "500m") -> Workload:
        """Deployment `name` (selector app=name) at `replicas`, `load` spread over its pods."""
        self.kube.set_scale(NS, name, replicas=replicas, selector=f"app={name}")
        workload = Workload(self, name, metric, Decimal(load), cpu_request)
        self.add_replica_set(workload.replica_set, deployment=name, revision=1)
        self.workloads[name] = workload
        workload.sync()
        workload.publish()
        return workload

    def scale_externally(self, deployment: str, replicas: int) -> None:
        """Another writer (`kubectl scale`, a GitOps sync) sets spec.replicas."""
        self.kube.scales[(NS, deployment)]["spec"]["replicas"] = replicas
        self.workloads[deployment].sync()

    # -- what the API shows --

    def status(self, name: str, *, kind: str = "Autoscaler") -> Obj:
        entry = self.caches.get(AutoscalerKey(kind, NS, name))
        assert entry is not None, name
        return dict(entry.status)

    def condition(self, name: str, kind: str, *,
                  of: str = "Autoscaler") -> tuple[str, str, str] | None:
        for item in self.status(name, kind=of).get("conditions") or []:
            if item.get("type") == kind:
                return item.get("status", ""), item.get("reason", ""), item.get("message", "")
        return None

    def events(self, name: str) -> list[RecordedEvent]:
        return [e for e in self.kube.events if (e.namespace, e.name) == (NS, name)]

    def reasons(self, name: str) -> list[str]:
        return [e.reason for e in self.events(name)]

    def rescales(self, name: str) -> list[tuple[int, datetime | None]]:
        """The sizes of the SuccessfulRescale events about `name`, and when, oldest first."""
        return [(int(e.note.split(";")[0].removeprefix("New size: ")), e.time)
                for e in self.events(name) if e.reason == "SuccessfulRescale"]

    def sizes(self, name: str) -> list[int]:
        return [size for size, _ in self.rescales(name)]

    def replicas_of(self, deployment: str) -> int:
        return self.kube.replicas(NS, deployment)

    def scale_writes(self, deployment: str) -> list[int]:
        return [replicas for namespace, name, replicas in self.kube.scale_writes
                if (namespace, name) == (NS, deployment)]

    # -- the controller replicas, and time --

    def replica(self, identity: str = "replica-a", *, settings: Settings | None = None,
                dry_run: bool = False, leader_election: bool = False) -> Replica:
        """A controller replica (leader-elected on the cluster's Lease if asked)."""
        replica = Replica(self, identity=identity, settings=settings or Settings(),
                          dry_run=dry_run, election=self.election if leader_election else None)
        self.replicas.append(replica)
        return replica

    def _running(self) -> Iterator[Replica]:
        return (r for r in self.replicas if r.running)

    def _next_due(self) -> float | None:
        due: list[float] = []
        for replica in self._running():
            if replica.elector is not None:
                due.append(replica.next_renewal)
            scheduled = replica.controller.schedule.next_due()
            if replica.may_work and scheduled is not None:
                due.append(scheduled)
        return min(due) if due else None

    async def _step(self, until: float) -> bool:
        """One reconcile, or the clock moved to the next due renewal or sync (never past
        `until`); False when nothing more happens before `until`."""
        for replica in self._running():
            if replica.may_work and len(replica.controller.queue):
                await replica.reconcile_next()
                for workload in self.workloads.values():
                    workload.sync()
                return True
        due = self._next_due()
        if due is None or due > until:
            self.clock.elapsed = max(self.clock.elapsed, until)
            return False
        self.clock.elapsed = max(self.clock.elapsed, due)
        for replica in list(self._running()):
            if replica.elector is not None and replica.next_renewal <= self.clock.elapsed:
                await replica.elector.try_acquire_or_renew()
                replica.next_renewal = (self.clock.elapsed +
                                        self.election.retry_period.total_seconds())
            replica.controller.release_due(self.clock.elapsed)
        return True

    async def run_for(self, seconds: float) -> None:
        """Let `seconds` pass, with every reconcile and renewal due meanwhile."""
        until = self.clock.elapsed + seconds
        while await self._step(until):
            pass

    async def run_until(self, check: Callable[[], object], *, within: float,
                        what: str) -> datetime:
        """Run until `check` holds (looked at after every step); the time it first held. Fails
        when it does not within `within` seconds of the cluster's clock."""
        until = self.clock.elapsed + within
        while not check():
            if not await self._step(until):
                raise AssertionError(f"not within {within} s: {what}")
        return self.clock.now()
