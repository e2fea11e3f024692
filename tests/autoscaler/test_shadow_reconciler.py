"""autoscaler.controller.shadow against in-memory doubles: a shadow beside an upstream-like HPA
controller (our own reconciler in native mode stands in for kube-controller-manager, writing
the target's scale and the HPA's status) agrees with it step for step, because it keeps
upstream's rescales as its scale events; it writes nothing; a persistent difference is one
Event; and what it publishes for explain is written only when it changes."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.controller.reconciler import Reconciler
from autoscaler.controller.shadow import ShadowPublisher, ShadowReconciler, within_budget
from autoscaler.controller.stats import ShadowMetrics
from autoscaler.controller.watching import AutoscalerKey, project_pod
from autoscaler.decision.settings import Settings
from autoscaler.decision.shadow import SHADOW_EVENT_REASON, parse_entry
from metricscale.kube.informer import InformerEvent, ObjectKey
from testbed.fakes.kube_objects import Container, pod
from tests.autoscaler.controller_support import MemoryCaches, MemoryKube, MemoryMetrics

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
NS = "shop"
KEY = AutoscalerKey("HorizontalPodAutoscaler", NS, "web")
QPS = {"type": "Pods", "pods": {"metric": {"name": "qps"},
                                "target": {"type": "AverageValue", "averageValue": "10"}}}
# Two pods a minute up: a shadow that did not know upstream's rescales would go faster.
BEHAVIOR = {"scaleUp": {"stabilizationWindowSeconds": 0,
                        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
            "scaleDown": {"stabilizationWindowSeconds": 45,
                          "policies": [{"type": "Pods", "value": 1, "periodSeconds": 30}]}}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def hpa(*, created: datetime = T0, behavior: Mapping[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                               "name": "web"},
                            "minReplicas": 1, "maxReplicas": 10, "metrics": [QPS]}
    if behavior is not None:
        spec["behavior"] = dict(behavior)
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "namespace": NS, "uid": "uid-web", "generation": 1,
                         "resourceVersion": "1",
                         "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ")},
            "spec": spec}


class Bed:
    """One Deployment `web` with an HPA; `upstream` stands in for kube-controller-manager
    (it writes the scale and the HPA's status, which the shadow sees as the watch delivers
    it), `shadow` watches. Pods follow the scale, sharing the total load."""

    def __init__(self, *, replicas: int = 2, total: int = 20,
                 shadow_settings: Settings | None = None,
                 behavior: Mapping[str, Any] | None = BEHAVIOR, created: datetime = T0) -> None:
        self.caches = MemoryCaches()
        self.upstream_kube = MemoryKube(self.caches)
        self.kube = MemoryKube(self.caches, scales=self.upstream_kube.scales)
        self.metrics = MemoryMetrics()
        self.total = total
        self.now = T0
        self.caches.put(hpa(created=created, behavior=behavior))
        self.upstream_kube.set_scale(NS, "web", replicas=replicas, selector="app=web")
        self.follow_scale()
        self.upstream = Reconciler(kube=self.upstream_kube, metrics=self.metrics,
                                   watching=self.caches, settings=Settings())
        self.registry = CollectorRegistry()
        self.stats = ShadowMetrics(self.registry)
        self.shadow = ShadowReconciler(kube=self.kube, metrics=self.metrics,
                                       watching=self.caches,
                                       settings=shadow_settings or Settings(),
                                       stats=self.stats, clock=lambda: self.now)
        self.woken: list[AutoscalerKey] = []
        self.wake_up = True
        self.shadow.wake = self.woken.append
        self.hpa_desired: list[int] = []
        self.shadow_replicas: list[int] = []

    def follow_scale(self) -> None:
        replicas = self.upstream_kube.replicas(NS, "web")
        values = self.metrics.pod_values.setdefault("qps", {})
        for index in range(replicas):
            name = f"web-{index}"
            if name not in values:
                self.caches.add_pod(project_pod(pod(
                    name, namespace=NS, now=T0 - timedelta(hours=1), labels={"app": "web"},
                    containers=(Container(cpu_request="500m"),))))
        for name in [n for n in values if int(n.split("-")[1]) >= replicas]:
            del values[name]
            self.caches.pods.remove(project_pod(pod(name, namespace=NS, now=T0,
                                                    labels={"app": "web"})))
        for index in range(replicas):
            values[f"web-{index}"] = str(Decimal(self.total) / replicas)

    async def upstream_sync(self, seconds: float) -> None:
        self.now = at(seconds)
        before = self.caches.get(KEY)
        await self.upstream.reconcile_once(KEY, at(seconds))
        after = self.caches.get(KEY)
        assert after is not None
        if before != after:
            self.shadow.observe(InformerEvent("MODIFIED", ObjectKey(NS, "web"), before, after))
        desired = after.autoscaler.status.desired_replicas if after.autoscaler else -1
        if not self.hpa_desired or self.hpa_desired[-1] != desired:
            self.hpa_desired.append(desired)
        if self.woken and self.wake_up:
            # The work queue runs a woken key at once: before the new pods exist.
            self.woken.clear()
            await self.shadow_sync(seconds + 0.05)
        self.follow_scale()

    async def shadow_sync(self, seconds: float) -> str:
        self.now = at(seconds)
        result = await self.shadow.reconcile_once(KEY, at(seconds))
        value = self.registry.get_sample_value(
            "metricscale_shadow_replicas", {"namespace": NS, "horizontalpodautoscaler": "web"})
        if value is not None and (not self.shadow_replicas
                                  or self.shadow_replicas[-1] != int(value)):
            self.shadow_replicas.append(int(value))
        return result.outcome

    def count(self, result: str) -> float:
        return self.registry.get_sample_value(
            "metricscale_shadow_decisions_total",
            {"namespace": NS, "horizontalpodautoscaler": "web", "result": result}) or 0

    async def run(self, profile: list[tuple[int, int]], *, offset: float = -1.5) -> None:
        """Each (seconds, total load) from then on; both sync every 15 s, the shadow `offset`
        from upstream (by default as the controller schedules it: just before)."""
        end = profile[-1][0]
        for start in range(0, end + 1, 15):
            self.total = next(total for when, total in reversed(profile) if when <= start)
            self.follow_scale()
            for _, sync in sorted([(start, self.upstream_sync), (start + offset,
                                                                  self.shadow_sync)],
                                  key=lambda step: step[0]):
                await sync(start if sync == self.upstream_sync else start + offset)


@pytest.mark.parametrize("offset", [-1.5, 0.5, 7, 14.5])
async def test_the_shadow_agrees_with_upstream_step_for_step_under_rate_limits(
        offset: float) -> None:
    bed = Bed(replicas=2, total=20)
    # 20 over 2 pods: on target. 90: 9 pods, two a minute. 10: down to 1, one per 30 s after
    # the 45 s window. Whatever the two controllers' sync phases.
    await bed.run([(0, 20), (60, 90), (300, 10), (600, 10)], offset=offset)
    assert bed.hpa_desired == [2, 4, 6, 8, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    assert bed.shadow_replicas == bed.hpa_desired
    assert bed.count("differ") == 0 and bed.count("agree") >= 40
    assert bed.count("warmup") == 0 and bed.count("unjudged") == 0


async def test_without_upstreams_rescales_as_scale_events_the_shadow_would_differ() -> None:
    """The control: the same run, the shadow blind to the HPA's status changes."""
    bed = Bed(replicas=2, total=20)
    bed.shadow.observe = lambda event: None  # type: ignore[method-assign]
    await bed.run([(0, 20), (60, 90), (300, 90)], offset=7)
    # Without upstream's scale events, no rate limit: 6 while the HPA holds 4.
    assert bed.hpa_desired == [2, 4, 6, 8, 9]
    assert bed.shadow_replicas[:3] == [2, 6, 8]


