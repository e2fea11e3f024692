"""Activation and cooldown through the controller (its --scale-to-zero on), on the injected
clock: a target idle at 0 stays there while its External metric is at or below the
activationThreshold, leaves 0 at the first sync that sees the metric above it, drops to the
active floor in the sync that sees it inactive again, and goes back to 0 exactly at the first
sync once spec.idle.cooldownSeconds have passed since status.history.inactiveSince."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from autoscaler.decision.settings import Settings
from autoscaler.model.times import parse_time
from tests.autoscaler.simulation import AT_ONCE, Cluster, autoscaler, external_metric

SYNC = 15
COOLDOWN = 60



def active(cluster: Cluster) -> tuple[str, str, str]:
    return cluster.condition("web", "Active") or ("", "", "")


def inactive_since(cluster: Cluster) -> Any:
    value = (cluster.status("web").get("history") or {}).get("inactiveSince")
    return parse_time(value, "inactiveSince") if value is not None else None


async def test_idle_at_zero_activates_above_the_threshold_and_cools_down_back_to_zero() -> None:
    cluster = Cluster()
    cluster.deployment("web", replicas=0)
    cluster.metrics.external["queue_messages"] = "3"  # below the threshold of 5
    obj = autoscaler("web", target="web", min_replicas=1, max_replicas=8, behavior=AT_ONCE,
                     metrics=[external_metric("queue_messages", "10", activationThreshold="5")])
    obj["spec"]["idle"] = {"replicas": 0, "cooldownSeconds": COOLDOWN}
    cluster.create(obj)
    cluster.replica(settings=Settings(scale_to_zero=True))

    # Idle and inactive: the target stays at 0.
    await cluster.run_for(0)
    assert active(cluster) == ("False", "ScalerNotActive",
                               "no metric is above its activation threshold: idle at 0")
    assert inactive_since(cluster) is not None
    await cluster.run_for(4 * SYNC)
    assert cluster.replicas_of("web") == 0 and cluster.scale_writes("web") == []

    # Above the threshold: 25 messages at 10 a pod, 3 pods, at the next sync.
    cluster.metrics.external["queue_messages"] = "25"
    activated = await cluster.run_until(lambda: cluster.replicas_of("web") == 3, within=SYNC,
                                        what="the scale-out of 0")
    assert active(cluster) == ("True", "ScalerActive", "active: metric 0 (25 > 5)")
    assert inactive_since(cluster) is None

    # Inactive again: down to the active floor at once, to 0 after the cooldown.
    cluster.metrics.external["queue_messages"] = "0"
    await cluster.run_until(lambda: inactive_since(cluster) is not None, within=SYNC,
                            what="the inactive clock")
    since = inactive_since(cluster)
    assert since == activated + timedelta(seconds=SYNC)
    await cluster.run_for(COOLDOWN + 2 * SYNC)
    assert cluster.replicas_of("web") == 0
    assert inactive_since(cluster) == since
    assert active(cluster)[:2] == ("False", "ScalerNotActive")
    # The active floor in the reconcile that saw the metric go inactive; 0 at the first sync
    # once the cooldown has passed, not one sync later.
    assert cluster.rescales("web") == [(3, activated), (1, since),
                                       (0, since + timedelta(seconds=COOLDOWN))]
