"""KEP-6003's spec.behavior.syncPeriodSeconds against the fake API server, the real adapter and a
real Prometheus: an autoscaler with its own 1 s period is reconciled about every second while
its neighbour keeps the controller's 10 s period, and reacts to load within its own period."""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal
from pathlib import Path

import pytest

from tests.e2e.test_autoscaler_support import (
    GROUP,
    NS,
    PLURAL,
    VERSION,
    Workload,
    autoscaler,
    controller,
    exporter_publisher,
    install_crd,
    pods_metric,
    pods_rule,
    prometheus_adapter,
    replicas_of,
    until,
)
from tests.fakes.exporter import Exporter
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.prometheus import PrometheusServer

pytestmark = pytest.mark.prometheus

FAST_SERIES = "mssync_rps_fast"
SLOW_SERIES = "mssync_rps_slow"


def rules(job: str) -> str:
    return "rules:\n" + pods_rule(series_query='__name__=~"mssync_rps_.*"',
                                  prefix="mssync_", job=job)


def scale_reads(fake: FakeKubeAPI, deployment: str) -> int:
    return len(fake.requests_to(f"^/apis/apps/v1/namespaces/{NS}/deployments/{deployment}"
                                "/scale$", method="GET"))


async def test_an_autoscaler_with_its_own_sync_period_is_reconciled_by_it(
        fake_kube: FakeKubeAPI, tmp_path: Path, prometheus: PrometheusServer,
        exporter: Exporter) -> None:
    install_crd(fake_kube)
    async with Workload(fake_kube, "fast", replicas=2, total=Decimal(20),
                        publish=exporter_publisher(exporter, FAST_SERIES)) as fast, \
            Workload(fake_kube, "slow", replicas=2, total=Decimal(20),
                     publish=exporter_publisher(exporter, SLOW_SERIES)):
        for series in (FAST_SERIES, SLOW_SERIES):
            await prometheus.wait_for_async(f'{series}{{job="{exporter.job}"}}',
                                            lambda samples: len(samples) >= 2, timeout=30)
        async with prometheus_adapter(fake_kube, tmp_path, prometheus_url=prometheus.url,
                                      rules=rules(exporter.job)):
            fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                "fast", target="fast", metrics=[pods_metric("rps_fast", "10")],
                behavior={"syncPeriodSeconds": 1}))
            fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
                "slow", target="slow", metrics=[pods_metric("rps_slow", "10")]))
            async with controller(fake_kube, sync=10.0):
                # Both are reconciled once when they appear; then only `fast` comes back soon.
                await until(lambda: scale_reads(fake_kube, "fast") >= 1
                            and scale_reads(fake_kube, "slow") >= 1, within=10,
                            what="the first reconcile of both")
                fast_before, slow_before = scale_reads(fake_kube, "fast"), \
                    scale_reads(fake_kube, "slow")
                await asyncio.sleep(4.5)
                fast_reads = scale_reads(fake_kube, "fast") - fast_before
                slow_reads = scale_reads(fake_kube, "slow") - slow_before
                assert fast_reads >= 3, fast_reads
                assert slow_reads <= 1, slow_reads
                assert replicas_of(fake_kube, "fast") == 2
                # Load rises: the fast one follows within a few of its own periods (the
                # exporter's new values reach the adapter after a scrape, ~1 s).
                started = time.monotonic()
                fast.set_load(Decimal(60))
                await until(lambda: replicas_of(fake_kube, "fast") == 6, within=10,
                            what="fast scales to 6")
                assert time.monotonic() - started < 8
