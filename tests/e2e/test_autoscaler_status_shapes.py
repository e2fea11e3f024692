"""Every status shape the real controller writes, accepted by the fake under the Autoscaler CRD's
schema and CEL rules.

One controller runs against the fake with an autoscaler per path through the decision: each
condition reason it can set, each metric source's current value, each error path (a missing
target, unreadable metrics of every source type, a failed scale write, ambiguous selectors, a
spec the API should have refused), dry run, and the persisted history with scale events. The
test then checks every status write and Event the controller sent was answered with success,
that no FailedUpdateStatus Event was raised, and that each stored status still validates
against the CRD as a fresh create would.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from testbed.fakes.kube_api import FakeKubeAPI, ServerError
from tests.e2e.test_autoscaler_support import (
    GROUP,
    NS,
    PLURAL,
    VERSION,
    Workload,
    autoscaler,
    condition,
    controller,
    cpu_metric,
    events_of,
    install_crd,
    metrics_backend,
    pods_metric,
    status_of,
    until,
)

SLOW_UP = {"scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                       "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}
SLOW_DOWN = {"scaleDown": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                           "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}

# name -> the conditions (type -> (status, reason)) its status must reach
EXPECTED: dict[str, dict[str, tuple[str, str]]] = {
    "grow": {"AbleToScale": ("True", "SucceededRescale"),
             "ScalingActive": ("True", "ValidMetricFound"),
             "ScalingLimited": ("True", "ScaleUpLimit")},
    "shrink": {"ScalingLimited": ("True", "ScaleDownLimit")},
    "calm": {"AbleToScale": ("True", "ScaleDownStabilized")},
    "cpu": {"ScalingActive": ("True", "ValidMetricFound"),
            "ScalingLimited": ("True", "TooFewReplicas")},
    "box": {"ScalingActive": ("True", "ValidMetricFound")},
    "capped": {"ScalingLimited": ("True", "TooManyReplicas")},
    "steady": {"AbleToScale": ("True", "ReadyForNewScale"),
               "ScalingLimited": ("False", "DesiredWithinRange")},
    "dry": {"AbleToScale": ("True", "DryRun")},
    "gone": {"AbleToScale": ("False", "FailedGetScale")},
    "nometric": {"ScalingActive": ("False", "FailedGetPodsMetric")},
    "external": {"ScalingActive": ("False", "FailedGetExternalMetric")},
    "object": {"ScalingActive": ("False", "FailedGetObjectMetric")},
    "memory": {"ScalingActive": ("False", "FailedGetResourceMetric")},
    "sidecar": {"ScalingActive": ("False", "FailedGetContainerResourceMetric")},
    "writefail": {"AbleToScale": ("False", "FailedUpdateScale")},
    "disabled": {"ScalingActive": ("False", "ScalingDisabled")},
    "twin-a": {"ScalingActive": ("False", "AmbiguousSelector")},
    "twin-b": {"ScalingActive": ("False", "AmbiguousSelector")},
    "unknown": {"ScalingActive": ("False", "InvalidMetricSourceType")},
}


def _object_metric() -> dict[str, Any]:
    return {"type": "Object", "object": {
        "describedObject": {"apiVersion": "v1", "kind": "Service", "name": "front"},
        "metric": {"name": "requests"}, "target": {"type": "Value", "value": "10"}}}


def _external_metric() -> dict[str, Any]:
    return {"type": "External", "external": {
        "metric": {"name": "queue_depth", "selector": {"matchLabels": {"queue": "jobs"}}},
        "target": {"type": "AverageValue", "averageValue": "30"}}}


def _container_metric(container: str = "app") -> dict[str, Any]:
    return {"type": "ContainerResource", "containerResource": {
        "name": "cpu", "container": container,
        "target": {"type": "AverageValue", "averageValue": "100m"}}}


def _reached(fake: FakeKubeAPI, name: str) -> bool:
    return all(condition(fake, name, kind) is not None and
               condition(fake, name, kind)[:2] == wanted  # type: ignore[index]
               for kind, wanted in EXPECTED[name].items())


async def test_every_status_shape_the_controller_writes_is_accepted(
        fake_kube: FakeKubeAPI, tmp_path: Path) -> None:
    install_crd(fake_kube)
    fake_kube.add_fault(f"^/apis/apps/v1/namespaces/{NS}/deployments/writefail/scale$",
                        ServerError(code=500, message="etcd is sad"), method="PUT",
                        times=None)  # past the client's own retries
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend:
        shares: dict[str, dict[str, Decimal]] = {}

        def cpu_of(workload: str) -> Callable[[dict[str, Decimal]], None]:
            """Several workloads' pods in the one "cpu" series set."""
            def publish(values: dict[str, Decimal]) -> None:
                shares[workload] = dict(values)
                backend.values["cpu"] = {k: v for part in shares.values()
                                         for k, v in part.items()}
            return publish

        workloads = [
            Workload(fake_kube, "grow", replicas=2, total=Decimal(60),
                     publish=backend.publisher("rps_grow")),
            Workload(fake_kube, "shrink", replicas=5, total=Decimal(10),
                     publish=backend.publisher("rps_shrink")),
            Workload(fake_kube, "cpu", replicas=2, total=Decimal("0.1"), publish=cpu_of("cpu")),
            Workload(fake_kube, "box", replicas=2, total=Decimal("0.2"), publish=cpu_of("box")),
            Workload(fake_kube, "capped", replicas=2, total=Decimal(500),
                     publish=backend.publisher("rps_capped")),
            Workload(fake_kube, "calm", replicas=2, total=Decimal(10),
                     publish=backend.publisher("rps_calm")),
            Workload(fake_kube, "steady", replicas=2, total=Decimal(20),
                     publish=backend.publisher("rps_steady")),
            Workload(fake_kube, "dry", replicas=2, total=Decimal(60),
                     publish=backend.publisher("rps_dry")),
            Workload(fake_kube, "writefail", replicas=2, total=Decimal(60),
                     publish=backend.publisher("rps_writefail")),
            Workload(fake_kube, "disabled", replicas=0, total=Decimal(0),
                     publish=backend.publisher("rps_disabled")),
            Workload(fake_kube, "twin", replicas=2, total=Decimal(20),
                     publish=backend.publisher("rps_twin")),
            # Targets of their own (two autoscalers on one target are ambiguous).
            *(Workload(fake_kube, name, replicas=2, total=Decimal(0),
                       publish=backend.publisher(f"rps_{name}"))
              for name in ("memory", "sidecar", "nometric", "external", "object", "unknown")),
        ]
        for workload in workloads:
            await workload.__aenter__()
        try:
            definitions = [
                autoscaler("grow", target="grow", metrics=[pods_metric("rps_grow", "10")],
                           behavior=SLOW_UP),
                autoscaler("shrink", target="shrink",
                           metrics=[pods_metric("rps_shrink", "10")], behavior=SLOW_DOWN),
                autoscaler("calm", target="calm", metrics=[pods_metric("rps_calm", "10")]),
                autoscaler("cpu", target="cpu", metrics=[cpu_metric(50)], min_replicas=2,
                           behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}),
                autoscaler("box", target="box", metrics=[_container_metric()],
                           min_replicas=2, max_replicas=2),
                autoscaler("capped", target="capped",
                           metrics=[pods_metric("rps_capped", "10")], max_replicas=3),
                autoscaler("steady", target="steady",
                           metrics=[pods_metric("rps_steady", "10")]),
                autoscaler("dry", target="dry", metrics=[pods_metric("rps_dry", "10")],
                           annotations={"metricscale.dev/dry-run": "true"}),
                autoscaler("gone", target="nowhere", metrics=[pods_metric("rps_x", "10")]),
                # The metrics API serves cpu of container "app" only.
                autoscaler("memory", target="memory", metrics=[{
                    "type": "Resource", "resource": {"name": "memory", "target": {
                        "type": "AverageValue", "averageValue": "100Mi"}}}]),
                autoscaler("sidecar", target="sidecar", metrics=[_container_metric("sidecar")]),
                autoscaler("nometric", target="nometric",
                           metrics=[pods_metric("never_published", "10")]),
                autoscaler("external", target="external", metrics=[_external_metric()]),
                autoscaler("object", target="object", metrics=[_object_metric()]),
                autoscaler("writefail", target="writefail",
                           metrics=[pods_metric("rps_writefail", "10")]),
                autoscaler("disabled", target="disabled",
                           metrics=[pods_metric("rps_disabled", "10")]),
                autoscaler("twin-a", target="twin", metrics=[pods_metric("rps_twin", "10")]),
                autoscaler("twin-b", target="twin", metrics=[pods_metric("rps_twin", "10")]),
            ]
            for obj in definitions:
                fake_kube.create(GROUP, VERSION, PLURAL, obj)
            # Written straight to storage, as an object from before a schema change would be.
            fake_kube.store.create(GROUP, VERSION, PLURAL, autoscaler(
                "unknown", target="unknown", metrics=[{"type": "Prometheus", "pods": {}}]))
            async with controller(fake_kube):
                for name in EXPECTED:
                    await until(lambda name=name: _reached(fake_kube, name),  # type: ignore[misc]
                                within=30, what=f"{name}: {EXPECTED[name]}, have "
                                                f"{status_of(fake_kube, name)}")
        finally:
            for workload in workloads:
                await workload.__aexit__(None, None, None)

    status_writes = fake_kube.requests_to(f"^/apis/{GROUP}/{VERSION}/namespaces/{NS}/"
                                          f"{PLURAL}/[^/]+/status$")
    status_writes = [r for r in status_writes if r.method in ("PUT", "PATCH")]
    refused = [(r.path, r.code, r.message) for r in status_writes
               if r.code is None or r.code >= 300]
    assert refused == [], refused
    written = {r.path.split("/")[-2] for r in status_writes}
    assert written >= set(EXPECTED), set(EXPECTED) - written
    event_posts = fake_kube.requests_to(f"^/apis/events.k8s.io/v1/namespaces/{NS}/events$",
                                        method="POST")
    assert event_posts and all(r.code == 201 for r in event_posts), [
        (r.code, r.message) for r in event_posts if r.code != 201]
    for name in EXPECTED:
        assert "FailedUpdateStatus" not in {e["reason"] for e in events_of(fake_kube, name)}

    # The shapes themselves: each metric source's current value, dry run, the history.
    def current(name: str) -> list[dict[str, Any]]:
        return list(status_of(fake_kube, name).get("currentMetrics") or [])

    assert current("grow")[0]["type"] == "Pods"
    assert current("cpu")[0]["resource"]["current"]["averageUtilization"] == 10
    assert current("box")[0]["containerResource"]["container"] == "app"
    assert current("nometric")[0]["type"] == ""  # a failed metric keeps its place, empty
    grow = status_of(fake_kube, "grow")
    assert grow["lastScaleTime"] and grow["history"]["scaleUpEvents"]
    assert status_of(fake_kube, "shrink")["history"]["scaleDownEvents"]
    assert status_of(fake_kube, "dry")["desiredReplicas"] == 4  # 6 wanted, the legacy step caps

    # Each stored object, status included, validates as a new object would.
    crd_schema = fake_kube.registry.resolve(GROUP, VERSION, PLURAL)
    assert crd_schema is not None
    schema = crd_schema.versions[VERSION].schema
    assert schema is not None
    for name in EXPECTED:
        if name == "unknown":
            continue  # its spec is the invalid part, on purpose
        stored = fake_kube.store.get(GROUP, VERSION, PLURAL, name, namespace=NS)
        _, _, problems = schema.decode(stored)
        problems += schema.rule_errors(stored, None)
        assert problems == [], (name, [str(p) for p in problems])
