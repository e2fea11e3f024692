"""KEP-5325's podSelectionStrategy through the controller, on the injected clock: with
OwnerReferences a Job's pods that share the Deployment's labels and a rollout's not-Ready surge
pods no longer move the size; with LabelSelector (upstream) they do. The metrics API serves a
value for every pod the selector matches, the Job's and the surge pod's too, so it is the
owner-based selection that leaves them out. (Pods and ReplicaSets as the real API server keeps
them: tests/cluster/test_autoscaler_features_on_cluster.py.)"""

from __future__ import annotations

import pytest

from tests.autoscaler.simulation import Cluster, autoscaler, pods_metric

SYNC = 15
LABELS = {"app": "web"}


def web_autoscaler(strategy: str) -> dict[str, object]:
    return autoscaler("web", target="web", metrics=[pods_metric("rps", "10")],
                      podSelectionStrategy=strategy)


@pytest.mark.parametrize(("strategy", "replicas", "ignored"),
                         [("OwnerReferences", 2, 1), ("LabelSelector", 9, None)])
async def test_a_jobs_pods_sharing_the_labels_count_only_with_the_label_selector(
        strategy: str, replicas: int, ignored: int | None) -> None:
    cluster = Cluster()
    cluster.deployment("web", replicas=2, load=20, metric="rps")  # 10 a pod: at the target
    # A Job's pod with the same labels, busy: counted, (10 + 10 + 70) / 3 = 30 a pod.
    cluster.add_pod("migrate-x", labels=LABELS,
                    owner={"apiVersion": "batch/v1", "kind": "Job", "name": "migrate"})
    cluster.metrics.pod_values["rps"]["migrate-x"] = "70"
    cluster.create(web_autoscaler(strategy))
    cluster.replica()
    await cluster.run_for(3 * SYNC)
    assert cluster.replicas_of("web") == replicas
    assert cluster.status("web")["desiredReplicas"] == replicas
    assert cluster.status("web").get("ignoredPods") == ignored


async def test_steady_load_during_a_rollout_holds_the_size() -> None:
    cluster = Cluster()
    cluster.deployment("web", replicas=2, load=20, metric="rps")
    cluster.create(web_autoscaler("OwnerReferences"))
    cluster.replica()
    await cluster.run_for(0)
    assert cluster.status("web")["ignoredPods"] == 0
    # The rollout: ReplicaSet web-2 surges one pod, Running but not Ready yet, whose warm-up
    # spike would read as (10 + 10 + 70) / 3 = 30 against a target of 10.
    cluster.add_replica_set("web-2", deployment="web", revision=2)
    cluster.add_pod("web-2-a", labels=LABELS, ready=False,
                    owner={"kind": "ReplicaSet", "name": "web-2"})
    cluster.metrics.pod_values["rps"]["web-2-a"] = "70"
    await cluster.run_for(3 * SYNC)
    assert cluster.status("web")["ignoredPods"] == 1
    assert cluster.replicas_of("web") == 2 and cluster.scale_writes("web") == []
