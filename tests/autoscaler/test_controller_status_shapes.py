"""Every status shape the controller writes, on the injected clock (tests/autoscaler/
status_shapes.py), each reaching its conditions and each status write valid under the
Autoscaler CRD's schema and CEL rules as the API server would check it. (The same statuses and
Events written to the real kube-apiserver: tests/cluster/test_status_shapes_on_cluster.py.)"""

from __future__ import annotations

from typing import Any

from tests.autoscaler.crd_support import problems
from tests.autoscaler.simulation import API_VERSIONS, NS, Cluster
from tests.autoscaler.status_shapes import EXPECTED, INVALID_SPECS, every_status_shape, reached

MINIMAL_SPEC = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                   "name": "web"}, "maxReplicas": 3}


def as_stored(cluster: Cluster, name: str, status: dict[str, Any]) -> dict[str, Any]:
    """The object as it would be stored with this status (a valid spec where ours is not)."""
    spec = MINIMAL_SPEC if name in INVALID_SPECS else dict(cluster.caches.entries[
        next(k for k in cluster.autoscaler_keys() if k.name == name)].raw["spec"])
    return {"apiVersion": API_VERSIONS["Autoscaler"], "kind": "Autoscaler",
            "metadata": {"name": name, "namespace": NS}, "spec": spec, "status": status}


async def test_every_status_shape_the_controller_writes_is_valid_under_the_crd() -> None:
    cluster = await every_status_shape()
    missed = {name: cluster.status(name).get("conditions") for name in EXPECTED
              if not reached(cluster, name)}
    assert missed == {}
    written = {name for _, name, _ in cluster.kube.status_writes}
    assert written >= set(EXPECTED), set(EXPECTED) - written
    refused = {(name, problem) for _, name, status in cluster.kube.status_writes
               for problem in problems(as_stored(cluster, name, dict(status)))}
    assert refused == set()
    for name in EXPECTED:
        assert "FailedUpdateStatus" not in cluster.reasons(name)

    # The shapes themselves: each metric source's current value, dry run, the history, the
    # extensions' fields.
    def current(name: str) -> list[dict[str, Any]]:
        return list(cluster.status(name).get("currentMetrics") or [])

    assert current("grow")[0]["type"] == "Pods"
    assert current("cpu")[0]["resource"]["current"]["averageUtilization"] == 10
    assert current("box")[0]["containerResource"]["container"] == "app"
    assert current("nometric")[0]["type"] == ""  # a failed metric keeps its place, empty
    grow = cluster.status("grow")
    assert grow["lastScaleTime"] and grow["history"]["scaleUpEvents"]
    assert cluster.status("shrink")["history"]["scaleDownEvents"]
    assert cluster.status("dry")["desiredReplicas"] == 4  # 6 wanted, the legacy step caps
    assert cluster.status("fallback")["history"]["metricFailures"]
    assert cluster.status("idle")["history"]["inactiveSince"]
    assert cluster.status("conflict")["history"]["scaleWatch"]
    assert cluster.status("owners")["ignoredPods"] == 1
