"""The controller scaling Deployments, on the injected clock: upstream's steps when CPU rises,
a behavior's policy steps up and its stabilization window down (the scale-down at exactly the
first sync after the window), dry run, a deleted target beside autoscalers that carry on, spec
changes and new autoscalers acted on at once, the steady state's reads and writes, objects the
API should have refused, and native HPAs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from autoscaler.decision.settings import Settings
from autoscaler.model.history import parse_history
from tests.autoscaler.simulation import T0, Cluster, autoscaler, cpu_metric, pods_metric

SYNC = 15


def at(seconds: float) -> Any:
    return T0 + timedelta(seconds=seconds)


async def test_cpu_load_rises_and_the_deployment_grows_by_upstreams_steps() -> None:
    cluster = Cluster()
    web = cluster.deployment("web", replicas=2, load="0.4", metric="cpu")
    cluster.create(autoscaler("web", target="web", metrics=[cpu_metric(50)], min_replicas=2,
                              max_replicas=10))
    cluster.replica()
    await cluster.run_for(0)
    assert cluster.condition("web", "ScalingActive") == (
        "True", "ValidMetricFound", "the HPA was able to successfully calculate a replica "
        "count from cpu resource utilization (percentage of request)")
    assert cluster.replicas_of("web") == 2
    # 3 cores over 500m requests at a 50% target: 12 pods' worth, which upstream's legacy
    # rule reaches in doublings from 2, one a sync: 4, 8, then 10 (maxReplicas).
    web.set_load("3")
    await cluster.run_for(4 * SYNC)
    assert cluster.rescales("web") == [(4, at(SYNC)), (8, at(2 * SYNC)), (10, at(3 * SYNC))]
    assert cluster.condition("web", "ScalingLimited")[:2] == (  # type: ignore[index]
        "True", "TooManyReplicas")
    status = cluster.status("web")
    assert status["reference"] == "Deployment/web"
    assert status["targets"].startswith("cpu: ") and status["targets"].endswith("/50%")


async def test_load_rises_by_policy_steps_and_falls_only_after_the_window() -> None:
    behavior = {"scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                            "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
                "scaleDown": {"stabilizationWindowSeconds": 300,
                              "policies": [{"type": "Percent", "value": 100,
                                            "periodSeconds": 60}]}}
    cluster = Cluster()
    web = cluster.deployment("web", replicas=2, load=20, metric="http_requests")
    cluster.create(autoscaler("web", target="web", metrics=[pods_metric("http_requests", "10")],
                              min_replicas=2, max_replicas=8, behavior=behavior))
    cluster.replica()
    await cluster.run_for(SYNC)
    # 60 requests/s at 10 a pod is 6 pods; the policy adds at most 2 a minute.
    web.set_load(60)
    await cluster.run_for(6 * SYNC)
    assert cluster.rescales("web") == [(4, at(2 * SYNC)), (6, at(2 * SYNC + 60))]
    # The load falls back to 2 pods' worth: the window holds 6 for 300 s from the last time
    # 6 was recommended, and the first sync after that scales down.
    web.set_load(20)
    await cluster.run_for(SYNC)
    assert cluster.condition("web", "AbleToScale")[:2] == (  # type: ignore[index]
        "True", "ScaleDownStabilized")
    history = parse_history(cluster.status("web")["history"])
    assert history.recommendations is not None
    held_since = max(r.timestamp for r in history.recommendations if r.replicas == 6)
    await cluster.run_for(300 + SYNC)
    assert cluster.rescales("web")[2:] == [(2, held_since + timedelta(seconds=300))]


async def test_dry_run_annotation_decides_and_reports_but_never_scales() -> None:
    cluster = Cluster()
    cluster.deployment("web", replicas=2, load=60, metric="http_requests")
    cluster.create(autoscaler("web", target="web", metrics=[pods_metric("http_requests", "10")],
                              annotations={"metricscale.dev/dry-run": "true"}))
    cluster.replica()
    await cluster.run_for(4 * SYNC)
    assert cluster.status("web")["desiredReplicas"] == 4
    assert cluster.replicas_of("web") == 2 and cluster.scale_writes("web") == []
    assert cluster.condition("web", "AbleToScale")[:2] == ("True", "DryRun")  # type: ignore[index]
    assert set(cluster.reasons("web")) == {"DryRunRescale"}


async def test_a_deleted_target_is_reported_and_the_other_autoscalers_carry_on() -> None:
    cluster = Cluster()
    cluster.deployment("web", replicas=2, load=20, metric="http_requests")
    api = cluster.deployment("api", replicas=2, load=20, metric="rps")
    cluster.create(autoscaler("web", target="web", metrics=[pods_metric("http_requests", "10")]))
    cluster.create(autoscaler("api", target="api", metrics=[pods_metric("rps", "10")]))
    cluster.replica()
    await cluster.run_for(0)
    assert cluster.condition("web", "ScalingActive") is not None
    del cluster.kube.scales[("shop", "web")]  # `kubectl delete deployment web`
    api.set_load(60)
    await cluster.run_for(SYNC)
    assert cluster.condition("web", "AbleToScale") == (
        "False", "FailedGetScale", "the HPA controller was unable to get the target's current "
        'scale: deployments.apps "web" not found')
    notes = [e.note for e in cluster.events("web") if e.reason == "FailedGetScale"]
    assert notes == ['deployments.apps "web" not found']
    assert cluster.replicas_of("api") == 4


async def test_a_spec_change_and_a_new_autoscaler_are_synced_at_once() -> None:
    """As the watch (or a re-list after it was cut) delivers them: no waiting for the period."""
    cluster = Cluster()
    cluster.deployment("web", replicas=2, load=20, metric="http_requests")
    cluster.create(autoscaler("web", target="web", metrics=[pods_metric("http_requests", "10")]))
    replica = cluster.replica(settings=Settings(sync_period=timedelta(seconds=30)))
    await cluster.run_for(10)

    def raise_the_floor(obj: dict[str, Any]) -> None:
        obj["spec"]["minReplicas"] = 3
    cluster.change("web", raise_the_floor)
    cluster.create(autoscaler("late", target="web", metrics=[pods_metric("http_requests", "10")]))
    await cluster.run_for(0)
    assert cluster.replicas_of("web") == 3
    assert cluster.status("late")
    assert replica.reconciled("web") == [at(0), at(10)]
    # A status-only change (our own write, seen through the watch) waits for the period.
    cluster.change("web", lambda obj: obj.setdefault("status", {}).update(desiredReplicas=2))
    await cluster.run_for(0)
    assert replica.reconciled("web") == [at(0), at(10)]


async def test_a_steady_autoscaler_costs_a_scale_read_and_a_read_per_metric() -> None:
    cluster = Cluster()
    cluster.deployment("web", replicas=2, load=20, metric="http_requests")
    for name in ("web-0", "web-1"):
        cluster.metrics.cpu_usage[name] = "200m"
    cluster.create(autoscaler("web", target="web", min_replicas=2,
                              metrics=[pods_metric("http_requests", "10"), cpu_metric(80)]))
    replica = cluster.replica()
    await cluster.run_for(SYNC)
    cluster.kube.calls.clear()
    cluster.metrics.calls.clear()
    await cluster.run_for(10 * SYNC)
    assert len(replica.reconciled("web")) == 12
    assert cluster.kube.calls == ["get_scale"] * 10  # no status writes, no events
    assert cluster.metrics.calls == ["pods/http_requests", "resource"] * 10


async def test_objects_the_api_should_have_refused_are_reported_and_others_carry_on() -> None:
    cluster = Cluster()
    cluster.deployment("web", replicas=2, load=40, metric="http_requests")
    cluster.deployment("other", replicas=2, load=40, metric="http_requests_other")
    # As objects made before a schema change would be: never validated against today's.
    broken = autoscaler("broken", target="web", metrics=[])
    broken["spec"]["maxReplicas"] = "plenty"
    for obj in (autoscaler("unknown", target="other",
                           metrics=[{"type": "Prometheus", "pods": {}}]),
                autoscaler("backwards", target="nothing", min_replicas=5, max_replicas=3,
                           metrics=[pods_metric("http_requests", "10")]),
                broken,
                autoscaler("web", target="web", metrics=[pods_metric("http_requests", "10")])):
        cluster.create(obj)
    cluster.replica()
    await cluster.run_for(0)
    assert cluster.replicas_of("web") == 4
    assert {"InvalidMetricSourceType", "FailedComputeMetricsReplicas"} <= set(
        cluster.reasons("unknown"))
    assert cluster.condition("unknown", "ScalingActive")[:2] == (  # type: ignore[index]
        "False", "InvalidMetricSourceType")
    assert cluster.condition("backwards", "AbleToScale")[:2] == (  # type: ignore[index]
        "False", "FailedGetScale")
    assert "InvalidSpec" in cluster.reasons("broken")
    found = cluster.condition("broken", "ScalingActive")
    assert found is not None and found[:2] == ("False", "InvalidSpec")
    assert "maxReplicas" in found[2]
    # Reported once, not at every sync.
    await cluster.run_for(4 * SYNC)
    assert cluster.reasons("broken").count("InvalidSpec") == 1


async def test_native_hpas_are_reconciled_and_their_status_written_without_extras() -> None:
    cluster = Cluster()
    cluster.deployment("web", replicas=2, load=40, metric="http_requests")
    cluster.create(autoscaler("web", target="web", kind="HorizontalPodAutoscaler",
                              metrics=[pods_metric("http_requests", "10")]))
    cluster.replica()
    await cluster.run_for(SYNC)
    assert cluster.replicas_of("web") == 4
    status = cluster.status("web", kind="HorizontalPodAutoscaler")
    assert status["desiredReplicas"] == 4
    assert {c["type"] for c in status["conditions"]} == {
        "AbleToScale", "ScalingActive", "ScalingLimited"}
    assert "history" not in status and "targets" not in status
    assert cluster.reasons("web") == ["SuccessfulRescale"]
