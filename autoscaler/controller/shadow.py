"""Shadow mode (`metricscale autoscaler --shadow`): every native HPA decided again by our code on
the inputs kube-controller-manager's HPA controller reads, with nothing written to the target
or the HPA; the verdicts go to /metrics, to Events on the HPA (one per difference), and to one
ConfigMap beside the shadow's Lease, which `metricscale explain --live --shadow` reads.

A shadow reconcile (`ShadowReconciler.reconcile_once`) makes the reads of one of our reconciles
(the target's scale, one metrics read per metric; pods and ReplicaSets from the caches) and no
write but its Events. The HPA's statuses are observed as the watch delivers them
(`ShadowReconciler.observe`): that is where kube-controller-manager's rescales become the
shadow's scale events, and where its decisions meet the shadow's (autoscaler.decision.shadow).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from autoscaler.controller.leader import NotLeader
from autoscaler.controller.reconciler import (
    Caches,
    LeaderCheck,
    MetricsAPI,
    ReconcileResult,
    needs_metrics,
    read_metric,
)
from autoscaler.controller.stats import ShadowMetrics
from autoscaler.controller.watching import AutoscalerEntry, AutoscalerKey
from autoscaler.decision.decide import decide
from autoscaler.decision.events import Event
from autoscaler.decision.persistence import format_reference, history_horizon, needs_persisting
from autoscaler.decision.pod_selection import LABEL_SELECTOR, ReplicaSetOwner
from autoscaler.decision.settings import Settings
from autoscaler.decision.shadow import (
    DIFFER,
    RESULTS,
    UNJUDGED,
    ShadowDecision,
    ShadowState,
    Verdict,
    consistency_wait,
    decision_moment,
    difference_event,
    entry_key,
    hpa_decision,
    judgement_grace,
    next_decision_in,
    note_status,
    observe_status,
    record_decision,
    render_entry,
    rendered_history,
    settle,
    start_state,
)
from autoscaler.kube.operations import EventType, ObjectReference, ScaleTargetRef
from autoscaler.model.fields import ModelError
from autoscaler.model.history import History
from autoscaler.model.metrics import MetricInput
from autoscaler.model.objects import HPA_API_VERSION, HPA_KIND, Autoscaler
from autoscaler.model.pods import Pod, Scale
from autoscaler.model.times import parse_time
from metricscale.kube.discovery import ResourceMapping
from metricscale.kube.errors import Conflict, KubeError, KubeUnavailable
from metricscale.kube.informer import InformerEvent

__all__ = ["CONFIGMAP_BUDGET", "ConfigMapStore", "ShadowKube", "ShadowPublisher",
           "ShadowReconciler"]

logger = logging.getLogger(__name__)

# A ConfigMap holds at most 1 MiB of data; what does not fit is left out (and logged).
CONFIGMAP_BUDGET = 900 * 1024
_LABELS = {"app.kubernetes.io/name": "metricscale-shadow",
           "app.kubernetes.io/part-of": "metricscale"}


def _utc_now() -> datetime:
    return datetime.now(UTC)


class ShadowKube(Protocol):
    """The calls a shadow reconcile makes (autoscaler.kube.operations.KubeClient): reads, and
    Events."""

    async def resolve_scale_target(self, ref: ScaleTargetRef) -> ResourceMapping: ...

    async def get_scale(self, target: ResourceMapping, *, namespace: str, name: str) -> Scale: ...

    async def create_event(
        self, *, regarding: ObjectReference, event_type: EventType, reason: str, note: str,
        now: datetime, action: str = "Scale",
    ) -> bool: ...


class ConfigMapStore(Protocol):
    """The ConfigMap calls of the publisher (KubeClient)."""

    async def read_configmap(self, *, namespace: str,
                             name: str) -> Mapping[str, Any] | None: ...

    async def create_configmap(self, *, namespace: str, name: str, data: Mapping[str, str],
                               labels: Mapping[str, str] | None = None
                               ) -> Mapping[str, Any]: ...

    async def replace_configmap(self, configmap: Mapping[str, Any], *,
                                data: Mapping[str, str]) -> Mapping[str, Any]: ...


def _created(raw: Mapping[str, Any]) -> datetime | None:
    metadata = raw.get("metadata")
    text = metadata.get("creationTimestamp") if isinstance(metadata, Mapping) else None
    if text is None:
        return None
    try:
        return parse_time(text, "metadata.creationTimestamp")
    except ModelError:
        return None


class ShadowReconciler:
    """Decides every HPA as our controller would, writes nothing to it or its target, and
    judges each decision against the HPA's; one instance per controller."""

    def __init__(self, *, kube: ShadowKube, metrics: MetricsAPI, watching: Caches,
                 settings: Settings, leader: LeaderCheck | None = None,
                 stats: ShadowMetrics | None = None,
                 clock: Callable[[], datetime] = _utc_now) -> None:
        self._kube = kube
        self._metrics = metrics
        self._watching = watching
        self._settings = settings
        self._leader = leader
        self._stats = stats
        self._clock = clock
        self._grace = judgement_grace(settings.sync_period)
        self._keep = self._grace * 4
        self._memory: dict[AutoscalerKey, ShadowState] = {}
        self._published: dict[AutoscalerKey, tuple[History, dict[str, Any]]] = {}
        # Called with a key whose decision waits for the HPA's status (set by the server:
        # the work queue's add), so the status that arrives is decided from at once.
        self.wake: Callable[[AutoscalerKey], None] | None = None

    # -- memory --

    def state_of(self, key: AutoscalerKey) -> ShadowState | None:
        return self._memory.get(key)

    def forget(self, key: AutoscalerKey) -> None:
        self._memory.pop(key, None)
        self._published.pop(key, None)
        self._watching.registry.remove(key)
        stats = self._stats
        if stats is not None:
            with contextlib.suppress(KeyError):
                stats.replicas.remove(key.namespace, key.name)
            for result in RESULTS:
                with contextlib.suppress(KeyError):
                    stats.decisions.remove(key.namespace, key.name, result)

    def reset(self) -> None:
        """Leadership changed: start afresh, as kube-controller-manager after a restart (the
        published history is for explain, never read back: it would hold what we decided
        while another replica led)."""
        self._memory.clear()
        self._published.clear()

    # -- the watch: the HPA's decisions and rescales --

    def observe(self, event: InformerEvent[AutoscalerEntry]) -> None:
        """Informer callback: a status kube-controller-manager wrote, seen now (a rescale
        becomes a scale event; the write tells its sync phase)."""
        new = event.new
        if new is None or new.autoscaler is None or new.key.kind != HPA_KIND:
            return
        key = new.key
        state = self._memory.get(key)
        if state is None:
            return  # never reconciled: its first reconcile starts from what it sees then
        old = event.old.autoscaler if event.old is not None else None
        before = old.status if old is not None else None
        after = new.autoscaler.status
        if before == after:
            return
        state, verdicts = observe_status(state, before=before, after=after,
                                         behavior=new.autoscaler.spec.behavior,
                                         now=self._clock(), keep=self._keep)
        for verdict in verdicts:  # agreements only: no Event to post
            state, _ = difference_event(state, verdict, reference="")
            self._count(key, verdict)
        self._memory[key] = state
        if state.waiting_since is not None and self.wake is not None:
            self.wake(key)

    # -- the step --

    async def reconcile_once(self, key: AutoscalerKey, now: datetime) -> ReconcileResult:
        entry = self._watching.get(key)
        if entry is None:
            self.forget(key)
            return ReconcileResult("gone")
        hpa = entry.autoscaler
        if hpa is None:
            return ReconcileResult("invalid")  # kube-controller-manager reports it
        state = self._memory.get(key)
        if state is None:
            state = start_state(created=_created(entry.raw), now=now, spec=hpa.spec,
                                settings=self._settings)
            state = note_status(state, hpa_decision(hpa.status), now=now, keep=self._keep)
        state, verdicts = settle(state, now)
        self._memory[key] = state
        await self._report(entry, hpa, verdicts, now=now)

        ref = hpa.spec.scale_target_ref
        namespace = key.namespace
        try:
            mapping = await self._kube.resolve_scale_target(
                ScaleTargetRef(api_version=ref.api_version, kind=ref.kind, name=ref.name))
            scale = await self._kube.get_scale(mapping, namespace=namespace, name=ref.name)
        except KubeError as err:
            # The HPA reads it (or says why not in its status): ours failing is a problem of
            # the shadow (its RBAC, say), not a decision to compare.
            logger.warning("shadow: cannot read the scale of %s: %s",
                           format_reference(hpa.spec), err)
            self._count_result(key, UNJUDGED)
            unavailable = isinstance(err, KubeUnavailable)
            return ReconcileResult("shadow_failed_get_scale", failed=unavailable,
                                   retry_after=err.retry_after if unavailable else None)

        # The status may have moved on while the scale was read, and the watch may have
        # brought a rescale of kube-controller-manager's: decide from what is known now.
        entry = self._watching.get(key) or entry
        hpa = entry.autoscaler or hpa
        state = self._memory.get(key, state)
        period = self._settings.sync_period
        state, wait = consistency_wait(state, scale_replicas=scale.spec_replicas,
                                       hpa=hpa_decision(hpa.status), now=now, limit=period)
        self._memory[key] = state
        if wait:
            return ReconcileResult("shadow_waiting",
                                   requeue_after=min(1.0, period.total_seconds() / 5))
        history = state.history._replace(scale_watch=None)

        # Our own annotations (pause, dry run) mean nothing to kube-controller-manager.
        autoscaler = replace(hpa, metadata=replace(hpa.metadata, annotations=()))
        pods: list[Pod] = []
        others: dict[str, str] = {}
        inputs: list[MetricInput] = [None] * len(autoscaler.spec.metrics)
        if scale.selector:
            self._watching.registry.update(key, scale.selector)
            pods = self._watching.select_pods(namespace, scale.selector)
            others = self._watching.registry.others_for(key, pods)
            if needs_metrics(autoscaler, scale, settings=self._settings):
                inputs = await self._fetch_metrics(autoscaler, scale.selector)
        replica_sets: Mapping[str, ReplicaSetOwner] | None = None
        if autoscaler.spec.pod_selection_strategy != LABEL_SELECTOR:
            replica_sets = self._watching.replica_sets(namespace)
        # Decided as of the HPA's sync it precedes: their windows and rate limits then end
        # alike (a rate limit's period ending within the lead would otherwise hold ours only).
        moment = decision_moment(state, now=now, period=period)
        decision = decide(autoscaler=autoscaler, scale=scale, pods=pods, metrics=inputs,
                          history=history, now=moment, settings=self._settings,
                          other_selectors=others, replica_sets=replica_sets)
        replicas = decision.new_replicas if decision.rescale else decision.desired_replicas
        if self._stats is not None:
            self._stats.replicas.labels(namespace, key.name).set(replicas)

        # Our recommendation joins the history; the scale events stay upstream's, including
        # any the watch brought while the metrics were read.
        state = self._memory.get(key, state)
        state = state._replace(history=decision.history._replace(
            scale_up_events=state.history.scale_up_events,
            scale_down_events=state.history.scale_down_events, scale_watch=None))
        warmup = state.warmup_until is not None and now < state.warmup_until
        shadow = ShadowDecision(at=now, current=scale.spec_replicas, replicas=replicas,
                                reason=decision.rescale_reason, due=now + self._grace,
                                warmup=warmup, why=decision.explanation,
                                metrics=decision.status.current_metrics,
                                same_by=now + period)
        logger.debug("shadow: from %d replicas, %d (%s)", scale.spec_replicas, replicas,
                     " ".join(decision.explanation))
        state, verdicts = record_decision(state, shadow)
        self._memory[key] = state
        await self._report(entry, hpa, verdicts, now=now)
        # The next decision just before the HPA's next sync: from the same replicas.
        later = next_decision_in(state, now=now, period=period)
        return ReconcileResult("shadow_decided", requeue_after=later.total_seconds())

    async def _fetch_metrics(self, autoscaler: Autoscaler, selector: str) -> list[MetricInput]:
        return list(await asyncio.gather(*(
            read_metric(self._metrics, metric=spec, index=index, selector=selector,
                        namespace=autoscaler.metadata.namespace)
            for index, spec in enumerate(autoscaler.spec.metrics))))

    # -- verdicts: counters, Events --

    def _count_result(self, key: AutoscalerKey, result: str) -> None:
        if self._stats is not None:
            self._stats.decisions.labels(key.namespace, key.name, result).inc()

    def _count(self, key: AutoscalerKey, verdict: Verdict) -> None:
        self._count_result(key, verdict.result)

    async def _report(self, entry: AutoscalerEntry, hpa: Autoscaler,
                      verdicts: Sequence[Verdict], *, now: datetime) -> None:
        key = entry.key
        reference = (f"{hpa.spec.scale_target_ref.kind}/{key.namespace}/"
                     f"{hpa.spec.scale_target_ref.name}")
        events: list[Event] = []
        for verdict in verdicts:
            self._count(key, verdict)
            state = self._memory.get(key)
            if state is None:
                continue
            state, event = difference_event(state, verdict, reference=reference)
            self._memory[key] = state
            if event is not None:
                events.append(event)
        for verdict in verdicts:
            if verdict.result == DIFFER:
                # One line a difference (not only a new one): why metricscale decided so.
                logger.info("shadow: differs from the HPA %s (%s): %s",
                            "on values read apart" if verdict.moved else "on the same values",
                            verdict.hpa, " ".join(verdict.decision.why))
        for event in events:
            logger.info("%s", event.message)
            if self._leader is not None:
                self._leader.ensure()
            await self._kube.create_event(
                regarding=ObjectReference.from_object(entry.raw, api_version=HPA_API_VERSION,
                                                      kind=HPA_KIND),
                event_type="Warning" if event.type == "Warning" else "Normal",
                reason=event.reason, note=event.message, now=now, action="Shadow")

    # -- what explain reads --

    def entries(self, now: datetime) -> dict[str, str]:
        """Every HPA's ConfigMap entry (autoscaler.decision.shadow.render_entry). The history
        is rendered again only when the last rendering stops describing it (as the native
        mode's annotation), so a steady state renders the same entry."""
        found: dict[str, str] = {}
        for key, state in self._memory.items():
            entry = self._watching.get(key)
            if entry is None or entry.autoscaler is None:
                continue
            rendered: dict[str, Any] | None = None
            if state.history.recommendations is not None:
                horizon = history_horizon(entry.autoscaler.spec, self._settings)
                published = self._published.get(key)
                if published is None or needs_persisting(published[0], state.history, now=now,
                                                         horizon=horizon):
                    published = (state.history, rendered_history(state.history, now=now,
                                                                  horizon=horizon))
                    self._published[key] = published
                rendered = published[1]
            found[entry_key(key.namespace, key.name)] = render_entry(state, history=rendered)
        return found


