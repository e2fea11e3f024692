"""Controller replicas handing over, on the injected clock: with leader election two replicas
have one writer, and the standby that takes over (the leader stopped and released its Lease)
continues the old leader's stabilization window from the history the leader persisted; a
controller restarted on a native HPA continues its window from the history annotation. A
replica that forgot the history would hold the size a whole window from its start: the
scale-down comes with the first sync after the old window ends, not later.

(The Lease API on the real control plane and a leader's writes there:
tests/cluster/test_autoscaler_on_cluster.py.)"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from autoscaler.decision.persistence import HISTORY_ANNOTATION
from autoscaler.model.history import parse_history
from tests.autoscaler.simulation import LEASE_NAMESPACE, Cluster, autoscaler, pods_metric

SYNC = 15
WINDOW = 120
BEHAVIOR: dict[str, Any] = {
    "scaleUp": {"policies": [{"type": "Pods", "value": 4, "periodSeconds": 60}]},
    "scaleDown": {"stabilizationWindowSeconds": WINDOW,
                  "policies": [{"type": "Percent", "value": 100, "periodSeconds": 60}]}}


def holder(cluster: Cluster) -> str:
    lease = cluster.leases.leases.get((LEASE_NAMESPACE, "metricscale-autoscaler"))
    return lease.spec.holder_identity or "" if lease is not None else ""


def last_recommended(history: dict[str, Any], replicas: int) -> datetime:
    parsed = parse_history(history)
    assert parsed.recommendations is not None
    return max(r.timestamp for r in parsed.recommendations if r.replicas == replicas)


async def test_two_replicas_one_writer_and_a_failover_that_keeps_the_window() -> None:
    cluster = Cluster()
    web = cluster.deployment("web", replicas=2, load=20, metric="http_requests")
    cluster.create(autoscaler("web", target="web", metrics=[pods_metric("http_requests", "10")],
                              min_replicas=2, max_replicas=8, behavior=BEHAVIOR))
    replicas = {name: cluster.replica(name, leader_election=True)
                for name in ("replica-a", "replica-b")}
    await cluster.run_for(SYNC)
    leader = holder(cluster)
    standby = next(name for name in replicas if name != leader)
    web.set_load(60)
    await cluster.run_for(2 * SYNC)
    assert cluster.sizes("web") == [6]
    web.set_load(20)
    await cluster.run_for(2 * SYNC)
    assert cluster.condition("web", "AbleToScale")[:2] == (  # type: ignore[index]
        "True", "ScaleDownStabilized")
    assert replicas[standby].reconciles == []  # one writer: the standby never reconciled
    held_since = last_recommended(cluster.status("web")["history"], 6)

    # The leader stops (SIGTERM: it releases the Lease); the standby takes over at its next
    # retry and continues the window the leader was in the middle of.
    await replicas[leader].stop()
    taken_over = await cluster.run_until(lambda: holder(cluster) == standby, within=10,
                                         what="the standby takes over")
    await cluster.run_for(WINDOW)
    (scaled_down,) = [when for size, when in cluster.rescales("web") if size == 2]
    assert scaled_down is not None
    window_end = held_since + timedelta(seconds=WINDOW)
    assert taken_over < window_end <= scaled_down
    # ... by the standby's first sync after the window, not a whole window after its takeover.
    assert [when for when in replicas[standby].reconciled("web")
            if window_end <= when < scaled_down] == []
    assert cluster.events("web")[-1].reason == "SuccessfulRescale"
    assert cluster.replicas_of("web") == 2


async def test_a_restarted_controller_keeps_a_native_hpas_stabilization_window() -> None:
    """A native HPA's history lives in its metricscale.dev/history annotation: a controller
    started after another stopped continues the window the first was in the middle of."""
    cluster = Cluster()
    web = cluster.deployment("web", replicas=2, load=60, metric="http_requests")
    hpa = autoscaler("web", target="web", kind="HorizontalPodAutoscaler", min_replicas=2,
                     max_replicas=8, behavior=BEHAVIOR, annotations={"team": "shop"},
                     metrics=[pods_metric("http_requests", "10")])
    cluster.create(hpa)
    first = cluster.replica("replica-a")
    await cluster.run_for(SYNC)
    assert cluster.replicas_of("web") == 6
    web.set_load(20)
    await cluster.run_for(2 * SYNC)
    assert cluster.condition("web", "AbleToScale", of="HorizontalPodAutoscaler")[:2] == (  # type: ignore[index]
        "True", "ScaleDownStabilized")
    (key,) = cluster.autoscaler_keys()
    annotations = cluster.caches.entries[key].annotations
    assert annotations["team"] == "shop"  # merged in, not replaced
    persisted = json.loads(annotations[HISTORY_ANNOTATION])
    assert {r["replicas"] for r in persisted["recommendations"]} == {2, 6}
    held_since = last_recommended(persisted, 6)
    await first.stop()

    await cluster.run_for(SYNC)  # nobody reconciles for a while
    second = cluster.replica("replica-b")
    restarted = cluster.clock.now()
    await cluster.run_for(WINDOW)
    (scaled_down,) = [when for size, when in cluster.rescales("web") if size == 2]
    assert scaled_down is not None
    window_end = held_since + timedelta(seconds=WINDOW)
    assert restarted < window_end <= scaled_down
    assert [when for when in second.reconciled("web", kind="HorizontalPodAutoscaler")
            if window_end <= when < scaled_down] == []
