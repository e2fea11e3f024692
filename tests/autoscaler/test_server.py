"""The autoscaler controller end to end against the fake API server, with resource and custom
metrics from a metrics API of the test's own behind the fake's aggregator: scaling by upstream's
steps, dry run, a deleted target, 409 and 429 from the API server, a watch cut by compaction
(410), the steady-state request budget, objects the API should have refused, /metrics, native
HPAs and the history they keep across a restart."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp

from autoscaler.decision.persistence import HISTORY_ANNOTATION
from autoscaler.model.times import parse_time
from testbed.fakes.kube_api import FakeKubeAPI, Latency, ServerError, TooManyRequests
from testbed.fakes.kube_store import StoreEvent
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
    holds,
    install_crd,
    metrics_backend,
    pods_metric,
    replicas_of,
    scale_reads,
    status_of,
    until,
)


async def test_cpu_load_rises_and_the_deployment_grows_by_upstreams_steps(
        fake_kube: FakeKubeAPI, tmp_path: Path) -> None:
    install_crd(fake_kube)
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal("0.4"),
                     publish=backend.publisher("cpu")) as web:
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[cpu_metric(50)], min_replicas=2, max_replicas=10))
        async with controller(fake_kube):
            await until(lambda: condition(fake_kube, "web", "ScalingActive") ==
                        ("True", "ValidMetricFound",
                         "the HPA was able to successfully calculate a replica count from "
                         "cpu resource utilization (percentage of request)"),
                        within=10, what="a first decision")
            assert replicas_of(fake_kube, "web") == 2
            # 3 cores over 500m requests at a 50% target: 12 pods' worth, which upstream's
            # legacy rule reaches in doublings from 2: 4, 8, then 10 (maxReplicas).
            web.set_load("3")

            def sizes() -> list[int]:
                return [int(e["note"].split(";")[0].removeprefix("New size: "))
                        for e in events_of(fake_kube, "web")
                        if e["reason"] == "SuccessfulRescale"]

            await until(lambda: sizes()[-1:] == [10], within=15,
                        what="scale-up to maxReplicas")
            # The reconcile posts its event before it writes the status (as upstream's does).
            await until(lambda: (condition(fake_kube, "web", "ScalingLimited") or ())[:2]
                        == ("True", "TooManyReplicas"), within=5, what="ScalingLimited")
    assert sizes() == [4, 8, 10]
    assert replicas_of(fake_kube, "web") == 10
    status = status_of(fake_kube, "web")
    assert status["reference"] == "Deployment/web"
    assert status["targets"].startswith("cpu: ") and status["targets"].endswith("/50%")


async def test_dry_run_annotation_decides_and_reports_but_never_scales(
        fake_kube: FakeKubeAPI, tmp_path: Path) -> None:
    install_crd(fake_kube)
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal(60),
                     publish=backend.publisher("http_requests")):
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric("http_requests", "10")],
            annotations={"metricscale.dev/dry-run": "true"}))
        async with controller(fake_kube):
            await until(lambda: status_of(fake_kube, "web").get("desiredReplicas") == 4,
                        within=10, what="a dry-run decision")
            await holds(lambda: replicas_of(fake_kube, "web") == 2, fake=fake_kube,
                        target="web", for_seconds=1, what="the scale must not be written")
    assert fake_kube.requests_to("/deployments/web/scale$", method="PUT") == []
    assert condition(fake_kube, "web", "AbleToScale")[:2] == ("True", "DryRun")
    reasons = {e["reason"] for e in events_of(fake_kube, "web")}
    assert reasons == {"DryRunRescale"}


async def test_a_deleted_target_is_reported_and_the_other_autoscalers_carry_on(
        fake_kube: FakeKubeAPI, tmp_path: Path) -> None:
    install_crd(fake_kube)
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal(20),
                     publish=backend.publisher("http_requests")), \
            Workload(fake_kube, "api", replicas=2, total=Decimal(20),
                     publish=backend.publisher("rps")) as api:
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric("http_requests", "10")]))
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "api", target="api", metrics=[pods_metric("rps", "10")]))
        async with controller(fake_kube):
            await until(lambda: condition(fake_kube, "web", "ScalingActive") is not None,
                        within=10, what="a first decision")
            fake_kube.store.delete("apps", "v1", "deployments", "web", namespace=NS)
            await until(lambda: condition(fake_kube, "web", "AbleToScale") ==
                        ("False", "FailedGetScale",
                         "the HPA controller was unable to get the target's current scale: "
                         'deployments.apps "web" not found'),
                        within=10, what="FailedGetScale")
            api.set_load(60)
            await until(lambda: replicas_of(fake_kube, "api") == 4, within=10,
                        what="the other autoscaler still scales")
    notes = [e["note"] for e in events_of(fake_kube, "web") if e["reason"] == "FailedGetScale"]
    assert notes and notes[0] == 'deployments.apps "web" not found'


async def test_conflicts_on_the_scale_write_are_reread_and_retried(
        fake_kube: FakeKubeAPI, tmp_path: Path) -> None:
    install_crd(fake_kube)
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal(40),
                     publish=backend.publisher("http_requests")):
        scale_path = f"^/apis/apps/v1/namespaces/{NS}/deployments/web/scale$"
        fake_kube.add_fault(scale_path, ServerError(code=409, message="conflict"),
                            method="PUT", times=2)
        # Every AbleToScale the status is written with (a later reconcile's ReadyForNewScale
        # may replace the scale-up's before the test looks).
        able: list[tuple[str, str]] = []

        def record(event: StoreEvent) -> None:
            if (event.key.resource, event.name) == (PLURAL, "web"):
                able.extend((c["status"], c["reason"]) for c in
                            (event.object.get("status") or {}).get("conditions") or []
                            if c.get("type") == "AbleToScale")

        unsubscribe = fake_kube.store.subscribe(record)
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric("http_requests", "10")]))
        try:
            async with controller(fake_kube):
                await until(lambda: replicas_of(fake_kube, "web") == 4, within=30,
                            what="the scale-up despite two conflicts")
                # The status is written after the scale: leaving at once could cut it off.
                await until(lambda: ("True", "SucceededRescale") in able, within=30,
                            what=f"the status of the scale-up, have {able}")
        finally:
            unsubscribe()
    calls = [r.method for r in fake_kube.requests_to(scale_path)]
    first_put = calls.index("PUT")
    # update, re-read, update, re-read, update: as retry.RetryOnConflict with a fresh GET
    assert calls[first_put:first_put + 5] == ["PUT", "GET", "PUT", "GET", "PUT"]
    assert ("False", "FailedUpdateScale") not in able  # the conflicts never surfaced
    assert [e["reason"] for e in events_of(fake_kube, "web")] == ["SuccessfulRescale"]


async def test_too_many_requests_waits_retry_after_then_goes_on(
        fake_kube: FakeKubeAPI, tmp_path: Path) -> None:
    install_crd(fake_kube)
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal(40),
                     publish=backend.publisher("http_requests")):
        scale_path = f"^/apis/apps/v1/namespaces/{NS}/deployments/web/scale$"
        fake_kube.add_fault(scale_path, TooManyRequests(retry_after=1), method="GET",
                            times=1)
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric("http_requests", "10")]))
        async with controller(fake_kube):
            await until(lambda: replicas_of(fake_kube, "web") == 4, within=10,
                        what="the scale-up after a 429")
    gets = [r.time for r in fake_kube.requests_to(scale_path, method="GET")]
    assert (gets[1] - gets[0]).total_seconds() >= 0.95  # Retry-After: 1 was honoured
    assert not [e for e in events_of(fake_kube, "web") if e["reason"] == "FailedGetScale"]


async def test_a_watch_cut_by_compaction_relists_and_a_later_spec_change_acts_at_once(
        fake_kube: FakeKubeAPI, tmp_path: Path) -> None:
    install_crd(fake_kube)
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal(20),
                     publish=backend.publisher("http_requests")):
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric("http_requests", "10")]))
        async with controller(fake_kube, sync=30, watch_timeout=1) as server:
            assert server.watching is not None
            informer = server.watching.autoscalers
            await until(lambda: condition(fake_kube, "web", "ScalingActive") is not None,
                        within=10, what="a first decision")
            lists = informer.lists
            # Hold the watch's reconnect while the history is compacted past it: 410.
            held = fake_kube.add_fault(f"^/apis/{GROUP}/{VERSION}/{PLURAL}$", Latency(0.5),
                                       method="GET")
            await until(lambda: held.hits == 1, within=5, what="the watch reconnecting")
            fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                "late", target="web", metrics=[pods_metric("http_requests", "10")]))
            fake_kube.compact()
            await until(lambda: informer.lists == lists + 1, within=10, what="a re-list")
            # The sync period is 30 s: only an immediate sync can act on this in time.
            def lower(obj: dict[str, object]) -> None:
                obj["spec"]["minReplicas"] = 3  # type: ignore[index]
            fake_kube.store.mutate(GROUP, VERSION, PLURAL, "web", lower, namespace=NS)
            await until(lambda: replicas_of(fake_kube, "web") == 3, within=5,
                        what="the new minReplicas")
            # Seen through the re-list, and reconciled (its first sync may come after web's).
            await until(lambda: bool(status_of(fake_kube, "late")), within=10,
                        what="the late autoscaler's status")


async def test_steady_state_costs_a_scale_get_and_one_metrics_get_per_metric(
        fake_kube: FakeKubeAPI, tmp_path: Path) -> None:
    install_crd(fake_kube)
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal(20),
                     publish=backend.publisher("http_requests")) as web:
        backend.publisher("cpu")({pod: Decimal("0.2") for pod in web.pods()})
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric("http_requests", "10"),
                                          cpu_metric(80)], min_replicas=2))
        async with controller(fake_kube, sync=0.1) as server:
            await until(lambda: condition(fake_kube, "web", "ScalingActive") is not None,
                        within=10, what="a first decision")
            assert server.controller is not None
            await until(lambda: server.controller.reconciled >= 3, within=5,
                        what="settling")
            fake_kube.requests.clear()
            start = server.controller.reconciled
            await until(lambda: server.controller.reconciled >= start + 10, within=10,
                        what="ten steady reconciles")
            done = server.controller.reconciled - start
            seen = list(fake_kube.requests)
    by_kind = {"scale": 0, "custom": 0, "resource": 0, "other": []}
    for request in seen:
        if request.path.endswith("/deployments/web/scale"):
            by_kind["scale"] += 1  # type: ignore[operator]
        elif request.path.startswith("/apis/custom.metrics.k8s.io/v1beta2/namespaces/"):
            by_kind["custom"] += 1  # type: ignore[operator]
        elif request.path.startswith("/apis/metrics.k8s.io/v1beta1/namespaces/"):
            by_kind["resource"] += 1  # type: ignore[operator]
        elif "watch=true" not in str(request.query).lower() and request.path not in (
                "/apis", "/api") and not request.path.startswith("/apis/coordination"):
            by_kind["other"].append((request.method, request.path))  # type: ignore[union-attr]
    assert by_kind["other"] == []  # no status writes, no events, nothing else
    for kind in ("scale", "custom", "resource"):
        assert abs(by_kind[kind] - done) <= 1, by_kind  # type: ignore[operator]


async def test_objects_the_api_should_have_refused_are_reported_and_others_carry_on(
        fake_kube: FakeKubeAPI, tmp_path: Path) -> None:
    install_crd(fake_kube)
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal(40),
                     publish=backend.publisher("http_requests")), \
            Workload(fake_kube, "other", replicas=2, total=Decimal(40),
                     publish=backend.publisher("http_requests_other")):
        # Written straight to storage, as objects made before a schema change would be.
        unknown = autoscaler("unknown", target="other",
                             metrics=[{"type": "Prometheus", "pods": {}}])
        backwards = autoscaler("backwards", target="nothing",
                               metrics=[pods_metric("http_requests", "10")],
                               min_replicas=5, max_replicas=3)
        broken = autoscaler("broken", target="web", metrics=[])
        broken["spec"]["maxReplicas"] = "plenty"
        for obj in (unknown, backwards, broken):
            fake_kube.store.create(GROUP, VERSION, PLURAL, obj)
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric("http_requests", "10")]))
        async with controller(fake_kube):
            await until(lambda: replicas_of(fake_kube, "web") == 4, within=10,
                        what="the valid autoscaler scales")
            await until(lambda: any(e["reason"] == "InvalidMetricSourceType"
                                    for e in events_of(fake_kube, "unknown")),
                        within=10, what="the unknown metric type reported")
            await until(lambda: any(e["reason"] == "InvalidSpec"
                                    for e in events_of(fake_kube, "broken")),
                        within=10, what="the unreadable spec reported")
            # A reconcile posts its events before it writes the status (as upstream's does):
            # the conditions may land a moment after the events; "backwards" is waited for here.
            await until(lambda: condition(fake_kube, "unknown", "ScalingActive") is not None
                        and condition(fake_kube, "backwards", "AbleToScale") is not None,
                        within=10, what="the statuses of unknown and backwards")
    assert {e["reason"] for e in events_of(fake_kube, "unknown")} >= {
        "InvalidMetricSourceType", "FailedComputeMetricsReplicas"}
    # The status write keeps the old spec, whose enum error is ratcheted (v1.30+), so the
    # condition is stored too.
    assert condition(fake_kube, "unknown", "ScalingActive")[:2] == (
        "False", "InvalidMetricSourceType")
    assert condition(fake_kube, "backwards", "AbleToScale")[:2] == ("False", "FailedGetScale")


async def test_an_unreadable_spec_gets_a_scaling_active_false_condition_naming_the_field(
        fake_kube: FakeKubeAPI, tmp_path: Path) -> None:
    install_crd(fake_kube)
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal(40),
                     publish=backend.publisher("http_requests")):
        broken = autoscaler("broken", target="web", metrics=[pods_metric("http_requests", "10")])
        broken["spec"]["maxReplicas"] = "plenty"
        # Written straight to storage, as objects made before a schema change would be; the
        # status write is validated (the unchanged invalid spec is ratcheted).
        fake_kube.store.create(GROUP, VERSION, PLURAL, broken)
        async with controller(fake_kube):
            await until(lambda: condition(fake_kube, "broken", "ScalingActive") is not None,
                        within=10, what="the unreadable spec's condition")
            assert any(e["reason"] == "InvalidSpec" for e in events_of(fake_kube, "broken"))
    found = condition(fake_kube, "broken", "ScalingActive")
    assert found is not None
    status, reason, message = found
    assert (status, reason) == ("False", "InvalidSpec")
    assert "maxReplicas" in message
    assert replicas_of(fake_kube, "web") == 2


async def test_metrics_health_and_readiness_endpoints(fake_kube: FakeKubeAPI,
                                                     tmp_path: Path) -> None:
    names = ('metricscale_autoscaler_reconciles_total{result="ok"}',
             "metricscale_autoscaler_reconcile_duration_seconds_count",
             'metricscale_autoscaler_decisions_total{outcome="scale_up"} 1.0',
             "metricscale_autoscaler_api_request_duration_seconds_count",
             "metricscale_autoscaler_leader 1.0")
    install_crd(fake_kube)
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal(40),
                     publish=backend.publisher("http_requests")):
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric("http_requests", "10")]))
        async with controller(fake_kube) as server, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{server.port}"
            await until(lambda: replicas_of(fake_kube, "web") == 4, within=10,
                        what="a scale-up")
            async with http.get(f"{base}/healthz") as response:
                assert response.status == 200
            async with http.get(f"{base}/readyz") as response:
                assert response.status == 200
            # The scale is written first; the decision is counted after the events and the
            # status write, and the reconcile once it returns: read /metrics until they are.
            deadline = time.monotonic() + 5
            while True:
                async with http.get(f"{base}/metrics") as response:
                    text = await response.text()
                if all(name in text for name in names) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
    for name in names:
        assert name in text, name


async def test_native_hpas_are_reconciled_with_the_flag_and_their_status_written(
        fake_kube: FakeKubeAPI, tmp_path: Path) -> None:
    install_crd(fake_kube)
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal(40),
                     publish=backend.publisher("http_requests")):
        hpa = autoscaler("web", target="web", metrics=[pods_metric("http_requests", "10")])
        hpa["apiVersion"], hpa["kind"] = "autoscaling/v2", "HorizontalPodAutoscaler"
        fake_kube.create("autoscaling", "v2", "horizontalpodautoscalers", hpa)
        async with controller(fake_kube, native_hpa=True):
            await until(lambda: replicas_of(fake_kube, "web") == 4, within=10,
                        what="the HPA's target scaled")

            def hpa_status() -> dict[str, object]:
                obj = fake_kube.store.get("autoscaling", "v2", "horizontalpodautoscalers",
                                          "web", namespace=NS)
                return dict(obj.get("status") or {})

            await until(lambda: hpa_status().get("desiredReplicas") == 4, within=10,
                        what="the HPA's status")
    status = hpa_status()
    assert {c["type"] for c in status["conditions"]} == {  # type: ignore[attr-defined]
        "AbleToScale", "ScalingActive", "ScalingLimited"}
    assert "history" not in status and "targets" not in status
    assert [e["reason"] for e in events_of(fake_kube, "web")] == ["SuccessfulRescale"]
    assert events_of(fake_kube, "web")[0]["regarding"]["kind"] == "HorizontalPodAutoscaler"


async def test_a_restarted_controller_keeps_a_native_hpas_stabilization_window(
        fake_kube: FakeKubeAPI, tmp_path: Path) -> None:
    """A native HPA's history lives in its metricscale.dev/history annotation: a controller
    started after another stopped continues the window the first was in the middle of."""
    install_crd(fake_kube)
    window = 6.0
    behavior = {"scaleUp": {"policies": [{"type": "Pods", "value": 4, "periodSeconds": 1}]},
                "scaleDown": {"stabilizationWindowSeconds": int(window),
                              "policies": [{"type": "Percent", "value": 100,
                                            "periodSeconds": 1}]}}

    def hpa() -> dict[str, Any]:
        return fake_kube.store.get("autoscaling", "v2", "horizontalpodautoscalers", "web",
                                   namespace=NS)

    def hpa_reason(kind: str) -> str:
        conditions = (hpa().get("status") or {}).get("conditions") or []
        return next((c["reason"] for c in conditions if c["type"] == kind), "")

    def history() -> dict[str, Any]:
        annotations = hpa()["metadata"].get("annotations") or {}
        raw = annotations.get(HISTORY_ANNOTATION)
        return json.loads(raw) if raw else {}

    def rescale_to(size: int) -> datetime | None:
        """When (the reconcile's `now`) the controller rescaled web to `size`."""
        return next((parse_time(e["eventTime"], "eventTime") for e in events_of(fake_kube, "web")
                     if e["reason"] == "SuccessfulRescale"
                     and e["note"].startswith(f"New size: {size};")), None)

    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal(60),
                     publish=backend.publisher("http_requests")) as web:
        body = autoscaler("web", target="web", metrics=[pods_metric("http_requests", "10")],
                          min_replicas=2, max_replicas=8, behavior=behavior)
        body["apiVersion"], body["kind"] = "autoscaling/v2", "HorizontalPodAutoscaler"
        body["metadata"]["annotations"] = {"team": "shop"}
        fake_kube.create("autoscaling", "v2", "horizontalpodautoscalers", body)
        async with controller(fake_kube, native_hpa=True):
            await until(lambda: replicas_of(fake_kube, "web") == 6, within=15,
                        what="the HPA's target scaled to 6")
            web.set_load(20)
            await until(lambda: hpa_reason("AbleToScale") == "ScaleDownStabilized", within=10,
                        what="a held scale-down")
            await until(lambda: {r["replicas"] for r in history().get("recommendations", [])}
                        == {2, 6}, within=10, what="the history annotation")
            # The newest recommendation of 6, as persisted: the window counts from it (it may
            # precede the load's fall by a sync, or more on a loaded machine).
            last_six = max(datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00"))
                           for r in history()["recommendations"] if r["replicas"] == 6)
            # The window runs a while under the first controller: four of its reconciles.
            await until(lambda: len(scale_reads(fake_kube, "web", since=last_six)) >= 4,
                        within=20, what="the first controller reconciling inside the window")
        assert replicas_of(fake_kube, "web") == 6
        assert hpa()["metadata"]["annotations"]["team"] == "shop"  # a merge patch
        async with controller(fake_kube, native_hpa=True, identity="replica-b"):
            restarted = datetime.now(UTC)
            await until(lambda: replicas_of(fake_kube, "web") == 2, within=30,
                        what="the scale-down")
            await until(lambda: rescale_to(2) is not None, within=10, what="its event")
    # Not before the window that began under the first controller ends, and by the first
    # reconcile after it ended (or after the restart, if that came later): a controller that
    # forgot it would hold the size a whole window from its start, reading the scale meanwhile.
    scaled_at = rescale_to(2)
    window_end = last_six + timedelta(seconds=window)
    assert scaled_at is not None and scaled_at >= window_end
    late = scale_reads(fake_kube, "web", since=max(window_end, restarted), before=scaled_at)
    assert len(late) <= 1, late