def within_budget(data: Mapping[str, str], budget: int) -> tuple[dict[str, str], int]:
    """The entries that fit in `budget` bytes, in key order; and how many were left out."""
    kept: dict[str, str] = {}
    used = 0
    left_out = 0
    for key in sorted(data):
        size = len(key.encode()) + len(data[key].encode())
        if used + size > budget:
            left_out += 1
            continue
        kept[key] = data[key]
        used += size
    return kept, left_out


class ShadowPublisher:
    """Writes the shadow's entries to its ConfigMap (beside its Lease), when they changed: at
    most one write per sync period, none in a steady state."""

    def __init__(self, store: ConfigMapStore, reconciler: ShadowReconciler, *, namespace: str,
                 name: str, leader: LeaderCheck | None = None,
                 stats: ShadowMetrics | None = None, budget: int = CONFIGMAP_BUDGET) -> None:
        self._store = store
        self._reconciler = reconciler
        self._namespace = namespace
        self._name = name
        self._leader = leader
        self._stats = stats
        self._budget = budget
        self._written: dict[str, str] | None = None
        self._left_out = 0

    def reset(self) -> None:
        self._written = None

    async def publish_once(self, now: datetime) -> bool:
        """Write the entries if they changed; whether a write was made. Raises KubeError."""
        data, left_out = within_budget(self._reconciler.entries(now), self._budget)
        if left_out != self._left_out:
            self._left_out = left_out
            if left_out:
                logger.warning("shadow: %d HPAs left out of ConfigMap %s/%s (over %d bytes): "
                               "explain --live --shadow cannot show them; shadow fewer HPAs "
                               "per shadow (--shadow-selector)", left_out, self._namespace,
                               self._name, self._budget)
        if data == self._written:
            return False
        if self._leader is not None:
            self._leader.ensure()
        current = await self._store.read_configmap(namespace=self._namespace, name=self._name)
        if current is None:
            await self._store.create_configmap(namespace=self._namespace, name=self._name,
                                               data=data, labels=_LABELS)
        else:
            await self._store.replace_configmap(current, data=data)
        self._written = data
        return True

    async def run(self, *, period: timedelta, clock: Callable[[], datetime] = _utc_now,
                  wait_until_leader: Callable[[], Any] | None = None) -> None:
        """Publish once per period while leading, until cancelled; failures are logged and
        tried again next period."""
        while True:
            await asyncio.sleep(period.total_seconds())
            if wait_until_leader is not None:
                await wait_until_leader()
            try:
                await self.publish_once(clock())
            except NotLeader:
                self.reset()
            except Conflict:
                pass  # written under us (a replica that led a moment ago): next period
            except KubeError as err:
                if self._stats is not None:
                    self._stats.publish_failures.inc()
                logger.warning("shadow: ConfigMap %s/%s not written: %s", self._namespace,
                               self._name, err)
