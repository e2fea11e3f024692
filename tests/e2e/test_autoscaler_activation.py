"""Activation and cooldown, end to end (the fake API server, the real adapter behind its
aggregator, a real Prometheus, the controller's --scale-to-zero on): a target idle at 0 stays
there while its External metric is at or below the activationThreshold, leaves 0 once the
metric is above it, and goes back to 0 only after the metric has been inactive for
spec.idle.cooldownSeconds (timed from status.history.inactiveSince)."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from autoscaler.model.times import parse_time
from testbed.fakes.exporter import Exporter
from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.prometheus import PrometheusServer
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
    holds,
    install_crd,
    prometheus_adapter,
    replicas_of,
    scale_reads,
    scale_writes,
    status_of,
    until,
)

pytestmark = pytest.mark.prometheus

SERIES = "msactivation_queue_messages"
COOLDOWN = 3

BEHAVIOR: dict[str, Any] = {
    "scaleUp": {"stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 10, "periodSeconds": 1}]},
    "scaleDown": {"stabilizationWindowSeconds": 0,
                  "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}]},
}


def rules(job: str) -> str:
    return f"""\
externalRules:
- seriesQuery: '{{__name__="{SERIES}",job="{job}",namespace!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
  name: {{matches: "^msactivation_(.*)$", as: "${{1}}"}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>,job="{job}"}}) by (queue)'
"""


def idle_autoscaler() -> dict[str, Any]:
    """10 messages a pod; active above 5 messages; idle at 0 after COOLDOWN inactive seconds."""
    metric = {"type": "External", "external": {
        "metric": {"name": "queue_messages"}, "activationThreshold": "5",
        "target": {"type": "AverageValue", "averageValue": "10"}}}
    obj = autoscaler("web", target="web", metrics=[metric], min_replicas=1, max_replicas=8,
                     behavior=BEHAVIOR)
    obj["spec"]["idle"] = {"replicas": 0, "cooldownSeconds": COOLDOWN}
    return obj


def active(fake: FakeKubeAPI) -> tuple[str, str, str]:
    return condition(fake, "web", "Active") or ("", "", "")


def inactive_since(fake: FakeKubeAPI) -> datetime | None:
    value = (status_of(fake, "web").get("history") or {}).get("inactiveSince")
    return parse_time(value, "inactiveSince") if value is not None else None


def rescales(fake: FakeKubeAPI) -> list[tuple[int, datetime]]:
    return [(int(e["note"].split(";")[0].removeprefix("New size: ")),
             parse_time(e["eventTime"], "eventTime"))
            for e in events_of(fake, "web") if e["reason"] == "SuccessfulRescale"]


async def test_idle_at_zero_activates_above_the_threshold_and_cools_down_back_to_zero(
        fake_kube: FakeKubeAPI, tmp_path: Path, prometheus: PrometheusServer,
        exporter: Exporter) -> None:
    install_crd(fake_kube)
    queue = {"namespace": NS, "queue": "orders"}
    exporter.set(SERIES, queue, Decimal(3), type="gauge")  # below the threshold of 5
    async with Workload(fake_kube, "web", replicas=0, total=Decimal(0),
                        publish=lambda values: None):
        await prometheus.wait_for_async(f'{SERIES}{{job="{exporter.job}"}}',
                                        lambda samples: len(samples) == 1, timeout=30)
        async with prometheus_adapter(fake_kube, tmp_path, prometheus_url=prometheus.url,
                                      rules=rules(exporter.job)):
            fake_kube.create(GROUP, VERSION, PLURAL, idle_autoscaler())
            async with controller(fake_kube, scale_to_zero=True):
                # Idle and inactive: the target stays at 0.
                await until(lambda: active(fake_kube)[:2] == ("False", "ScalerNotActive"),
                            within=20, what="the Active condition at 0")
                assert active(fake_kube)[2] == \
                    "no metric is above its activation threshold: idle at 0"
                assert inactive_since(fake_kube) is not None
                await holds(lambda: replicas_of(fake_kube, "web") == 0
                            and not scale_writes(fake_kube, "web"), fake=fake_kube,
                            target="web", for_seconds=1.5,
                            what="the target stays idle below the threshold")

                # Above the threshold: 25 messages, 3 pods.
                exporter.set(SERIES, queue, Decimal(25), type="gauge")
                await until(lambda: replicas_of(fake_kube, "web") == 3, within=20,
                            what="the scale-out of 0")
                await until(lambda: active(fake_kube)[:2] == ("True", "ScalerActive"),
                            within=5, what="the Active condition once active")
                assert active(fake_kube)[2] == "active: metric 0 (25 > 5)"
                assert inactive_since(fake_kube) is None

                # Inactive again: down to the active floor at once, to 0 after the cooldown.
                exporter.set(SERIES, queue, Decimal(0), type="gauge")
                await until(lambda: inactive_since(fake_kube) is not None, within=20,
                            what="the inactive clock")
                since = inactive_since(fake_kube)
                assert since is not None
                await until(lambda: replicas_of(fake_kube, "web") == 0, within=COOLDOWN + 10,
                            what="the cooldown back to 0")
                await until(lambda: len(rescales(fake_kube)) == 3, within=5,
                            what="the rescale event to 0")
                assert inactive_since(fake_kube) == since
                assert active(fake_kube)[:2] == ("False", "ScalerNotActive")

    assert [size for size, _ in rescales(fake_kube)] == [3, 1, 0]
    _, to_one = rescales(fake_kube)[1]
    _, to_zero = rescales(fake_kube)[2]
    # The active floor applies at once: in the reconcile that saw the metric go inactive (an
    # Event's time and inactiveSince are both that reconcile's `now`).
    assert to_one == since
    # To 0 not before the cooldown, and by the first reconcile that began after it: before
    # that, only the one under way when the cooldown ended may have read the scale.
    cooled = since + timedelta(seconds=COOLDOWN)
    assert to_zero >= cooled
    late = scale_reads(fake_kube, "web", since=cooled, before=to_zero)
    assert len(late) <= 1, late
