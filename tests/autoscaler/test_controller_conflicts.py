"""Conflicting writers through the controller, on the injected clock: a Deployment's
spec.replicas changed behind the controller's back raises an ExternalScaleChange Event at the
next sync, a second change the ScalingConflict condition; the controller's own scale writes,
over many syncs, never count. (The condition accepted by the real CRD:
tests/cluster/test_status_shapes_on_cluster.py.)"""

from __future__ import annotations

from tests.autoscaler.simulation import Cluster, autoscaler, pods_metric

SYNC = 15


async def test_external_replica_changes_raise_an_event_then_a_condition() -> None:
    cluster = Cluster()
    cluster.deployment("web", replicas=2, load=40, metric="rps")
    cluster.create(autoscaler("web", target="web", metrics=[pods_metric("rps", "10")]))
    cluster.replica()
    # Our own write (2 -> 4), then several syncs: never an external change.
    await cluster.run_for(0)
    assert cluster.replicas_of("web") == 4 and cluster.scale_writes("web") == [4]
    await cluster.run_for(4 * SYNC)
    assert "ExternalScaleChange" not in cluster.reasons("web")
    assert cluster.condition("web", "ScalingConflict") is None

    cluster.scale_externally("web", 7)
    await cluster.run_for(SYNC)
    (note,) = [e for e in cluster.events("web") if e.reason == "ExternalScaleChange"]
    assert note.type == "Warning"
    assert "from 4 to 7" in note.note and "did not write" in note.note
    assert cluster.condition("web", "ScalingConflict") is None

    cluster.scale_externally("web", 9)
    await cluster.run_for(SYNC)
    found = cluster.condition("web", "ScalingConflict")
    assert found is not None
    status, reason, message = found
    assert (status, reason) == ("True", "ExternalScaleChanges")
    assert "Conflicting writers" in message
