"""KEP-6003's spec.behavior.syncPeriodSeconds through the controller, on the injected clock: an
autoscaler with its own 1 s period is reconciled every second while its neighbour keeps the
controller's 10 s period, and it follows a rise in load within its own period."""

from __future__ import annotations

from datetime import timedelta

from autoscaler.decision.settings import Settings
from tests.autoscaler.simulation import T0, Cluster, autoscaler, pods_metric


def seconds(*values: float) -> list[object]:
    return [T0 + timedelta(seconds=value) for value in values]


async def test_an_autoscaler_with_its_own_sync_period_is_reconciled_by_it() -> None:
    cluster = Cluster()
    fast = cluster.deployment("fast", replicas=2, load=20, metric="rps_fast")
    cluster.deployment("slow", replicas=2, load=20, metric="rps_slow")
    cluster.create(autoscaler("fast", target="fast", metrics=[pods_metric("rps_fast", "10")],
                              behavior={"syncPeriodSeconds": 1}))
    cluster.create(autoscaler("slow", target="slow", metrics=[pods_metric("rps_slow", "10")]))
    replica = cluster.replica(settings=Settings(sync_period=timedelta(seconds=10)))
    await cluster.run_for(20)
    assert replica.reconciled("fast") == seconds(*range(21))
    assert replica.reconciled("slow") == seconds(0, 10, 20)
    assert cluster.replicas_of("fast") == 2

    fast.set_load(60)
    await cluster.run_for(1)
    assert cluster.replicas_of("fast") == 6
    assert cluster.rescales("fast") == [(6, T0 + timedelta(seconds=21))]
