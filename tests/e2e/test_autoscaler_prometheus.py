"""The autoscaler end to end with the real adapter behind the fake API server's aggregator and a
real Prometheus: load rises and the target grows by the policy's steps; load falls and it
shrinks only after the stabilization window; Prometheus stops and nothing shrinks, with the
conditions saying why; two controller replicas, one writer, and a failover that continues the
old leader's stabilization window from the history it persisted."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from autoscaler.model.history import parse_history
from autoscaler.model.times import parse_time
from testbed.fakes.exporter import Exporter
from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.prometheus import PrometheusServer
from tests.e2e.test_adapter_auth_support import (
    ShiftedClock,
    make_pki,
    register_apiservices,
    secured_adapter,
)
from tests.e2e.test_autoscaler_support import (
    GROUP,
    NS,
    PLURAL,
    VERSION,
    Workload,
    autoscaler,
    condition,
    controller,
    events_of,
    exporter_publisher,
    holds,
    install_crd,
    new_user,
    pods_metric,
    replicas_of,
    scale_reads,
    status_of,
    until,
)

pytestmark = pytest.mark.prometheus

SERIES = "msauto_http_requests"
METRIC = "http_requests"


def rules(job: str) -> str:
    return f"""\
rules:
- seriesQuery: '{{__name__="{SERIES}",job="{job}",namespace!="",pod!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  name: {{matches: "^msauto_(.*)$", as: "${{1}}"}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
"""


@contextlib.asynccontextmanager
async def real_adapter(fake: FakeKubeAPI, workdir: Path, *, prometheus: PrometheusServer,
                       exporter: Exporter, pods: int) -> AsyncIterator[None]:
    """The adapter serving the custom metrics APIs from `prometheus`, Available behind the
    fake's aggregator, once the first `pods` series are scraped (it discovers series at start)."""
    await prometheus.wait_for_async(f'{SERIES}{{job="{exporter.job}"}}',
                                    lambda samples: len(samples) >= pods, timeout=30)
    test_pki = make_pki(workdir / "pki")
    async with secured_adapter(workdir=workdir / "adapter", test_pki=test_pki,
                               kubeconfig=fake.write_kubeconfig(workdir / "kubeconfig"),
                               prometheus_url=prometheus.url, config_text=rules(exporter.job),
                               clock=ShiftedClock()) as adapter:
        await register_apiservices(fake, port=adapter.port,
                                   ca_pem=test_pki.serving_ca.certificate_pem)
        yield


def sizes(fake: FakeKubeAPI, name: str = "web") -> list[int]:
    return [int(e["note"].split(";")[0].removeprefix("New size: "))
            for e in events_of(fake, name) if e["reason"] == "SuccessfulRescale"]


def event_time(fake: FakeKubeAPI, size: int, name: str = "web") -> datetime:
    (found,) = [e for e in events_of(fake, name) if e["reason"] == "SuccessfulRescale"
                and e["note"].startswith(f"New size: {size};")]
    return parse_time(found["eventTime"], "eventTime")


def last_recommended(fake: FakeKubeAPI, replicas: int, name: str = "web") -> datetime:
    """When the controller last recommended `replicas`, from the history in the status."""
    history = parse_history(status_of(fake, name)["history"])
    assert history.recommendations is not None
    return max(r.timestamp for r in history.recommendations if r.replicas == replicas)


BEHAVIOR: dict[str, Any] = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                "policies": [{"type": "Pods", "value": 2, "periodSeconds": 1}]},
    "scaleDown": {"stabilizationWindowSeconds": 5,
                  "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}]},
}


async def test_load_rises_by_policy_steps_and_falls_only_after_the_window(
        fake_kube: FakeKubeAPI, tmp_path: Path, prometheus: PrometheusServer,
        exporter: Exporter) -> None:
    install_crd(fake_kube)
    async with Workload(fake_kube, "web", replicas=2, total=Decimal(20),
                        publish=exporter_publisher(exporter, SERIES)) as web, \
            real_adapter(fake_kube, tmp_path, prometheus=prometheus, exporter=exporter, pods=2):
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric(METRIC, "10")], min_replicas=2,
            max_replicas=8, behavior=BEHAVIOR))
        async with controller(fake_kube):
            await until(lambda: (condition(fake_kube, "web", "ScalingActive") or ("",))[0]
                        == "True", within=20, what="a first decision from real metrics")
            assert replicas_of(fake_kube, "web") == 2
            # 60 requests/s at 10 per pod is 6 pods; the policy adds at most 2 a second.
            web.set_load(60)
            await until(lambda: sizes(fake_kube)[-1:] == [6], within=20, what="6 replicas")
            assert sizes(fake_kube) == [4, 6]
            assert (event_time(fake_kube, 6) - event_time(fake_kube, 4)).total_seconds() >= 1
            # The load falls back: 2 pods' worth. The 5 s window holds the size meanwhile.
            web.set_load(20)
            await until(lambda: (condition(fake_kube, "web", "AbleToScale") or ("", ""))[1]
                        == "ScaleDownStabilized", within=20, what="a held scale-down")
            # Persisted with the first smaller recommendation: the last time 6 was recommended.
            held_since = last_recommended(fake_kube, 6)
            await until(lambda: sizes(fake_kube)[-1:] == [2], within=20, what="the scale-down")
    scaled_down = event_time(fake_kube, 2)
    assert scaled_down - held_since >= timedelta(seconds=5)
    # ... and by the first reconcile that began after the window: before it, only the one
    # that was under way when the window ended may have read the scale.
    late = scale_reads(fake_kube, "web", since=held_since + timedelta(seconds=5),
                       before=scaled_down)
    assert len(late) <= 1, late
    assert sizes(fake_kube) == [4, 6, 2]


