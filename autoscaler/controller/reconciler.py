"""One reconcile of one autoscaler: read, decide, write (`Reconciler.reconcile_once`).

The steps are upstream's `reconcileAutoscaler` with the I/O around the pure decision: the
autoscaler and its pods come from the watch caches, the target's scale is one GET, each metric
one GET through the API server; `decide` computes; the scale is written (update with the
resourceVersion, re-read and retried on 409, unless dry run) and `complete` applies the
outcome; Events are posted best effort; the status is written only when it changed, with the
history that upstream keeps only in memory (see autoscaler.decision.persistence). In a steady state
that is one scale GET and one metrics GET per metric: no other request.

Every write first asks the leader guard, so a replica that lost its lease writes nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from prometheus_client import Gauge

from autoscaler.controller.stats import ControllerMetrics
from autoscaler.controller.watching import (
    AutoscalerEntry,
    AutoscalerKey,
    SelectorRegistry,
    project_autoscaler,
)
from autoscaler.decision.conditions import ACTIVE, FALLBACK, PAUSED
from autoscaler.decision.conflicts import CONFLICT_CONDITION, EXTERNAL_CHANGE_REASON
from autoscaler.decision.decide import (
    SCALE_WRITE_DRY_RUN,
    SCALE_WRITE_SUCCEEDED,
    Decision,
    Event,
    ScaleWriteResult,
    complete,
    decide,
)
from autoscaler.decision.handover import Carried, carried_history
from autoscaler.decision.persistence import (
    HISTORY_ANNOTATION,
    format_reference,
    format_targets,
    history_horizon,
    is_dry_run,
    needs_persisting,
    render_history_annotation,
    render_persisted_history,
    restore_history,
)
from autoscaler.decision.pod_selection import LABEL_SELECTOR, ReplicaSetOwner
from autoscaler.decision.settings import Settings
from autoscaler.kube.metrics_api import MetricsError
from autoscaler.kube.operations import (
    KubeWrites,
    ObjectReference,
    ScaleTargetRef,
)
from autoscaler.model.fields import ModelError
from autoscaler.model.history import History
from autoscaler.model.metrics import (
    MetricFetchError,
    MetricInput,
    empty_metric_list,
    parse_metric_input,
)
from autoscaler.model.objects import HPA_KIND, Autoscaler
from autoscaler.model.pods import Pod, Scale, ScaleError
from autoscaler.model.spec import MetricSpec
from autoscaler.model.status import AutoscalerStatus, render_status
from autoscaler.model.times import format_time
from metricscale.core.selectors import LabelSelector
from metricscale.kube.discovery import ResourceMapping
from metricscale.kube.errors import KubeError, KubeUnavailable

__all__ = [
    "Caches",
    "KubeWrites",
    "LeaderCheck",
    "MetricsAPI",
    "ReconcileResult",
    "Reconciler",
    "fetch_metric",
    "metric_input_from_error",
]

logger = logging.getLogger(__name__)

# The conditions of our own features, exported per autoscaler while set.
FEATURE_CONDITIONS = (PAUSED, FALLBACK, ACTIVE, CONFLICT_CONDITION)


def _remove(gauge: Gauge, *labels: str) -> None:
    """Drop one labelled series if it exists."""
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)

@dataclass(frozen=True)
class ReconcileResult:
    """How one reconcile ended. `failed` means "try again sooner than usual is pointless, back
    off": an API write failed or the reconcile raised. A decision that reports a problem in
    the autoscaler's conditions (a metric is missing, the target is gone) is not a failure."""

    outcome: str
    failed: bool = False
    retry_after: float | None = None
    sync_period: float | None = None  # spec.behavior.syncPeriodSeconds (KEP-6003), if set
    requeue_after: float | None = None  # sooner than the sync period, without a failure


class MetricsAPI(Protocol):
    """autoscaler.kube.metrics_api.MetricsClient."""

    async def get_resource_metrics(self, *, namespace: str,
                                   pod_selector: str) -> dict[str, Any]: ...

    async def get_pods_metric(self, *, namespace: str, metric_name: str, pod_selector: str,
                              metric_selector: LabelSelector | None) -> dict[str, Any]: ...

    async def get_object_metric(self, *, namespace: str, metric_name: str,
                                described_object: Mapping[str, Any],
                                metric_selector: LabelSelector | None) -> dict[str, Any]: ...

    async def get_external_metric(self, *, namespace: str, metric_name: str,
                                  metric_selector: LabelSelector | None) -> dict[str, Any]: ...


