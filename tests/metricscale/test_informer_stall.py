"""Stall detection of the informer: a watch that sends neither events nor bookmarks restarts.

Against the session's real kube-apiserver, through the fault proxy in front of it
(testbed.faultproxy): a real server cannot be made to stall a watch on demand, so the proxy
answers the chosen watch 200 with a watch's headers and then sends nothing. Objects live in the
test's `namespace` and the informers watch only it (other tests' objects come and go
meanwhile). Where the real server differs from the fake these tests were first written against,
the comment at the place says how."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from metricscale.kube.http import KubeHTTP
from metricscale.kube.informer import (
    BOOKMARK_INTERVAL_SECONDS,
    DEFAULT_STALL_TIMEOUT,
    Informer,
    InformerCollector,
    InformerEvent,
    PathSource,
    collection_path,
    project_raw,
)
from metricscale.kube.retry import Backoff
from testbed.controlplane import ControlPlane
from testbed.faultproxy import FaultProxy, StallWatch
from tests.autoscaler.test_kube_io import paused_deployment
from tests.cluster.support import until

FAST: dict[str, Any] = {"backoff": Backoff(initial=0.01, cap=0.02), "jitter": lambda: 0.0}
# The real server closes a quiet 1 s watch at its timeoutSeconds and sends bookmarks only about
# once a minute, so a stall timeout below the watch timeout (the fake's 0.8 s) would take
# quiet real watches for stalled too. 5 s outlasts a 1 s watch's clean end with room for a
# busy machine, and stays far below the 120 s inactivity timeout.
WATCH_SECONDS = 1
STALL = 5.0
# Guards against a hang on a busy machine, not measures.
WAIT = 60.0




def deployments(http: KubeHTTP, namespace: str) -> PathSource:
    return PathSource(http, collection_path(group="apps", version="v1", plural="deployments",
                                            namespace=namespace))


def test_the_default_stall_timeout_outlasts_the_apiservers_bookmark_interval() -> None:
    assert DEFAULT_STALL_TIMEOUT > BOOKMARK_INTERVAL_SECONDS


async def test_a_stalled_rewatch_is_restarted_and_the_change_arrives(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        proxied_kube_http: KubeHTTP) -> None:
    # Paused: the deployment controller makes no ReplicaSet and no pod of it.
    control_plane.apply(paused_deployment(namespace, "web", replicas=2))
    informer: Informer[Mapping[str, Any]] = Informer(
        deployments(proxied_kube_http, namespace), project=project_raw,
        watch_timeout_seconds=WATCH_SECONDS, stall_timeout=STALL, **FAST)
    changed = asyncio.Event()
    arrival: dict[str, Any] = {}

    def record(event: InformerEvent[Mapping[str, Any]]) -> None:
        # The real deployment controller writes the status too (its own MODIFIED events): the
        # change is the event whose new spec says 5.
        if event.kind == "MODIFIED" and (event.new or {}).get("spec", {}).get("replicas") == 5:
            arrival.update(at=datetime.now(UTC), restarts=dict(informer.restarts),
                           lists=informer.lists)
            changed.set()

    informer.subscribe(record)
    async with informer:
        assert await informer.wait_synced(WAIT)
        stall = fault_proxy.add_fault(
            rf"^/apis/apps/v1/namespaces/{namespace}/deployments\?(.*&)?watch=true",
            StallWatch(), method="GET", times=1)
        # Unlike the fake, the real server's running watch would deliver a change made now: the
        # change is made once that watch has ended (within its 1 s) and the re-watch that
        # replaces it is the stalled one, so only the stall's restart can bring it.
        await until(lambda: stall.hits == 1, what="the informer watched again", within=WAIT)
        await asyncio.to_thread(
            control_plane.request, "PATCH",
            f"/apis/apps/v1/namespaces/{namespace}/deployments/web", {"spec": {"replicas": 5}},
            content_type="application/merge-patch+json")
        await asyncio.wait_for(changed.wait(), WAIT)
        assert stall.hits == 1
    # It did wait out the stall: the proxy recorded the stalled watch on its arrival, before
    # the informer's silence timer started.
    [stalled] = [r for r in fault_proxy.requests_to(
        rf"^/apis/apps/v1/namespaces/{namespace}/deployments$", method="GET")
        if isinstance(r.fault, StallWatch)]
    assert (arrival["at"] - stalled.at).total_seconds() >= STALL
    # The change came with the re-list after the stall's restart, the only stall.
    assert arrival["restarts"].get("stalled") == 1
    assert arrival["lists"] == 2
    assert informer.restarts.get("stalled") == 1
    assert informer.get(namespace, "web")["spec"]["replicas"] == 5  # type: ignore[index]


async def test_a_cache_silent_past_the_stall_timeout_is_stale_until_it_hears_again(
        control_plane: ControlPlane, namespace: str, proxied_kube_http: KubeHTTP) -> None:
    control_plane.apply(paused_deployment(namespace, "web", replicas=2))
    now = [100.0]
    informer: Informer[Mapping[str, Any]] = Informer(
        deployments(proxied_kube_http, namespace), project=project_raw, stall_timeout=STALL,
        clock=lambda: now[0], **FAST)
    assert informer.stale_reason() is not None  # not synced yet
    assert informer.last_event_age() is None
    await informer.list_once()
    assert informer.stale_reason() is None
    now[0] += STALL + 0.1
    reason = informer.stale_reason()
    assert reason is not None and "no event or bookmark" in reason
    assert abs((informer.last_event_age() or 0.0) - (STALL + 0.1)) < 1e-9
    await informer.list_once()
    assert informer.stale_reason() is None


async def test_cache_series_show_age_sync_and_restarts_by_reason(
        control_plane: ControlPlane, namespace: str, proxied_kube_http: KubeHTTP) -> None:
    control_plane.apply(paused_deployment(namespace, "web", replicas=2))
    informer: Informer[Mapping[str, Any]] = Informer(
        deployments(proxied_kube_http, namespace), project=project_raw, name="deployments",
        watch_timeout_seconds=WATCH_SECONDS, stall_timeout=STALL, **FAST)
    registry = CollectorRegistry()
    registry.register(InformerCollector(lambda: [informer]))
    text = generate_latest(registry).decode()
    assert 'metricscale_cache_synced{cache="deployments"} 0.0' in text
    assert "metricscale_cache_last_event_age_seconds{" not in text
    await informer.list_once()
    # One 1 s watch that the real server closes at its timeoutSeconds (the stall timeout
    # outlasts it; the namespace is quiet, the paused deployment observed or not).
    await asyncio.wait_for(informer.step(), WAIT)
    text = generate_latest(registry).decode()
    assert 'metricscale_cache_synced{cache="deployments"} 1.0' in text
    assert 'metricscale_cache_last_event_age_seconds{cache="deployments"}' in text
    assert 'metricscale_cache_watch_restarts_total{cache="deployments",reason="closed"} 1.0' \
        in text
    assert 'metricscale_cache_stale{cache="deployments"} 0.0' in text
