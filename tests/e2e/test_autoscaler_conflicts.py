"""Conflicting writers against the fake API server, the real adapter and a real Prometheus: a
Deployment's spec.replicas changed behind the controller's back raises an ExternalScaleChange
Event, a second change the ScalingConflict condition (accepted by the CRD); the controller's
own scale writes never count."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

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
    exporter_publisher,
    holds,
    install_crd,
    pods_metric,
    pods_rule,
    prometheus_adapter,
    replicas_of,
    scale_writes,
    status_of,
    until,
)

pytestmark = pytest.mark.prometheus

SERIES = "msconflict_rps"


def rules(job: str) -> str:
    return "rules:\n" + pods_rule(series_query=f'__name__="{SERIES}"',
                                  prefix="msconflict_", job=job)


def _reasons(fake: FakeKubeAPI) -> list[str]:
    return [e.get("reason", "") for e in events_of(fake, "web")]


def _set_replicas(fake: FakeKubeAPI, replicas: int) -> None:
    """What `kubectl apply` of a manifest with spec.replicas does."""
    def reset(obj: dict[str, Any]) -> None:
        obj["spec"]["replicas"] = replicas
    fake.store.mutate("apps", "v1", "deployments", "web", reset, namespace=NS)


async def test_external_replica_changes_raise_an_event_then_a_condition(
        fake_kube: FakeKubeAPI, tmp_path: Path, prometheus: PrometheusServer,
        exporter: Exporter) -> None:
    install_crd(fake_kube)
    async with Workload(fake_kube, "web", replicas=2, total=Decimal(40),
                        publish=exporter_publisher(exporter, SERIES)):
        await prometheus.wait_for_async(f'{SERIES}{{job="{exporter.job}"}}',
                                        lambda samples: len(samples) >= 2, timeout=30)
        async with prometheus_adapter(fake_kube, tmp_path, prometheus_url=prometheus.url,
                                      rules=rules(exporter.job)):
            fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                "web", target="web", metrics=[pods_metric("rps", "10")]))
            async with controller(fake_kube):
                # Our own write (2 -> 4), then several syncs: never an external change.
                await until(lambda: replicas_of(fake_kube, "web") == 4, within=15,
                            what="the controller scales web to 4")
                assert scale_writes(fake_kube, "web")
                await holds(lambda: "ExternalScaleChange" not in _reasons(fake_kube),
                            fake=fake_kube, target="web", for_seconds=1.0,
                            what="our own write counted as external")
                assert condition(fake_kube, "web", "ScalingConflict") is None

                _set_replicas(fake_kube, 7)
                await until(lambda: "ExternalScaleChange" in _reasons(fake_kube), within=10,
                            what=f"an ExternalScaleChange event, have {_reasons(fake_kube)}")
                note = next(e for e in events_of(fake_kube, "web")
                            if e.get("reason") == "ExternalScaleChange")
                assert note["type"] == "Warning"
                assert "from 4 to 7" in note["note"] and "did not write" in note["note"]
                assert condition(fake_kube, "web", "ScalingConflict") is None

                _set_replicas(fake_kube, 9)
                await until(lambda: condition(fake_kube, "web", "ScalingConflict") is not None,
                            within=10, what=f"the condition, have {status_of(fake_kube, 'web')}")
                found = condition(fake_kube, "web", "ScalingConflict")
                assert found is not None
                status, reason, message = found
                assert (status, reason) == ("True", "ExternalScaleChanges")
                assert "README" in message

    status_writes = [r for r in fake_kube.requests_to(
        f"^/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}/web/status$")
        if r.method in ("PUT", "PATCH")]
    assert all(r.code is not None and r.code < 300 for r in status_writes), [
        (r.code, r.message) for r in status_writes]
