"""Pause by annotation through the controller, on the injected clock: `metricscale.dev/paused`
decides and reports but never writes the scale, and its removal resumes at once (with an
event); `paused-replicas` sets its size once and holds it; `paused-scale-in` holds a scale-down
while a scale-up still goes through. Each annotation change is acted on by an immediate sync,
with no time passing. (`kubectl annotate` on the real control plane:
tests/cluster/test_autoscaler_features_on_cluster.py.)"""

from __future__ import annotations

from autoscaler.decision.pause import PAUSED, PAUSED_REPLICAS, PAUSED_SCALE_IN
from metricscale.core.quantity import parse_quantity
from tests.autoscaler.simulation import AT_ONCE, Cluster, autoscaler, pods_metric

SYNC = 15  # the controller's default sync period



def paused(cluster: Cluster) -> tuple[str, str, str] | None:
    return cluster.condition("web", "Paused")


def reason(cluster: Cluster) -> str:
    return (paused(cluster) or ("", "", ""))[1]


def average(cluster: Cluster) -> str | None:
    """The Pods metric's current average in the status."""
    for item in cluster.status("web").get("currentMetrics") or []:
        if item.get("type") == "Pods":
            return str(item["pods"]["current"].get("averageValue"))
    return None


async def test_pause_annotations_hold_the_scale_and_removing_them_resumes() -> None:
    cluster = Cluster()
    web = cluster.deployment("web", replicas=2, load=20, metric="http_requests")
    cluster.create(autoscaler("web", target="web", metrics=[pods_metric("http_requests", "10")],
                              min_replicas=2, max_replicas=8, behavior=AT_ONCE))
    cluster.replica()
    await cluster.run_for(0)
    assert (cluster.condition("web", "ScalingActive") or ("",))[0] == "True"
    assert cluster.replicas_of("web") == 2 and paused(cluster) is None

    # Paused: the load asks for 6 pods; the status says so, nothing is written.
    cluster.annotate("web", {PAUSED: "true"})
    await cluster.run_for(0)
    assert paused(cluster) == ("True", "Paused", f"paused by annotation {PAUSED}")
    web.set_load(60)
    await cluster.run_for(SYNC)
    assert cluster.status("web")["desiredReplicas"] == 6 and average(cluster) == "30"
    await cluster.run_for(3 * SYNC)
    assert cluster.scale_writes("web") == [] and cluster.replicas_of("web") == 2
    assert (cluster.condition("web", "ScalingActive") or ("",))[0] == "True"

    # Resumed at once: the held decision is applied, and an event says why.
    cluster.annotate("web", {PAUSED: None})
    await cluster.run_for(0)
    assert cluster.replicas_of("web") == 6
    assert paused(cluster) is None and "Resumed" in cluster.reasons("web")

    # Paused at 3: set once, then held whatever the load asks.
    cluster.annotate("web", {PAUSED_REPLICAS: "3"})
    await cluster.run_for(0)
    assert cluster.replicas_of("web") == 3
    assert paused(cluster) == ("True", "PausedAtReplicas",
                               f"paused at 3 replicas by annotation {PAUSED_REPLICAS}")
    writes = len(cluster.scale_writes("web"))
    web.set_load(20)  # 2 pods' worth: held at 3 as well
    await cluster.run_for(SYNC)
    assert parse_quantity(average(cluster) or "20") < 10
    await cluster.run_for(3 * SYNC)
    assert len(cluster.scale_writes("web")) == writes and cluster.replicas_of("web") == 3

    # Scale-in paused: the scale-down to 2 is held, a scale-up goes through.
    cluster.annotate("web", {PAUSED_REPLICAS: None, PAUSED_SCALE_IN: "true"})
    await cluster.run_for(0)
    assert reason(cluster) == "ScaleInPaused"
    assert cluster.status("web")["desiredReplicas"] == 2
    await cluster.run_for(3 * SYNC)
    assert len(cluster.scale_writes("web")) == writes and cluster.replicas_of("web") == 3
    web.set_load(80)
    await cluster.run_for(SYNC)
    assert cluster.replicas_of("web") == 8
    assert cluster.status("web")["desiredReplicas"] == 8 and reason(cluster) == "ScaleInPaused"

    assert cluster.sizes("web") == [6, 3, 8]
    pause_events = [e for e in cluster.events("web")
                    if e.reason in {"Paused", "Resumed", "PausedAtReplicas", "ScaleInPaused"}]
    assert [e.reason for e in pause_events] == [
        "Paused", "Resumed", "PausedAtReplicas", "ScaleInPaused"]
    assert {e.type for e in pause_events} == {"Normal"}
