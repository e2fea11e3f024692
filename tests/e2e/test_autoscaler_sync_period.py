"""KEP-6003's spec.behavior.syncPeriodSeconds against the fake API server, the real adapter and a
real Prometheus: an autoscaler with its own 1 s period is reconciled again and again while its
neighbour waits out the controller's 10 s period, and it scales when the load rises.

Counted in reconciles (reads of each target's scale), not in seconds: fast must be reconciled
four times before slow is a second time, however long a busy machine makes that take."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from testbed.fakes.exporter import Exporter
from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.prometheus import PrometheusServer
from tests.e2e.test_autoscaler_support import (
    GROUP,
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
    scale_reads,
    until,
)

pytestmark = pytest.mark.prometheus

FAST_SERIES = "mssync_rps_fast"
SLOW_SERIES = "mssync_rps_slow"


def rules(job: str) -> str:
    return "rules:\n" + pods_rule(series_query='__name__=~"mssync_rps_.*"',
                                  prefix="mssync_", job=job)


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
                # Both are reconciled once when they appear; then `fast` comes back on its own
                # 1 s period while `slow` waits out the controller's 10 s.
                await until(lambda: scale_reads(fake_kube, "fast")
                            and scale_reads(fake_kube, "slow"), within=10,
                            what="the first reconcile of both")
                first_slow = scale_reads(fake_kube, "slow")[0]
                await until(lambda: len(scale_reads(fake_kube, "fast", since=first_slow)) >= 4,
                            within=30, what="four reconciles of fast after slow's first")
                fast_reads = scale_reads(fake_kube, "fast", since=first_slow)[:4]
                assert scale_reads(fake_kube, "slow", before=fast_reads[-1]) == [first_slow]
                assert replicas_of(fake_kube, "fast") == 2
                # Load rises: the fast one follows (the exporter's new values reach the adapter
                # after a scrape), on its own period.
                fast.set_load(Decimal(60))
                await until(lambda: replicas_of(fake_kube, "fast") == 6, within=30,
                            what="fast scales to 6")