async def test_when_prometheus_stops_nothing_scales_down_and_the_conditions_say_why(
        fake_kube: FakeKubeAPI, tmp_path: Path, prometheus_factory: Any) -> None:
    own: PrometheusServer = prometheus_factory()
    with Exporter() as exporter:
        own.add_target(exporter)
        install_crd(fake_kube)
        async with Workload(fake_kube, "web", replicas=4, total=Decimal(40),
                            publish=exporter_publisher(exporter, SERIES)) as web:
            await own.wait_for_scrape_async(exporter, timeout=30)
            async with real_adapter(fake_kube, tmp_path, prometheus=own, exporter=exporter,
                                    pods=4):
                fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                    "web", target="web", metrics=[pods_metric(METRIC, "10")], min_replicas=1,
                    max_replicas=8, behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}))
                async with controller(fake_kube):
                    await until(lambda: (condition(fake_kube, "web", "ScalingActive") or
                                         ("",))[0] == "True", within=20, what="a decision")
                    assert replicas_of(fake_kube, "web") == 4
                    await asyncio.to_thread(own.stop)
                    web.set_load(1)  # would be a scale-down to 1, if anyone could see it
                    await until(lambda: (condition(fake_kube, "web", "ScalingActive") or
                                         ("", ""))[1] == "FailedGetPodsMetric", within=20,
                                what="the failing metric in the conditions")
                    await holds(lambda: replicas_of(fake_kube, "web") == 4, fake=fake_kube,
                                target="web", for_seconds=2,
                                what="no scale-down without metrics")
    status, reason, message = condition(fake_kube, "web", "ScalingActive") or ("", "", "")
    assert (status, reason) == ("False", "FailedGetPodsMetric")
    assert message.startswith("the HPA was unable to compute the replica count: unable to get "
                              f"metric {METRIC}: unable to fetch metrics from custom metrics "
                              "API: ")
    reasons = [e["reason"] for e in events_of(fake_kube, "web")]
    assert "FailedGetPodsMetric" in reasons and "FailedComputeMetricsReplicas" in reasons
    assert sizes(fake_kube) == []


async def test_two_replicas_one_writer_and_a_failover_that_keeps_the_window(
        fake_kube: FakeKubeAPI, tmp_path: Path, prometheus: PrometheusServer,
        exporter: Exporter) -> None:
    install_crd(fake_kube)
    fake_kube.create_namespace("metricscale")
    tokens = {name: new_user(fake_kube, name) for name in ("replica-a", "replica-b")}
    behavior = {"scaleUp": {"policies": [{"type": "Pods", "value": 4, "periodSeconds": 1}]},
                "scaleDown": {"stabilizationWindowSeconds": 6,
                              "policies": [{"type": "Percent", "value": 100,
                                            "periodSeconds": 1}]}}
    async with Workload(fake_kube, "web", replicas=2, total=Decimal(20),
                        publish=exporter_publisher(exporter, SERIES)) as web, \
            real_adapter(fake_kube, tmp_path, prometheus=prometheus, exporter=exporter, pods=2):
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric(METRIC, "10")], min_replicas=2,
            max_replicas=8, behavior=behavior))
        async with contextlib.AsyncExitStack() as stack:
            replicas = {name: await stack.enter_async_context(controller(
                fake_kube, identity=name, token=token, leader_election=True))
                for name, token in tokens.items()}

            def holder() -> str:
                lease = fake_kube.store.try_get("coordination.k8s.io", "v1", "leases",
                                                "metricscale-autoscaler",
                                                namespace="metricscale")
                return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")

            await until(lambda: holder() in tokens, within=10, what="a leader")
            leader = holder()
            standby = next(name for name in tokens if name != leader)
            web.set_load(60)
            await until(lambda: sizes(fake_kube)[-1:] == [6], within=20, what="6 replicas")
            web.set_load(20)
            await until(lambda: (condition(fake_kube, "web", "AbleToScale") or ("", ""))[1]
                        == "ScaleDownStabilized", within=20, what="a held scale-down")
            writes = [(r.user, r.method) for r in fake_kube.requests
                      if r.method in {"PUT", "PATCH", "POST", "DELETE"}
                      and "/leases" not in r.path]
            assert writes and {user for user, _ in writes} == {leader}
            held_since = last_recommended(fake_kube, 6)
            # The window runs a while under the first leader: four of its reconciles.
            await until(lambda: len(scale_reads(fake_kube, "web", since=held_since)) >= 4,
                        within=20, what="the first leader reconciling inside the window")
            await replicas[leader].stop()
            await until(lambda: holder() == standby, within=20, what="the standby takes over")
            taken_over = datetime.now(UTC)
            await until(lambda: sizes(fake_kube)[-1:] == [2], within=30, what="the scale-down")
    scaled_down = event_time(fake_kube, 2)
    # Not before the old leader's window ends, and by the standby's first reconcile after it
    # ended (or after the takeover, if that came later): one that forgot the history would
    # hold the size a whole window from its takeover, reading the scale all the while.
    window_end = held_since + timedelta(seconds=6)
    assert scaled_down >= window_end
    late = scale_reads(fake_kube, "web", since=max(window_end, taken_over), before=scaled_down)
    assert len(late) <= 1, late
    scale_writers = [r.user for r in fake_kube.requests_to(
        f"^/apis/apps/v1/namespaces/{NS}/deployments/web/scale$", method="PUT")]
    assert scale_writers[-1] == standby and set(scale_writers) == {leader, standby}
    final = [e for e in events_of(fake_kube, "web") if e["reason"] == "SuccessfulRescale"]
    assert final[-1]["reportingInstance"] == standby