class LeaderCheck(Protocol):
    def ensure(self) -> None: ...


class Caches(Protocol):
    """What a reconcile reads from the watch caches (autoscaler.controller.watching.Watching)."""

    @property
    def registry(self) -> SelectorRegistry: ...

    def get(self, key: AutoscalerKey) -> AutoscalerEntry | None: ...

    def select_pods(self, namespace: str, selector: str) -> list[Pod]: ...

    def replica_sets(self, namespace: str) -> Mapping[str, ReplicaSetOwner]: ...


class _AlwaysLeader:
    def ensure(self) -> None:
        return None


# --------------------------------------------------------------------------------------------
# Metrics: one request per metric


def metric_input_from_error(metric_type: str, error: MetricsError) -> MetricInput:
    """A failed metrics call as the decision's input: the empty list the metric type reads
    when the API answered with no metrics (the decision then says so in upstream's words),
    else the failure's detail (the decision adds upstream's prefix itself)."""
    if error.empty:
        empty = empty_metric_list(metric_type)
        if empty is not None:
            return empty
    return MetricFetchError(message=error.detail)


async def fetch_metric(metrics: MetricsAPI, *, metric: MetricSpec, namespace: str,
                       selector: str) -> dict[str, Any] | None:
    """The metrics API's answer for one spec.metrics entry (the list, as the wire sends it),
    or None for a metric type nobody asks about. Raises MetricsError."""
    if metric.type in {"Resource", "ContainerResource"}:
        return await metrics.get_resource_metrics(namespace=namespace, pod_selector=selector)
    if metric.type == "Pods" and metric.pods is not None:
        return await metrics.get_pods_metric(
            namespace=namespace, metric_name=metric.pods.metric.name, pod_selector=selector,
            metric_selector=metric.pods.metric.selector)
    if metric.type == "Object" and metric.object is not None:
        described = metric.object.described_object
        return await metrics.get_object_metric(
            namespace=namespace, metric_name=metric.object.metric.name,
            described_object={"apiVersion": described.api_version,
                              "kind": described.kind, "name": described.name},
            metric_selector=metric.object.metric.selector)
    if metric.type == "External" and metric.external is not None:
        return await metrics.get_external_metric(
            namespace=namespace, metric_name=metric.external.metric.name,
            metric_selector=metric.external.metric.selector)
    return None


async def read_metric(metrics: MetricsAPI, *, metric: MetricSpec, index: int, namespace: str,
                      selector: str) -> MetricInput:
    """One spec.metrics entry's input to the decision: the parsed answer, or its failure."""
    try:
        answer = await fetch_metric(metrics, metric=metric, namespace=namespace,
                                    selector=selector)
    except MetricsError as err:
        return metric_input_from_error(metric.type, err)
    try:
        return parse_metric_input(answer, f"metrics[{index}]", metric_type=metric.type)
    except ModelError as err:
        return MetricFetchError(message=f"the metrics API answered what the autoscaler cannot "
                                        f"read: {err}")


def needs_metrics(autoscaler: Autoscaler, scale: Scale, *, settings: Settings) -> bool:
    """Whether the decision will look at metrics (upstream asks for none otherwise)."""
    spec = autoscaler.spec
    minimum = spec.min_replicas if spec.min_replicas is not None else 1
    if not scale.selector:
        return False
    if scale.spec_replicas == 0:
        return settings.scale_to_zero
    return minimum <= scale.spec_replicas <= spec.max_replicas


# --------------------------------------------------------------------------------------------
# The reconciler


@dataclass
class _Memory:
    """What the controller remembers of one autoscaler between reconciles."""

    history: History
    persisted: History | None  # the history the autoscaler carries (last written or read)
    ignored_pods: int | None = None  # KEP-5325: status.ignoredPods with OwnerReferences
    failing_metrics: frozenset[str] = frozenset()  # the metric_read_failures series set
    written: _Written | None = None  # our last status write, until the cache has it