async def test_the_shadow_writes_nothing_but_events() -> None:
    bed = Bed(replicas=2, total=20, shadow_settings=Settings(tolerance=0.5))
    await bed.run([(0, 20), (60, 27), (300, 27)])
    assert set(bed.kube.calls) <= {"get_scale", "create_event"}
    assert bed.kube.scale_writes == [] and bed.kube.status_writes == []
    assert bed.kube.annotation_writes == []


async def test_a_step_the_shadow_would_not_take_is_one_event_on_the_hpa(
        ) -> None:
    # 27 over 2 pods at 10 a pod: ratio 1.35; upstream's tolerance (0.1) scales to 3, a
    # shadow told 0.5 keeps 2 (decided just before, on the same metric values); from 3 pods
    # (ratio 0.9) both keep 3, and agree again.
    bed = Bed(replicas=2, total=20, shadow_settings=Settings(tolerance=0.5), behavior=None)
    await bed.run([(0, 20), (60, 27), (300, 27)])
    assert bed.hpa_desired == [2, 3]
    events = [e for e in bed.kube.events if e.reason == SHADOW_EVENT_REASON]
    assert len(events) == 1, events
    assert (events[0].namespace, events[0].name, events[0].type) == (NS, "web", "Normal")
    assert "would keep Deployment/shop/web at 2" in events[0].note
    assert "the HPA scaled it to 3" in events[0].note
    assert bed.count("differ") >= 1 and bed.count("agree") >= 10


async def test_a_persistent_difference_in_a_steady_state_is_one_event() -> None:
    # 21 over 2 pods: ratio 1.05, inside upstream's tolerance (keeps 2); a shadow told 0.01
    # would scale to 3 at every sync.
    bed = Bed(replicas=2, total=21, shadow_settings=Settings(tolerance=0.01), behavior=None)
    await bed.run([(0, 21), (300, 21)])
    assert bed.hpa_desired == [2]
    events = [e for e in bed.kube.events if e.reason == SHADOW_EVENT_REASON]
    assert len(events) == 1
    assert "would scale Deployment/shop/web from 2 to 3" in events[0].note
    assert "the HPA kept 2" in events[0].note
    assert bed.count("differ") >= 15 and bed.count("agree") == 0


