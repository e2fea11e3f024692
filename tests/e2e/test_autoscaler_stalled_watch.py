"""A stalled Autoscaler watch: the controller restarts it, /readyz says so, and a spec change
still applies in bounded time."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import aiohttp

from autoscaler.decision.settings import Settings
from autoscaler.server import Options, serve_autoscaler
from metricscale.kube.retry import Backoff
from testbed.fakes.kube_api import FakeKubeAPI, StallWatch
from tests.e2e.test_autoscaler_support import (
    GROUP,
    NS,
    PLURAL,
    VERSION,
    Workload,
    autoscaler,
    election,
    install_crd,
    metrics_backend,
    pods_metric,
    replicas_of,
    until,
)

STALL = 2.0        # the informers' stall timeout (production: bookmark interval + 15 s)
LIST_READ = 2.0    # how long a stalled LIST is waited for
SYNC_PERIOD = timedelta(minutes=10)  # longer than any wait below: only an immediate sync acts


async def test_a_stalled_autoscaler_watch_restarts_reports_unready_and_applies_max_replicas(
        fake_kube: FakeKubeAPI, tmp_path: Path) -> None:
    """The re-watch and the re-list after it both stall, so the cache is stale for a while.

    The stalled re-watch is given up after STALL (2 s), the stalled LIST after LIST_READ (2 s),
    and the re-list's MODIFIED enqueues an immediate sync: the lowered maxReplicas applies in
    about 4 s (114 s before the fix). The sync period is 10 minutes, past the test's own time
    limits, so it cannot be what acts: no wall-clock bound is needed to tell the two apart
    (the stall detection itself is tested in tests/unit/test_informer_stall.py).
    """
    install_crd(fake_kube)
    options = Options(
        settings=Settings(sync_period=SYNC_PERIOD),
        leader_election=election(enabled=False), concurrent_syncs=2, identity="replica-a",
        lease_namespace="metricscale", reporting_instance="replica-a",
        metrics_bind_address="127.0.0.1:0",
        informer_options={"watch_timeout_seconds": 1, "stall_timeout": STALL,
                          "list_read_timeout": LIST_READ,
                          "backoff": Backoff(initial=0.1, cap=0.2)})
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal(40),
                     publish=backend.publisher("http_requests")):
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric("http_requests", "10")]))
        async with serve_autoscaler(fake_kube.api_client_configuration(None), options) as server, \
                aiohttp.ClientSession() as http:
            assert server.watching is not None
            informer = server.watching.autoscalers
            base = f"http://127.0.0.1:{server.port}"
            await until(lambda: replicas_of(fake_kube, "web") == 4, within=10,
                        what="a first scale-up")
            async with http.get(f"{base}/readyz") as response:
                assert response.status == 200

            stall = fake_kube.add_fault(f"^/apis/{GROUP}/{VERSION}/{PLURAL}$", StallWatch(),
                                        method="GET", times=2)
            await until(lambda: stall.hits == 1, within=30, what="the re-watch stalling")

            def lower(obj: dict[str, object]) -> None:
                obj["spec"]["maxReplicas"] = 2  # type: ignore[index]
            fake_kube.store.mutate(GROUP, VERSION, PLURAL, "web", lower, namespace=NS)

            stale_seen = False

            async def readyz_reports_stale() -> bool:
                nonlocal stale_seen
                async with http.get(f"{base}/readyz") as response:
                    body = await response.text()
                    if response.status == 503 and "[-]informer-autoscalers failed" in body:
                        stale_seen = True
                return stale_seen

            deadline = time.monotonic() + 60
            while not await readyz_reports_stale():
                assert time.monotonic() < deadline, "/readyz never reported the stale cache"
                await asyncio.sleep(0.05)
            await until(lambda: replicas_of(fake_kube, "web") == 2, within=60,
                        what="the lowered maxReplicas")
            assert informer.restarts.get("stalled") == 1
            await until(lambda: informer.stale_reason() is None, within=30, what="fresh again")
            async with http.get(f"{base}/readyz") as response:
                assert response.status == 200, await response.text()
            async with http.get(f"{base}/metrics") as response:
                text = await response.text()
    assert 'metricscale_cache_watch_restarts_total{cache="autoscalers",reason="stalled"} 1.0' \
        in text
    assert 'metricscale_cache_last_event_age_seconds{cache="autoscalers"}' in text