@dataclass(frozen=True)
class _Written:
    """The status this controller last wrote, and the resourceVersion of the object it
    changed. While the watch cache still holds that version, the cache has not seen the
    write, and a reconcile must decide from what was written: a transition decided from the
    older status would post its event twice, or miss one (an immediate sync and a periodic
    one can run back to back, faster than the watch delivers the first one's write)."""

    before: str
    status: Mapping[str, Any]


def _resource_version(raw: Mapping[str, Any]) -> str | None:
    metadata = raw.get("metadata")
    version = metadata.get("resourceVersion") if isinstance(metadata, Mapping) else None
    return str(version) if version is not None else None


def invalid_spec_status(current: Mapping[str, Any], *, error: str, generation: int | None,
                        now: datetime) -> dict[str, Any] | None:
    """The status of an autoscaler whose spec cannot be used, or None when it already says so.

    ScalingActive turns False with reason InvalidSpec and the parser's words (which name the
    field); every other field and condition is kept as the last good reconcile left it.
    """
    message = f"the autoscaler cannot be used: {error}"
    raw_conditions = current.get("conditions")
    conditions = [c for c in raw_conditions if isinstance(c, Mapping)] \
        if isinstance(raw_conditions, list) else []
    previous = next((c for c in conditions if c.get("type") == "ScalingActive"), None)
    if (previous is not None and previous.get("status") == "False"
            and previous.get("reason") == "InvalidSpec" and previous.get("message") == message
            and (generation is None or current.get("observedGeneration") == generation)):
        return None
    transition = (previous.get("lastTransitionTime")
                  if previous is not None and previous.get("status") == "False"
                  and previous.get("lastTransitionTime") else format_time(now))
    condition = {"type": "ScalingActive", "status": "False", "lastTransitionTime": transition,
                 "reason": "InvalidSpec", "message": message}
    status = dict(current)
    status["conditions"] = [dict(c) if c is not previous else condition for c in conditions]
    if previous is None:
        status["conditions"].append(condition)
    # Required by the schema; a never-reconciled HPA reads 0 there too (Go's zero value).
    status.setdefault("desiredReplicas", 0)
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def _status_core(status: AutoscalerStatus) -> AutoscalerStatus:
    return status._replace(observed_generation=None)