async def test_an_hpa_older_than_the_shadow_warms_up_for_a_window_first() -> None:
    bed = Bed(replicas=2, total=20, behavior=None, created=T0 - timedelta(days=1))
    await bed.upstream_sync(0)
    for second in range(7, 300, 15):
        await bed.shadow_sync(second)
    assert bed.count("warmup") == 20 and bed.count("agree") == 0
    await bed.upstream_sync(300)
    await bed.shadow_sync(307)
    assert bed.count("agree") == 1


async def test_a_size_the_hpas_status_does_not_show_yet_is_waited_for() -> None:
    bed = Bed(replicas=2, total=20, behavior=BEHAVIOR)
    await bed.upstream_sync(0)
    assert await bed.shadow_sync(1) == "shadow_decided"
    # kube-controller-manager wrote the scale; its status write is on its way.
    bed.upstream_kube.set_scale(NS, "web", replicas=4, selector="app=web")
    assert await bed.shadow_sync(16) == "shadow_waiting"
    entry = bed.caches.get(KEY)
    assert entry is not None
    raw = dict(entry.raw)
    raw["status"] = {**entry.status, "currentReplicas": 2, "desiredReplicas": 4,
                     "lastScaleTime": "2026-11-21T10:00:16Z"}
    after = bed.caches.put(raw)
    bed.now = at(16.1)
    bed.shadow.observe(InformerEvent("MODIFIED", ObjectKey(NS, "web"), entry, after))
    assert bed.woken == [KEY]
    state = bed.shadow.state_of(KEY)
    assert state is not None
    assert [(e.timestamp, e.replica_change) for e in state.history.scale_up_events] == \
        [(at(16.1), 2)]
    assert await bed.shadow_sync(16.2) == "shadow_decided"


async def test_a_deleted_hpa_takes_its_series_along() -> None:
    bed = Bed()
    await bed.upstream_sync(0)
    await bed.shadow_sync(1)
    assert bed.registry.get_sample_value(
        "metricscale_shadow_replicas", {"namespace": NS, "horizontalpodautoscaler": "web"}) == 2
    del bed.caches.entries[KEY]
    assert (await bed.shadow.reconcile_once(KEY, at(16))).outcome == "gone"
    assert bed.registry.get_sample_value(
        "metricscale_shadow_replicas", {"namespace": NS, "horizontalpodautoscaler": "web"}) is None
    assert bed.count("agree") == 0


# ------------------------------------------------------------------------- the publisher


class MemoryConfigMaps:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[str] = []

    async def read_configmap(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.objects.get((namespace, name))

    async def create_configmap(self, *, namespace: str, name: str, data: Mapping[str, str],
                               labels: Mapping[str, str] | None = None) -> Mapping[str, Any]:
        self.writes.append("create")
        obj = {"metadata": {"namespace": namespace, "name": name, "labels": dict(labels or {})},
               "data": dict(data)}
        self.objects[(namespace, name)] = obj
        return obj

    async def replace_configmap(self, configmap: Mapping[str, Any], *,
                                data: Mapping[str, str]) -> Mapping[str, Any]:
        self.writes.append("replace")
        metadata = configmap["metadata"]
        obj = {**configmap, "data": dict(data)}
        self.objects[(metadata["namespace"], metadata["name"])] = obj
        return obj


async def test_the_published_entries_are_written_when_they_change_and_only_then() -> None:
    bed = Bed(replicas=2, total=20)
    store = MemoryConfigMaps()
    publisher = ShadowPublisher(store, bed.shadow, namespace="metricscale",
                                name="metricscale-shadow")
    await bed.upstream_sync(0)
    await bed.shadow_sync(7)
    assert await publisher.publish_once(at(8))
    for second in (15, 30, 45):
        await bed.upstream_sync(second)
        await bed.shadow_sync(second + 7)
        assert not await publisher.publish_once(at(second + 8))  # the steady state
    bed.total = 60
    bed.follow_scale()
    await bed.upstream_sync(60)
    await bed.shadow_sync(67)
    assert await publisher.publish_once(at(68))
    assert store.writes == ["create", "replace"]
    data = store.objects[("metricscale", "metricscale-shadow")]["data"]
    entry = parse_entry(data["shop.web"], "data[shop.web]")
    assert entry.decision is not None and entry.decision["result"] == "agree"
    assert entry.history is not None and entry.history.scale_up_events


def test_what_does_not_fit_in_a_configmap_is_left_out_in_key_order() -> None:
    data = {f"ns.hpa-{i}": "x" * 100 for i in range(10)}
    kept, left_out = within_budget(data, 500)
    assert list(kept) == [f"ns.hpa-{i}" for i in range(4)] and left_out == 6


async def test_the_shadow_decides_next_just_before_the_hpas_next_sync() -> None:
    bed = Bed(replicas=2, total=20)
    first = await bed.shadow.reconcile_once(KEY, at(1))
    assert first.requeue_after == 15  # no status write seen yet: a sync period
    bed.total = 40
    bed.follow_scale()
    await bed.upstream_sync(15)  # a status write: kube-controller-manager syncs at 15, 30, ...
    bed.now = at(17)
    later = await bed.shadow.reconcile_once(KEY, at(17))
    assert later.requeue_after == pytest.approx(30 - 1.5 - 17)