class Reconciler:
    """Reads from the caches, decides, writes; one instance per controller."""

    def __init__(
        self,
        *,
        kube: KubeWrites,
        metrics: MetricsAPI,
        watching: Caches,
        settings: Settings,
        dry_run: bool = False,
        leader: LeaderCheck | None = None,
        controller_metrics: ControllerMetrics | None = None,
    ) -> None:
        self._kube = kube
        self._metrics = metrics
        self._watching = watching
        self._settings = settings
        self._dry_run = dry_run
        self._leader = leader or _AlwaysLeader()
        self._stats = controller_metrics
        self._memory: dict[AutoscalerKey, _Memory] = {}
        self._reported_invalid: dict[AutoscalerKey, int | None] = {}

    # -- memory --

    def forget(self, key: AutoscalerKey) -> None:
        self._forget_features(key)
        self._memory.pop(key, None)
        self._reported_invalid.pop(key, None)
        self._watching.registry.remove(key)

    def reset(self) -> None:
        self._memory.clear()

    def history_of(self, key: AutoscalerKey) -> History | None:
        memory = self._memory.get(key)
        return memory.history if memory is not None else None

    def _remember(self, entry: AutoscalerEntry, now: datetime) -> _Memory:
        memory = self._memory.get(entry.key)
        if memory is not None:
            return memory
        try:
            # An Autoscaler handed over from an HPA carries it in an annotation until the
            # first status is written (autoscaler.decision.handover).
            carried = carried_history(kind=entry.key.kind, status=entry.status,
                                      annotations=entry.annotations)
        except ModelError as err:
            logger.warning("the persisted history cannot be read (%s); starting afresh", err)
            carried = Carried(None, None)
        memory = _Memory(history=restore_history(carried.history, now=now),
                         persisted=carried.stored)
        self._memory[entry.key] = memory
        return memory

    @staticmethod
    def _with_own_write(entry: AutoscalerEntry, memory: _Memory) -> AutoscalerEntry:
        """The cached entry, with the status this controller wrote if the cache is still at
        the version that write replaced (see _Written); once the cache moved past it, the
        cache is the truth again."""
        written = memory.written
        if written is None:
            return entry
        if _resource_version(entry.raw) != written.before:
            memory.written = None
            return entry
        return project_autoscaler({**entry.raw, "status": dict(written.status)},
                                  kind=entry.key.kind)

    # -- the step --

    async def reconcile_once(self, key: AutoscalerKey, now: datetime) -> ReconcileResult:
        entry = self._watching.get(key)
        if entry is None:
            self.forget(key)
            return ReconcileResult("gone")
        autoscaler = entry.autoscaler
        if autoscaler is None:
            return await self._invalid(entry, now)
        memory = self._remember(entry, now)
        entry = self._with_own_write(entry, memory)
        autoscaler = entry.autoscaler
        if autoscaler is None:
            return await self._invalid(entry, now)
        namespace = autoscaler.metadata.namespace
        ref = autoscaler.spec.scale_target_ref

        mapping: ResourceMapping | None = None
        scale: Scale | ScaleError
        failed, retry_after = False, None
        try:
            mapping = await self._kube.resolve_scale_target(
                ScaleTargetRef(api_version=ref.api_version, kind=ref.kind, name=ref.name))
            scale = await self._kube.get_scale(mapping, namespace=namespace, name=ref.name)
        except KubeError as err:
            scale = ScaleError(message=str(err))
            if isinstance(err, KubeUnavailable):
                failed, retry_after = True, err.retry_after
        pods = []
        others: dict[str, str] = {}
        inputs: list[MetricInput] = [None] * len(autoscaler.spec.metrics)
        if isinstance(scale, Scale) and scale.selector:
            self._watching.registry.update(key, scale.selector)
            pods = self._watching.select_pods(namespace, scale.selector)
            others = self._watching.registry.others_for(key, pods)
            if needs_metrics(autoscaler, scale, settings=self._settings):
                inputs = await self._fetch_metrics(autoscaler, entry=entry,
                                                   selector=scale.selector)
        # KEP-5325: with OwnerReferences the decision picks the target's own pods (and their
        # metric values) out of the selector's, by the ReplicaSets the cache holds.
        replica_sets: Mapping[str, ReplicaSetOwner] | None = None
        if autoscaler.spec.pod_selection_strategy != LABEL_SELECTOR:
            replica_sets = self._watching.replica_sets(namespace)

        decision = decide(autoscaler=autoscaler, scale=scale, pods=pods, metrics=inputs,
                          history=memory.history, now=now, settings=self._settings,
                          other_selectors=others, replica_sets=replica_sets)
        if isinstance(scale, Scale) and scale.selector:
            memory.ignored_pods = decision.ignored_pods
        dry_run = is_dry_run(entry.annotations, globally=self._dry_run)
        outcome = self._outcome(decision, scale, dry_run=dry_run)
        if decision.rescale:
            if dry_run:
                result = SCALE_WRITE_DRY_RUN
            else:
                assert mapping is not None and isinstance(scale, Scale)
                self._leader.ensure()
                try:
                    await self._kube.update_scale(mapping, namespace=namespace, name=ref.name,
                                                  scale=scale,
                                                  replicas=decision.new_replicas)
                    result = SCALE_WRITE_SUCCEEDED
                except KubeError as err:
                    result = ScaleWriteResult(error=str(err))
                    failed, retry_after = True, err.retry_after
                    outcome = "failed_rescale"
            decision = complete(decision, write_result=result, settings=self._settings, now=now)
        memory.history = decision.history
        if self._stats is not None and any(e.reason == EXTERNAL_CHANGE_REASON
                                           for e in decision.events):
            self._stats.external_scale_changes.labels(namespace,
                                                      autoscaler.metadata.name).inc()
        self._log(decision, autoscaler, dry_run=dry_run)

        await self._post_events(entry, decision.events, now=now)
        if not await self._write_status(entry, autoscaler=autoscaler, decision=decision,
                                        memory=memory, now=now):
            failed = True
        behavior = autoscaler.spec.behavior
        period = behavior.sync_period_seconds if behavior is not None else None
        if self._stats is not None:
            self._stats.decisions.labels(outcome).inc()
            self._record_features(entry.key, decision=decision, memory=memory, period=period)
        return ReconcileResult(outcome, failed=failed, retry_after=retry_after,
                               sync_period=float(period) if period is not None else None)

    def _record_features(self, key: AutoscalerKey, *, decision: Decision, memory: _Memory,
                         period: int | None) -> None:
        """The /metrics series of our own features, for this autoscaler: set while in use,
        removed when not (so the features cost nothing to autoscalers that do not use them)."""
        stats = self._stats
        assert stats is not None
        who = (key.namespace, key.name)
        conditions = {c.type: c.status for c in decision.status.conditions}
        for kind in FEATURE_CONDITIONS:
            status = conditions.get(kind)
            if status is None:
                _remove(stats.feature_condition, *who, kind)
            else:
                stats.feature_condition.labels(*who, kind).set(1 if status == "True" else 0)
        failing = {str(f.metric): f.failures for f in decision.history.metric_failures}
        for metric in memory.failing_metrics - failing.keys():
            _remove(stats.metric_read_failures, *who, metric)
        for metric, failures in failing.items():
            stats.metric_read_failures.labels(*who, metric).set(failures)
        memory.failing_metrics = frozenset(failing)
        if memory.ignored_pods is None:
            _remove(stats.ignored_pods, *who)
        else:
            stats.ignored_pods.labels(*who).set(memory.ignored_pods)
        if period is None:
            _remove(stats.sync_period, *who)
        else:
            stats.sync_period.labels(*who).set(period)

    def _forget_features(self, key: AutoscalerKey) -> None:
        stats = self._stats
        if stats is None:
            return
        who = (key.namespace, key.name)
        for kind in FEATURE_CONDITIONS:
            _remove(stats.feature_condition, *who, kind)
        memory = self._memory.get(key)
        for metric in memory.failing_metrics if memory is not None else ():
            _remove(stats.metric_read_failures, *who, metric)
        _remove(stats.ignored_pods, *who)
        _remove(stats.sync_period, *who)

    async def _fetch_metrics(self, autoscaler: Autoscaler, *, entry: AutoscalerEntry,
                             selector: str) -> list[MetricInput]:
        return list(await asyncio.gather(*(
            read_metric(self._metrics, metric=spec, index=index, selector=selector,
                        namespace=autoscaler.metadata.namespace)
            for index, spec in enumerate(autoscaler.spec.metrics))))

    # -- outcomes and logs --

    @staticmethod
    def _outcome(decision: Decision, scale: Scale | ScaleError, *, dry_run: bool) -> str:
        if isinstance(scale, ScaleError):
            return "failed_get_scale"
        if decision.rescale:
            direction = "scale_up" if decision.new_replicas > scale.spec_replicas \
                else "scale_down"
            return f"dry_run_{direction}" if dry_run else direction
        return "failed_metrics" if decision.error is not None else "no_change"

    def _log(self, decision: Decision, autoscaler: Autoscaler, *, dry_run: bool) -> None:
        reference = format_reference(autoscaler.spec)
        if decision.rescale:
            if dry_run:
                logger.info("dry run: would scale %s to %d (%s)", reference,
                            decision.new_replicas, decision.rescale_reason)
            elif decision.scale_updated:
                logger.info("scaled %s to %d (%s)", reference, decision.new_replicas,
                            decision.rescale_reason)
        if decision.error is not None:
            logger.warning("%s", decision.error)

    # -- writes --

    async def _post_events(self, entry: AutoscalerEntry, events: Sequence[Event], *,
                           now: datetime) -> None:
        if not events:
            return
        regarding = ObjectReference.from_object(entry.raw)
        for event in events:
            if event.type == "Warning" and self._stats is not None:
                self._stats.errors.labels(event.reason).inc()
            self._leader.ensure()
            # One `now` for every event of a reconcile: the client names them uniquely.
            await self._kube.create_event(
                regarding=regarding, event_type="Warning" if event.type == "Warning"
                else "Normal", reason=event.reason, note=event.message, now=now)

    async def _write_status(self, entry: AutoscalerEntry, *, autoscaler: Autoscaler,
                            decision: Decision, memory: _Memory, now: datetime) -> bool:
        """Write the status if it changed (and the history if it must); False on failure."""
        key = entry.key
        horizon = history_horizon(autoscaler.spec, self._settings)
        persist = needs_persisting(memory.persisted, decision.history, now=now, horizon=horizon,
                                   spec=autoscaler.spec)
        changed = decision.status != autoscaler.status and (
            _status_core(decision.status) != _status_core(autoscaler.status))
        namespace, name = key.namespace, key.name
        try:
            if key.kind == HPA_KIND:
                if changed:
                    status = render_status(decision.status)
                    status.pop("observedGeneration", None)
                    self._leader.ensure()
                    await self._kube.write_hpa_status(namespace=namespace, name=name,
                                                      status=status, previous=entry.status)
                    self._remember_write(entry, memory, status)
                if persist:
                    await self._write_history_annotation(entry, decision.history, now=now,
                                                         horizon=horizon)
                    memory.persisted = decision.history
                return True
            extras: dict[str, Any] = {
                "reference": format_reference(autoscaler.spec),
                "targets": format_targets(autoscaler.spec, decision.status),
            }
            if entry.generation is not None:
                extras["observedGeneration"] = entry.generation
            if memory.ignored_pods is not None:
                extras["ignoredPods"] = memory.ignored_pods
            current = entry.status
            if persist:
                extras["history"] = render_persisted_history(decision.history, now=now,
                                                             horizon=horizon)
            elif current.get("history") is not None:
                extras["history"] = current["history"]
            if not changed and not persist and all(current.get(k) == v
                                                   for k, v in extras.items()):
                return True  # the steady state: nothing rendered, nothing written
            status = render_status(decision.status)
            status.update(extras)
            self._leader.ensure()
            await self._kube.write_autoscaler_status(namespace=namespace, name=name,
                                                     status=status, previous=current)
            self._remember_write(entry, memory, status)
        except KubeError as err:
            logger.warning("failed to update status for %s: %s", name, err)
            if self._stats is not None:
                self._stats.errors.labels("FailedUpdateStatus").inc()
            self._leader.ensure()
            await self._kube.create_event(regarding=ObjectReference.from_object(entry.raw),
                                          event_type="Warning", reason="FailedUpdateStatus",
                                          note=str(err), now=now)
            return False
        if persist:
            memory.persisted = decision.history
        return True

    @staticmethod
    def _remember_write(entry: AutoscalerEntry, memory: _Memory,
                        status: Mapping[str, Any]) -> None:
        before = _resource_version(entry.raw)
        memory.written = _Written(before=before, status=status) if before is not None else None

    async def _write_history_annotation(self, entry: AutoscalerEntry, history: History, *,
                                        now: datetime, horizon: timedelta) -> None:
        """A native HPA keeps its history in an annotation (its status schema is fixed)."""
        value = render_history_annotation(history, now=now, horizon=horizon)
        self._leader.ensure()
        await self._kube.patch_hpa_annotations(namespace=entry.key.namespace,
                                               name=entry.key.name,
                                               annotations={HISTORY_ANNOTATION: value})

    async def _invalid(self, entry: AutoscalerEntry, now: datetime) -> ReconcileResult:
        """An object the API server should have refused (e.g. written before a schema change):
        report it once per generation, and carry on with every other autoscaler."""
        if self._stats is not None:
            self._stats.decisions.labels("invalid").inc()
        if self._reported_invalid.get(entry.key, -1) != entry.generation:
            self._reported_invalid[entry.key] = entry.generation
            logger.warning("the autoscaler cannot be used: %s", entry.error)
            if self._stats is not None:
                self._stats.errors.labels("InvalidSpec").inc()
            self._leader.ensure()
            await self._kube.create_event(regarding=ObjectReference.from_object(entry.raw),
                                          event_type="Warning", reason="InvalidSpec",
                                          note=f"the autoscaler cannot be used: {entry.error}",
                                          now=now)
        if entry.key.kind != HPA_KIND:  # a native HPA's spec is the API server's to refuse
            await self._write_invalid_status(entry, now=now)
        return ReconcileResult("invalid")

    async def _write_invalid_status(self, entry: AutoscalerEntry, *, now: datetime) -> None:
        """Say why in the status too: `kubectl describe` shows conditions, events expire."""
        status = invalid_spec_status(entry.status, error=entry.error or "unreadable spec",
                                     generation=entry.generation, now=now)
        if status is None:
            return
        try:
            self._leader.ensure()
            await self._kube.write_autoscaler_status(namespace=entry.key.namespace,
                                                     name=entry.key.name, status=status,
                                                     previous=entry.status)
        except KubeError as err:
            logger.warning("failed to update status for %s: %s", entry.key.name, err)
            if self._stats is not None:
                self._stats.errors.labels("FailedUpdateStatus").inc()
